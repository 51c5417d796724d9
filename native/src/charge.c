/*
 * Reserve, then allocate. A charge is one compare-and-swap on the slice's
 * per-device counter, checked against the limit in force at that instant, so
 * concurrent processes can never pass the cap together. The process's slot
 * records its share afterwards; a credit undoes both in the opposite order.
 * The slot's txn counter is nonzero while any thread of the process is
 * between the two steps, and its changes counter counts each one finished:
 * a process killed there leaves an over-count (never an under-count) that
 * the next sweep finds and removes (recount in slice.c).
 */
#include <stdio.h>
#include <time.h>

#include "hami.h"
#include "oom_words.h"

#define OOM_REPORT_INTERVAL_NS 1000000000ull

static uint64_t last_oom_report;

/* Whether an out-of-memory line may be logged now: once a second at most. */
static int oom_report_due(void)
{
	return hami_report_due(&last_oom_report, OOM_REPORT_INTERVAL_NS);
}

/*
 * Who set the cap, when that matters: a cap below what the slice holds was
 * lowered while the memory was in use; an administrator's cap says so. Empty
 * otherwise.
 */
static void cap_note(uint64_t used, uint64_t limit, char *out, size_t cap)
{
	struct hami_slice_file *f = hami_slice();
	const char *by = hami_limits_set_by_admin() ? " by an administrator" : "";
	char when[16] = "";
	uint64_t ns = f ? __atomic_load_n(&hami_limits_block(f)->changed_unix_ns, __ATOMIC_ACQUIRE) : 0;
	time_t t = (time_t)(ns / 1000000000ull);
	struct tm tm;
	if (ns && localtime_r(&t, &tm))
		strftime(when, sizeof(when), " at %H:%M", &tm);
	out[0] = 0;
	if (used > limit)
		snprintf(out, cap, " The cap was lowered%s%s, below what the slice already holds: new memory "
			 "is refused until its use falls under the cap.", by, when);
	else if (by[0])
		snprintf(out, cap, " An administrator set this cap%s.", when);
}

/*
 * what NULL: a quiet charge (a resume that waits for room is no error).
 * People read these lines: plain words first (what is full, who else holds
 * it, what to do, whom to ask: oom_words.c), then the technical line, sizes
 * in units only, the contexts' share saying why less than the cap fits as data.
 */
static void report_oom(int sdev, uint64_t want, uint64_t used, uint64_t limit, const char *what)
{
	if (!what || !oom_report_due())
		return;
	char gpu[HAMI_SLICE_UUID_LEN + 8], a[32], b[32], c[32], note[192];
	struct hami_oom_words words;
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	cap_note(used, limit, note, sizeof(note));
	hami_oom_words(sdev, &words);
	hami_human(want, a);
	hami_human(used, b);
	hami_human(limit, c);
	hami_log(HAMI_LOG_ERROR, "not enough GPU memory: this notebook's slice \"%s\" holds %s of its %s "
		 "cap on %s%s, and %s more do not fit.%s", hami_slice_name(), b, c, gpu, words.held, a, note);
	hami_oom_advice(&words);
	hami_log(HAMI_LOG_ERROR, "out of memory on %s: %s asked for %s; slice \"%s\" has %s of its %s cap "
		 "in use (CUDA contexts included).", gpu, what, a, hami_slice_name(), b, c);
}

/* A size that no counter holds: a garbage or wrapped request, refused whatever the cap. */
static void report_overflow(int sdev, uint64_t want, const char *what)
{
	if (!what || !oom_report_due())
		return;
	char gpu[HAMI_SLICE_UUID_LEN + 8];
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	hami_log(HAMI_LOG_ERROR, "out of memory on %s: %s asked for %llu bytes, more than any GPU holds "
		 "(slice \"%s\")", gpu, what, (unsigned long long)want, hami_slice_name());
}

/* A refusal by the process's own cap, inside the slice's. */
static void report_process_oom(int sdev, uint64_t want, uint64_t held, const char *what)
{
	if (!what || !oom_report_due())
		return;
	char gpu[HAMI_SLICE_UUID_LEN + 8], a[32], b[32], c[32];
	struct hami_oom_words words;
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	hami_oom_words(sdev, &words);
	words.free_more[0] = 0; /* the other kernels hold none of this process's own cap */
	hami_human(want, a);
	hami_human(held, b);
	hami_human(hami_process_limit(), c);
	hami_log(HAMI_LOG_ERROR, "not enough GPU memory: this kernel holds %s of its own %s cap on %s (its "
		 "kernelspec sets it, inside slice \"%s\"'s), and %s more do not fit.", b, c, gpu,
		 hami_slice_name(), a);
	hami_oom_advice(&words);
	hami_log(HAMI_LOG_ERROR,
		 "out of memory on %s: %s asked for %s; this process has %s of its own %s cap in use "
		 "(HAMI_PROCESS_MEMORY_LIMIT, from its kernelspec, inside slice \"%s\"'s cap).",
		 gpu, what, a, b, c, hami_slice_name());
}

uint64_t hami_device_limit_bytes(int sdev)
{
	struct hami_device_limit l;
	if (hami_slice_limit(sdev, &l) < 0)
		return 0;
	return l.memory_limit;
}

uint64_t hami_device_used(int sdev)
{
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < 0)
		return 0;
	return __atomic_load_n(&f->device[sdev].memory_used, __ATOMIC_ACQUIRE);
}

/* *v = max(*v, x) and *v = min(*v, x), atomically (relaxed: marks, not locks). */
static void atomic_raise(uint64_t *v, uint64_t x)
{
	uint64_t cur = __atomic_load_n(v, __ATOMIC_RELAXED);
	while (x > cur && !__atomic_compare_exchange_n(v, &cur, x, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static void atomic_lower(uint64_t *v, uint64_t x)
{
	uint64_t cur = __atomic_load_n(v, __ATOMIC_RELAXED);
	while (x < cur && !__atomic_compare_exchange_n(v, &cur, x, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static void raise_peak(struct hami_slice_device *d, uint64_t now_used)
{
	atomic_raise(&d->memory_peak, now_used);
}

/* This process's slot, or NULL when it has none (charges are then refused). */
static struct hami_slot *own_slot(struct hami_slice_file *f)
{
	int i = hami_slot();
	return i < 0 ? NULL : &f->slot[i];
}

/* The least and the most our slot has held on each device since the
 * true-up began to watch: a reading of the driver taken between two looks at
 * the slot may have seen an allocation that was freed again before the
 * second, or missed one freed and made again. Process-local. */
static uint64_t slot_low[HAMI_SLICE_MAX_DEVICES], slot_high[HAMI_SLICE_MAX_DEVICES];

static void watch_slot(int sdev, uint64_t now_held)
{
	atomic_lower(&slot_low[sdev], now_held);
	atomic_raise(&slot_high[sdev], now_held);
}

/* What our slot holds on sdev now (0 without a slot). */
static uint64_t slot_held(int sdev)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_slot *s = f ? own_slot(f) : NULL;
	return s ? __atomic_load_n(&s->memory_used[sdev], __ATOMIC_SEQ_CST) : 0;
}

void hami_slot_watch_start(int sdev)
{
	/* Emptied first, then what the slot holds now: a charge or credit in
	 * between is seen either way. */
	__atomic_store_n(&slot_low[sdev], UINT64_MAX, __ATOMIC_SEQ_CST);
	__atomic_store_n(&slot_high[sdev], 0, __ATOMIC_SEQ_CST);
	watch_slot(sdev, slot_held(sdev));
}

void hami_slot_watched(int sdev, uint64_t *low, uint64_t *high)
{
	watch_slot(sdev, slot_held(sdev)); /* the closing look */
	*low = __atomic_load_n(&slot_low[sdev], __ATOMIC_RELAXED);
	*high = __atomic_load_n(&slot_high[sdev], __ATOMIC_RELAXED);
}

/* txn counts this process's threads between the two steps of a charge or credit. */
static void txn_begin(struct hami_slot *s)
{
	__atomic_add_fetch(&s->txn, 1, __ATOMIC_SEQ_CST);
}

/* changes first: a recount that finds txn back at 0 must also find the count moved. */
static void txn_end(struct hami_slot *s)
{
	__atomic_add_fetch(&s->changes, 1, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&s->txn, 1, __ATOMIC_SEQ_CST);
}

/* A refused charge moved nothing: a recount running meanwhile need not start over. */
static void txn_cancel(struct hami_slot *s)
{
	__atomic_sub_fetch(&s->txn, 1, __ATOMIC_SEQ_CST);
}

/* v -= bytes, never below 0; returns the new value. */
static uint64_t sub_saturating(uint64_t *v, uint64_t bytes)
{
	uint64_t cur = __atomic_load_n(v, __ATOMIC_SEQ_CST);
	while (!__atomic_compare_exchange_n(v, &cur, cur > bytes ? cur - bytes : 0, 1, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST))
		;
	return cur > bytes ? cur - bytes : 0;
}

/* One charge: the device counter (checked against limit, 0 = none), then the slot. */
static int reserve(struct hami_slot *s, struct hami_slice_device *d, int sdev, uint64_t bytes,
		   uint64_t limit, uint64_t *seen)
{
	txn_begin(s);
	uint64_t used = __atomic_load_n(&d->memory_used, __ATOMIC_SEQ_CST);
	for (;;) {
		/* Past the limit, or past what the counter can hold at all (no limit). */
		if ((limit && (used > limit || bytes > limit - used)) || bytes >= UINT64_MAX - used) {
			*seen = used;
			txn_cancel(s);
			return -1;
		}
		if (__atomic_compare_exchange_n(&d->memory_used, &used, used + bytes, 1, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST))
			break;
	}
	watch_slot(sdev, __atomic_add_fetch(&s->memory_used[sdev], bytes, __ATOMIC_SEQ_CST));
	txn_end(s);
	raise_peak(d, used + bytes);
	return 0;
}

/* Charge bytes to the slice on slice device sdev, or refuse: CUDA_ERROR_OUT_OF_MEMORY. */
int hami_charge(int sdev, uint64_t bytes, const char *what)
{
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < 0 || bytes == 0)
		return CUDA_SUCCESS;
	struct hami_slot *s = own_slot(f);
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct hami_slice_device *d = &f->device[sdev];
	uint64_t limit = hami_device_limit_bytes(sdev), used = 0;
	if (bytes >= UINT64_MAX - __atomic_load_n(&d->memory_used, __ATOMIC_ACQUIRE)) {
		report_overflow(sdev, bytes, what);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (hami_process_take(sdev, bytes, &used) < 0) {
		report_process_oom(sdev, bytes, used, what);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (reserve(s, d, sdev, bytes, limit, &used) < 0) {
		/* Room held by a process that just died comes back before we say no. */
		hami_slice_sweep();
		if (reserve(s, d, sdev, bytes, limit, &used) < 0) {
			hami_process_give(sdev, bytes);
			report_oom(sdev, bytes, used, limit, what);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	return CUDA_SUCCESS;
}

/* Charge memory the driver has already handed out (e.g. pool growth). */
void hami_charge_force(int sdev, uint64_t bytes)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_slot *s = f && sdev >= 0 && bytes ? own_slot(f) : NULL;
	uint64_t unused;
	if (s) {
		hami_process_force(sdev, bytes);
		reserve(s, &f->device[sdev], sdev, bytes, 0, &unused);
	}
}

/* Subtract from the slice total only: for reclaiming a dead slot. */
void hami_credit_device(int sdev, uint64_t bytes)
{
	struct hami_slice_file *f = hami_slice();
	if (f && sdev >= 0 && bytes)
		sub_saturating(&f->device[sdev].memory_used, bytes);
}

void hami_credit(int sdev, uint64_t bytes)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_slot *s = f && sdev >= 0 && bytes ? own_slot(f) : NULL;
	if (!s)
		return;
	hami_process_give(sdev, bytes);
	txn_begin(s);
	watch_slot(sdev, sub_saturating(&s->memory_used[sdev], bytes));
	sub_saturating(&f->device[sdev].memory_used, bytes);
	txn_end(s);
}
