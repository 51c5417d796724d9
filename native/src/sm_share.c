/*
 * The SM share: a slice may keep the GPU busy for share % of the time.
 *
 * Throttling is ahead of time and needs no knowledge of kernel durations:
 * time is cut into 50 ms periods, and the slice may launch only during the
 * first f of each (its "open window"; every process computes it from the same
 * CLOCK_MONOTONIC, shifted by a per-slice phase so that slices do not all
 * open together). While a share binds, each launching thread keeps at most
 * two launches queued beyond the one running in each context (events), so a
 * closing window stops the slice's work within a kernel or two instead of a
 * deep queue. Those waits are bounded: see wait_limit_ns.
 *
 * f starts at the share and is corrected every 200 ms from what the GPU
 * really did: NVML's per-process utilization (exclusive GPU time, whatever
 * the kernels' sizes, and whether launched one by one, cooperatively or as a
 * graph). One process of the slice (whoever claims the new sample first)
 * updates f in the slice file: f += K * (target - measured). In elastic mode
 * the target rises into GPU time nobody uses, and falls back to the share
 * when the GPU is full.
 *
 * No share set: the launch hooks test one process-local flag and call the
 * driver (no syscall, lock or shared-memory write). docs/sm-share.md.
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"
#include "sm_work.h"

#define PERIOD_NS 50000000ull
#define FULL_PPM 1000000u
#define MIN_PPM 10000u       /* 1 %: a window never closes for good */
#define GAIN_PPM_PER_PCT 4000 /* K = 0.4 */
#define MAX_AHEAD 2
#define AHEAD_NS 1000000ull  /* GPU time a thread may keep queued beyond MAX_AHEAD, mid-window */
#define QUEUE_CONTEXTS 8     /* contexts a thread keeps a launch queue in at once */
#define WAIT_MIN_NS (4 * PERIOD_NS) /* the least a launch waits for the thread's oldest launch */
#define WAIT_KERNEL_CAP_NS 10000000000ull /* 10 s: longer kernel estimates lengthen no wait */
#define POLL_FIRST_NS 20000ull /* the first look again at a launch not finished */
#define POLL_MAX_NS 1000000ull /* the longest pause between two looks */
#define SPIN_MIN_NS 50000ull   /* the least a launch is looked at without a sleep past its foreseen end */
#define SLEEP_LATE_NS 100000ull /* what a sleep overshoots, until a thread has seen its own */
#define SLEEP_LATE_MIN_NS 10000ull
#define SLEEP_LATE_MAX_NS 1000000ull
#define ELASTIC_HEADROOM 2   /* percent left to others when taking idle time */
#define ELASTIC_CONTENDED 10 /* idle below this while others run: they want their time */
#define ELASTIC_BACKOFF 10   /* how fast a contended elastic slice steps back to its share */
#define NOT_BINDING_MARGIN 10 /* percent below the share that counts as not binding */
#define FREE_MARGIN 2        /* percent above its share a hard slice running free may stay free */
#define RESTART_HOLD_NS 300000000ull /* samples read this soon after a restart cover time before it */
#define SPIN_KERNELS_LATE 16 /* kernels this many sleep overshoots long are waited for asleep */
#define OVERLAP_SLACK 10     /* per-process figures adding up past the device's: not per process */
#define BLUR_SLACK 15        /* percent above the window a slice's own work cannot reach */
#define MAX_SAMPLES 128
#define BUSY_RECENT_US 1000000ull /* a slice process busy within this counts as busy */

typedef CUresult (*ctx_current_fn)(CUcontext *);
typedef CUresult (*ctx_id_fn)(CUcontext, unsigned long long *);
typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*event_fn)(CUevent);
typedef nvmlReturn_t (*proc_util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
				     unsigned long long);
typedef nvmlReturn_t (*dev_util_fn)(nvmlDevice_t, nvmlUtilization_t *);

int hami_sm_watch;             /* a share may apply in this process */
static uint64_t launches;      /* throttled launches, for the PID-namespace fallback */

/*
 * A launching thread's queue in one context: events recorded after its last
 * launches (events belong to a context). A thread keeps one per context it
 * launches in, so that going back and forth between GPUs neither loses the
 * bound nor makes new events at each switch.
 */
struct queue {
	CUcontext ctx;
	unsigned long long ctx_id; /* cuCtxGetId: a new context at a dead one's address is another */
	CUevent ev[MAX_AHEAD + 1];
	int head, count;
	int stuck;          /* the oldest outlived its wait: launches go on without it */
	uint64_t used_ns;   /* the last launch here: the least recently used queue makes room */
	uint64_t done_ns;   /* when the last awaited launch was seen to end; 0: the queue ran dry since */
	uint64_t end_ns;    /* when it ended, as far as the thread can tell (see await_oldest) */
	int ended;          /* launches found finished since (they end back to back) */
	uint64_t lone_ns;   /* when the queue's only launch was made (it found the queue empty) */
	uint64_t kernel_ns; /* how long one launch keeps the GPU, from back-to-back completions */
	uint64_t ahead_ns;  /* when what the thread queued should have run, a kernel time per launch */
};
static __thread struct queue queues[QUEUE_CONTEXTS];

/* The launch under way, when it is throttled: record after it. */
static __thread struct {
	struct queue *q; /* NULL: nothing to record */
	int per_thread;
	CUstream stream;
} gating;

/* ---- the gate, in the launch path ------------------------------------------ */

/* The slice device a launch goes to: the current context's GPU. */
static int launch_device(void)
{
	if (hami_ordinal_count() == 1)
		return hami_ordinal_device(0);
	return hami_current_device(NULL);
}

/* The window a share starts from: the share's time, less what the GPU's
 * boost at this load adds to each busy second's work (sm_work.c). */
static uint32_t start_ppm(int sdev, uint32_t share)
{
	uint32_t speedup = hami_sm_share_of_time() ? HAMI_SM_WORK_ONE : hami_sm_work_last(sdev);
	uint64_t ppm = (uint64_t)share * (FULL_PPM / 100) * HAMI_SM_WORK_ONE / speedup;
	return ppm > FULL_PPM ? FULL_PPM : ppm < MIN_PPM ? MIN_PPM : (uint32_t)ppm;
}

/* Start the open fraction afresh at PPM. NVML's samples read in the next
 * RESTART_HOLD_NS still cover time before this (a sample covers the 200 ms
 * before its stamp and reaches a reader within a tick): steered by them, the
 * controller took a change from 25 to 75 % for one that had not landed and
 * opened the window to 90 % and more (seen on an H200). */
static void restart_ppm(struct hami_slice_device *d, uint32_t ppm)
{
	__atomic_store_n(&d->sm_restart_ns, hami_monotonic_ns(), __ATOMIC_RELEASE);
	__atomic_store_n(&d->sm_open_ppm, ppm, __ATOMIC_RELEASE);
}

/* The open fraction in force; a new share restarts it from the share itself. */
static uint32_t open_ppm(int sdev, struct hami_slice_device *d, uint32_t share)
{
	uint32_t tuned = __atomic_load_n(&d->sm_tuned_for, __ATOMIC_ACQUIRE);
	uint32_t ppm = __atomic_load_n(&d->sm_open_ppm, __ATOMIC_ACQUIRE);
	if (tuned != share || ppm == 0) {
		ppm = start_ppm(sdev, share);
		if (__atomic_compare_exchange_n(&d->sm_tuned_for, &tuned, share, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			restart_ppm(d, ppm);
	}
	return ppm;
}

/*
 * A sleep ends late: by the thread's timer slack (50 us unless the program
 * changed it) and the time to be woken, 70 us on the two-core test host,
 * where short kernels run for 5 to 20 us. What this thread's sleeps
 * usually overshoot: an average over about eight, in which one sleep that
 * ended much later (the thread was not scheduled) counts as twice the
 * average, so that it does not make the thread spin for long.
 */
static __thread uint64_t sleep_late_ns = SLEEP_LATE_NS;

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
	uint64_t t0 = hami_monotonic_ns();
	nanosleep(&ts, NULL);
	uint64_t took = hami_monotonic_ns() - t0, late = took > ns ? took - ns : 0, was = sleep_late_ns;
	if (late > 2 * was)
		late = 2 * was;
	was = (7 * was + late) / 8;
	sleep_late_ns = was < SLEEP_LATE_MIN_NS ? SLEEP_LATE_MIN_NS : was > SLEEP_LATE_MAX_NS ? SLEEP_LATE_MAX_NS : was;
}

/*
 * How long a launch waits for the oldest launch of its queue. Never without
 * bound: a legal program may queue work behind work that only a later call
 * of this same thread releases (a kernel on stream A spinning on a flag that
 * a later kernel on stream B sets, a cuStreamWaitValue32 on A that a later
 * cuStreamWriteValue32 on B meets). Waiting only on the new launch's own
 * stream would not help: the launches behind such a wait are on that stream.
 * So the thread polls the oldest launch (cuEventQuery, see await_oldest) and
 * lets the launch through when the limit passes. The limit is long enough
 * for the queue ahead to run with the other slices' windows in between (four
 * periods, plus twice the queue's kernels), so a program whose work does
 * finish waits as before and the share holds.
 */
static uint64_t wait_limit_ns(const struct queue *q)
{
	uint64_t k = q->kernel_ns < WAIT_KERNEL_CAP_NS ? q->kernel_ns : WAIT_KERNEL_CAP_NS;
	return WAIT_MIN_NS + 2ull * (MAX_AHEAD + 1) * k;
}

static uint64_t clamp_ns(uint64_t v, uint64_t lo, uint64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/*
 * 1 when the oldest queued launch has finished, 0 when its wait ran out.
 * A full queue runs back to back, so with a kernel time known the oldest
 * should end a kernel after the last end seen. A thread that wakes late
 * costs nothing while the launches queued behind the oldest keep the GPU
 * busy: then it sleeps until just before that end and, the launch not done,
 * looks every eighth of a kernel. When they cannot cover a sleep's lateness
 * (short kernels: 5 to 20 us in a notebook's eager PyTorch loop, against 70
 * us or more that a sleep overshoots), every late wake-up is time the GPU
 * idles: sleeping so cost launch-bound loops half their pace on an H100
 * (issue 34). Then the thread sleeps only while more than a sleep's
 * lateness is left and looks again and again for the rest (cuEventQuery, no
 * sleep), as the driver's own blocking wait spins by default, until half a
 * kernel (at least SPIN_MIN_NS) past the end it foresaw (without one, a
 * kernel from now: the oldest runs already). A launch not done by then is
 * held by something else (other slices' work, a stream wait). Without a
 * kernel time the looks come after pauses doubling from 20 us to 1 ms.
 * Only short kernels are worth a spin (shorter than SPIN_KERNELS_LATE sleep
 * overshoots, about 1 ms): a late wake-up costs a longer one a small part of
 * its time, and spinning for it cost a whole core (a thread draining a queue
 * of one 20 ms kernel before a launch that would not fit its window looked
 * again and again for up to 1.5 kernels).
 * *END: when it ended as far as the thread can tell: the last look that saw
 * it run, or if the first look found it ended, the time it woke for; never
 * a late look, which would make every later sleep end later.
 */
static int await_oldest(const struct queue *q, event_fn query, uint64_t *end)
{
	CUevent e = q->ev[q->head];
	uint64_t start = hami_monotonic_ns(), limit = wait_limit_ns(q), k = q->kernel_ns;
	uint64_t pause = k ? clamp_ns(k / 8, POLL_FIRST_NS, POLL_MAX_NS) : POLL_FIRST_NS;
	uint64_t due = k && q->end_ns ? q->end_ns + (uint64_t)(q->ended + 1) * k : 0;
	int spin = (uint64_t)(q->count - 1) * k < 2 * sleep_late_ns && k < SPIN_KERNELS_LATE * sleep_late_ns;
	uint64_t early = k / 16 + (spin ? sleep_late_ns : 0), past = k / 2 > SPIN_MIN_NS ? k / 2 : SPIN_MIN_NS;
	uint64_t wake = due > start + early ? due - early : start, looked = start;
	uint64_t spin_until = !spin ? start : due ? due + past : start + k + past;
	*end = start;
	if (query(e) != CUDA_ERROR_NOT_READY)
		return 1;
	if (wake > start)
		sleep_ns(wake - start < limit ? wake - start : limit);
	for (int looks = 0;; looks++) {
		uint64_t now = hami_monotonic_ns();
		if (query(e) != CUDA_ERROR_NOT_READY) {
			*end = looks || wake == start ? looked : wake < now ? wake : now;
			return 1;
		}
		looked = now;
		if (now - start >= limit)
			return 0;
		if (now >= spin_until) {
			sleep_ns(pause);
			if (!k)
				pause = pause * 2 < POLL_MAX_NS ? pause * 2 : POLL_MAX_NS;
		}
	}
}

/* One more measure of a launch's time. Longer ones count less, and one
 * more than twice the estimate counts as twice: a launch that waited behind
 * other work (another slice's window), or a thread the host did not run for
 * a while, would otherwise make the kernel time too long to be corrected (a
 * queue thought too slow is drained before every launch, and never fills up
 * again to measure; a thread that thinks its 10 us kernels take a
 * millisecond sleeps through them). */
static void note_kernel(struct queue *q, uint64_t ns)
{
	uint64_t k = q->kernel_ns;
	if (k && ns > 2 * k)
		ns = 2 * k;
	q->kernel_ns = !k ? ns : ns < k ? (k + ns) / 2 : (7 * k + ns) / 8;
}

/* The oldest launch was seen to end now, having ended at END. MEASURE: it
 * was awaited with a full queue, so the time from the last end to this one
 * is the GPU's, shared by the launches that ended in it (found done at
 * later launches, q->ended) and this one: counted as one, very short
 * kernels seemed several times longer than they are. From the ends as far
 * as the thread can tell, never from when it looked: a thread that slept
 * past an end would measure its own sleep, and sleep longer the next time. */
static void note_end(struct queue *q, int measure, uint64_t end)
{
	uint64_t now = hami_monotonic_ns();
	if (measure && q->done_ns && q->end_ns && end > q->end_ns)
		note_kernel(q, (end - q->end_ns) / (uint64_t)(q->ended + 1));
	else if (q->lone_ns && q->count == 1 && end > q->lone_ns)
		note_kernel(q, end - q->lone_ns); /* the only launch, made on an empty queue */
	q->lone_ns = 0;
	q->done_ns = now;
	q->end_ns = end;
	q->ended = 0;
}

/* The queue ran dry, or the thread slept: the next gap is not the GPU's. */
static void forget_end(struct queue *q)
{
	q->done_ns = 0;
	q->end_ns = 0;
	q->ended = 0;
}

static void pop_oldest(struct queue *q)
{
	q->head = (q->head + 1) % (MAX_AHEAD + 1);
	q->count--;
	q->stuck = 0;
}

/* The oldest launch outlived its wait: until it finishes, launches go on
 * (the newest event follows them) and its time is no kernel's. */
static void mark_stuck(struct queue *q)
{
	q->stuck = 1;
	forget_end(q);
}

/*
 * Whether the thread may queue this launch without waiting for its oldest:
 * what it has queued, a kernel time per launch, stays within AHEAD_NS and
 * ends, with this launch, before its window closes (ROOM_NS from now). Short
 * kernels need it: a launch-bound loop's host runs ahead while a longer
 * kernel runs (a matmul among relus, a convolution among batch norms), and
 * held to two launches ahead it idled the GPU afterwards, even in a window
 * open all but fully: 83 to 89 % of the pace of an eager loop of 20 and 5 us
 * kernels, 72 to 92 % of a conv-net-like step's, on the simulated GPU,
 * which a share of 75 % could not make up for. What runs ahead ends well
 * inside the window, and a closing window still finds at most two launches
 * and AHEAD_NS of the thread's work queued.
 */
static int may_run_ahead(const struct queue *q, uint64_t room_ns)
{
	uint64_t k = q->kernel_ns, now = hami_monotonic_ns();
	uint64_t queued = q->ahead_ns > now ? q->ahead_ns - now : 0;
	return k && queued + k <= AHEAD_NS && queued + k <= room_ns;
}

/* Keep at most MAX_AHEAD of this thread's launches queued on the GPU, more
 * mid-window while they are short (may_run_ahead). While it waits with a
 * full queue, the GPU runs our launches back to back: the time between two
 * completions is how long one of them takes. */
static void bound_queue(struct queue *q, uint64_t room_ns)
{
	event_fn query = HAMI_REAL(event_fn, "cuEventQuery");
	while (q->count > 0 && query) {
		if (query(q->ev[q->head]) == CUDA_ERROR_NOT_READY) {
			uint64_t end;
			if (q->count < MAX_AHEAD || q->stuck)
				break;
			if (may_run_ahead(q, room_ns)) {
				/* Its event goes to the new launch; no end of it is seen. */
				pop_oldest(q);
				forget_end(q);
				return;
			}
			if (!await_oldest(q, query, &end)) {
				mark_stuck(q);
				return;
			}
			note_end(q, 1, end);
		} else if (q->count == 1) {
			/* Ran dry. A launch made on an empty queue and found done
			 * took at most the time since: where no back-to-back ends
			 * tell a kernel time (a loop the host paces empties its
			 * queue between them), a short one bounds it, for
			 * may_run_ahead; a bound never lengthens a known time. */
			uint64_t took = q->lone_ns ? hami_monotonic_ns() - q->lone_ns : 0;
			if (took && took <= AHEAD_NS && (!q->kernel_ns || took < q->kernel_ns))
				note_kernel(q, took);
			forget_end(q);
		} else if (q->end_ns) {
			q->ended++;
		}
		pop_oldest(q);
		/* Everything before it has run too: what is left is the rest. */
		uint64_t left = hami_monotonic_ns() + (uint64_t)q->count * q->kernel_ns;
		if (q->ahead_ns > left)
			q->ahead_ns = left;
	}
}

/* Wait until every launch of this thread queued in Q has finished: 1, or 0
 * when one outlived its wait (see wait_limit_ns). */
static int drain_queue(struct queue *q)
{
	event_fn query = HAMI_REAL(event_fn, "cuEventQuery");
	while (q->count > 0 && query) {
		uint64_t end = hami_monotonic_ns();
		if (q->stuck ? query(q->ev[q->head]) == CUDA_ERROR_NOT_READY : !await_oldest(q, query, &end)) {
			mark_stuck(q);
			return 0;
		}
		note_end(q, 0, end);
		pop_oldest(q);
	}
	forget_end(q);
	return 1;
}

/* cuCtxGetId (CUDA 12.0), looked up once: older drivers have none. */
static ctx_id_fn ctx_id_lookup(void)
{
	static ctx_id_fn fn;
	static int looked;
	if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&fn, HAMI_REAL(ctx_id_fn, "cuCtxGetId"), __ATOMIC_RELAXED);
		__atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&fn, __ATOMIC_RELAXED);
}

/*
 * Q makes room for another context. Its events are destroyed only when its
 * context is known to be the same live one (cuCtxGetId gives the same id): a
 * destroyed context took its events with it, and a handle of a dead context
 * is not passed to the driver. Without cuCtxGetId they are left.
 */
static void retire_queue(struct queue *q, ctx_id_fn get_id)
{
	event_fn destroy = HAMI_REAL(event_fn, "cuEventDestroy_v2");
	unsigned long long id = 0;
	if (q->ctx && get_id && destroy && get_id(q->ctx, &id) == CUDA_SUCCESS && id == q->ctx_id)
		for (int i = 0; i <= MAX_AHEAD; i++)
			destroy(q->ev[i]);
	memset(q, 0, sizeof(*q));
}

/* The calling thread's queue in the current context, made at its first
 * launch there (three events); NULL when there is none to be had. */
static struct queue *queue_ready(void)
{
	ctx_current_fn current = HAMI_REAL(ctx_current_fn, "cuCtxGetCurrent");
	event_create_fn create = HAMI_REAL(event_create_fn, "cuEventCreate");
	event_fn destroy = HAMI_REAL(event_fn, "cuEventDestroy_v2");
	ctx_id_fn get_id = ctx_id_lookup();
	CUcontext ctx = NULL;
	unsigned long long id = 0;
	if (!current || !create || !destroy || current(&ctx) != CUDA_SUCCESS || !ctx)
		return NULL;
	int known = get_id && get_id(NULL, &id) == CUDA_SUCCESS;
	struct queue *q = NULL, *oldest = &queues[0];
	for (int i = 0; i < QUEUE_CONTEXTS && !q; i++) {
		if (queues[i].ctx == ctx)
			q = &queues[i];
		else if (queues[i].used_ns < oldest->used_ns)
			oldest = &queues[i];
	}
	if (q && known && q->ctx_id != id)
		memset(q, 0, sizeof(*q)); /* that context is gone, and its events with it */
	else if (!q)
		retire_queue(q = oldest, get_id);
	if (!q->ctx) {
		for (int i = 0; i <= MAX_AHEAD; i++) {
			if (create(&q->ev[i], 2 /* CU_EVENT_DISABLE_TIMING */) != CUDA_SUCCESS) {
				while (i-- > 0)
					destroy(q->ev[i]);
				memset(q, 0, sizeof(*q));
				return NULL;
			}
		}
		q->ctx = ctx;
		q->ctx_id = known ? id : 0;
	}
	q->used_ns = hami_monotonic_ns();
	return q;
}

/* Nanoseconds left in the slice's open window (PPM of each period, placed
 * by the GPU schedule after the other slices'); 0 while it is closed. */
static uint64_t window_room_ns(int sdev, uint32_t ppm)
{
	uint64_t start = PERIOD_NS / FULL_PPM * hami_schedule_offset_ppm(sdev);
	uint64_t phase = (hami_monotonic_ns() + PERIOD_NS - start) % PERIOD_NS;
	uint64_t open = PERIOD_NS / FULL_PPM * ppm;
	return phase < open ? open - phase : 0;
}

/*
 * Sleep until the slice's window is open. 1 if it had to wait. With other
 * slices on the GPU, a launch that would still be running (behind those
 * queued) when the window closes first waits for what is queued: work
 * spilling into another slice's window makes the GPU switch between the two
 * for as long, which costs the smaller slice a larger part of its share.
 * With nothing of ours queued, a launch goes anywhere in the window, however
 * long it runs.
 */
static int wait_for_window(int sdev, struct hami_slice_device *d, uint32_t ppm, struct queue *q)
{
	/* Where the GPU schedule put our window, after the other slices' windows. */
	uint64_t start = PERIOD_NS / FULL_PPM * hami_schedule_offset_ppm(sdev);
	int fit = q && q->kernel_ns && hami_schedule_neighbours(sdev) > 0;
	for (int rounds = 0;; rounds++) {
		uint64_t phase = (hami_monotonic_ns() + PERIOD_NS - start) % PERIOD_NS;
		uint64_t open = PERIOD_NS / FULL_PPM * ppm;
		if (fit && q->count > 0 && phase < open && phase + (uint64_t)(q->count + 1) * q->kernel_ns > open) {
			if (!drain_queue(q))
				fit = 0; /* stuck: this launch goes in the window as it is */
			continue;
		}
		if (phase < open || rounds == 100)
			return rounds > 0;
		sleep_ns(PERIOD_NS - phase);
		if (q)
			forget_end(q); /* the wait is not the GPU's time */
		ppm = __atomic_load_n(&d->sm_open_ppm, __ATOMIC_ACQUIRE);
		if (!ppm || ppm >= FULL_PPM)
			return 1;
	}
}

/* Before a launch on stream (per_thread: a _ptsz entry point). May block this thread. */
void hami_sm_before_launch(CUstream stream, int per_thread)
{
	gating.q = NULL;
	struct hami_slice_file *f = hami_slice();
	int sdev = f ? launch_device() : -1;
	struct hami_device_limit l;
	if (sdev < 0 || hami_slice_limit(sdev, &l) < 0 || l.sm_share == 0 || l.sm_share >= 100)
		return;
	__atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
	struct hami_slice_device *d = &f->device[sdev];
	uint32_t ppm = open_ppm(sdev, d, l.sm_share);
	if (ppm >= FULL_PPM || hami_stream_capturing(stream, per_thread))
		return; /* not binding, or not real work yet (graph capture) */
	struct queue *q = queue_ready();
	if (q)
		bound_queue(q, window_room_ns(sdev, ppm));
	if (wait_for_window(sdev, d, ppm, q))
		__atomic_add_fetch(&d->sm_waits, 1, __ATOMIC_RELAXED);
	gating.q = q;
	gating.per_thread = per_thread;
	gating.stream = stream;
}

/*
 * NVDEC work passes the slice's gate too: a decode submission waits for the
 * slice's window like a launch (docs/nvdec.md). It is not on a CUDA stream,
 * so it joins no launch queue.
 */
void hami_sm_gate_decode(void)
{
	struct hami_slice_file *f = hami_slice();
	int sdev = f ? launch_device() : -1;
	struct hami_device_limit l;
	if (sdev < 0 || hami_slice_limit(sdev, &l) < 0 || l.sm_share == 0 || l.sm_share >= 100)
		return;
	struct hami_slice_device *d = &f->device[sdev];
	uint32_t ppm = open_ppm(sdev, d, l.sm_share);
	if (ppm < FULL_PPM && wait_for_window(sdev, d, ppm, NULL))
		__atomic_add_fetch(&d->sm_waits, 1, __ATOMIC_RELAXED);
}

void hami_sm_after_launch(CUresult rc)
{
	struct queue *q = gating.q;
	if (!q)
		return;
	gating.q = NULL;
	event_record_fn record = gating.per_thread ? HAMI_REAL(event_record_fn, "cuEventRecord_ptsz")
						   : HAMI_REAL(event_record_fn, "cuEventRecord");
	if (rc != CUDA_SUCCESS || !record)
		return;
	if (q->count > MAX_AHEAD) {
		/* Full behind a stuck launch: the newest event moves to this one, so
		 * that once the stuck one is done the thread waits for all it let by. */
		record(q->ev[(q->head + q->count - 1) % (MAX_AHEAD + 1)], gating.stream);
		return;
	}
	int slot = (q->head + q->count) % (MAX_AHEAD + 1);
	if (record(q->ev[slot], gating.stream) == CUDA_SUCCESS) {
		uint64_t now = hami_monotonic_ns();
		q->lone_ns = q->count++ ? 0 : now;
		q->ahead_ns = (q->ahead_ns > now ? q->ahead_ns : now) + q->kernel_ns;
	}
}

/* ---- the controller, in the housekeeping thread ----------------------------- */

struct sample_view {
	unsigned long long newest; /* microseconds */
	uint32_t slice, others, mine;
	int matched;
	int blurred; /* per-process figures are the device's: no split between slices */
	int strangers; /* processes outside the slice had work on the GPU in the last second */
};

/* When each of the slice's processes last had work in an NVML sample, per GPU
 * (housekeeper only). NVML's per-process samples do not all come in one read:
 * a process absent from one read is not idle. */
static struct {
	unsigned int pid;
	unsigned long long us;
} busy_seen[HAMI_SLICE_MAX_DEVICES][HAMI_SLICE_MAX_SLOTS];

static unsigned long long strangers_us[HAMI_SLICE_MAX_DEVICES]; /* a process outside the slice, busy */

static void note_busy(int sdev, unsigned int pid, unsigned long long us)
{
	int oldest = 0;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		if (busy_seen[sdev][i].pid == pid) {
			if (us > busy_seen[sdev][i].us)
				busy_seen[sdev][i].us = us;
			return;
		}
		if (busy_seen[sdev][i].us < busy_seen[sdev][oldest].us)
			oldest = i;
	}
	busy_seen[sdev][oldest].pid = pid;
	busy_seen[sdev][oldest].us = us;
}

static int slot_pid(struct hami_slice_file *f, unsigned int pid)
{
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++)
		if (__atomic_load_n(&f->slot[i].state, __ATOMIC_ACQUIRE) == HAMI_SLOT_LIVE &&
		    (unsigned int)f->slot[i].pid == pid)
			return 1;
	return 0;
}

/*
 * New NVML samples since `since`, split into this slice, the others, and us.
 * Some drivers (seen on an H200, driver 580, in a VM) give every process with
 * work on the GPU the whole GPU's utilization instead of its own: the
 * processes' figures then add up to more than the device's. In that case the
 * per-process split means nothing, and the slice is charged the device's
 * figure (the most its processes report), which over-counts when other slices
 * run too (they are throttled harder than needed) but never under-counts.
 * 0: no new sample.
 */
static int read_samples(struct hami_slice_file *f, int sdev, nvmlDevice_t dev, unsigned long long since,
			struct sample_view *v)
{
	proc_util_fn fn = HAMI_REAL(proc_util_fn, "nvmlDeviceGetProcessUtilization");
	dev_util_fn device = HAMI_REAL(dev_util_fn, "nvmlDeviceGetUtilizationRates");
	nvmlProcessUtilizationSample_t s[MAX_SAMPLES];
	unsigned int n = MAX_SAMPLES;
	if (!fn || fn(dev, s, &n, since) != NVML_SUCCESS || n == 0)
		return 0;
	memset(v, 0, sizeof(*v));
	uint32_t total = 0, slice_max = 0, others_max = 0;
	/* Several samples of one process may come back: use each process's newest. */
	for (unsigned int i = 0; i < n; i++) {
		int newest = 1;
		for (unsigned int j = 0; j < n; j++)
			if (j != i && s[j].pid == s[i].pid &&
			    (s[j].timeStamp > s[i].timeStamp || (s[j].timeStamp == s[i].timeStamp && j < i)))
				newest = 0;
		if (!newest || s[i].timeStamp <= since)
			continue;
		if (s[i].timeStamp > v->newest)
			v->newest = s[i].timeStamp;
		uint32_t u = s[i].smUtil > 100 ? 100 : s[i].smUtil;
		total += u;
		if (slot_pid(f, s[i].pid)) {
			if (u > 0)
				note_busy(sdev, s[i].pid, s[i].timeStamp);
			v->slice += u;
			slice_max = u > slice_max ? u : slice_max;
			v->matched = 1;
		} else {
			v->others += u;
			others_max = u > others_max ? u : others_max;
			if (u > 0 && s[i].timeStamp > strangers_us[sdev])
				strangers_us[sdev] = s[i].timeStamp;
		}
		if (s[i].pid == (unsigned int)getpid())
			v->mine = u;
	}
	v->strangers = strangers_us[sdev] && strangers_us[sdev] + BUSY_RECENT_US > v->newest;
	nvmlUtilization_t whole;
	if (device && device(dev, &whole) == NVML_SUCCESS && total > whole.gpu + OVERLAP_SLACK) {
		v->blurred = 1;
		v->slice = slice_max;
		v->others = others_max > slice_max ? others_max - slice_max : 0;
	}
	if (v->slice > 100)
		v->slice = 100;
	if (v->others > 100 - v->slice)
		v->others = 100 - v->slice;
	return v->newest > since;
}

/*
 * f += K (target - used), with guards: f only opens further while the
 * slice's launches are being held back (it wants more than it gets); a slice
 * well below its share for lack of work is "not binding" (f = 100 %: the
 * launch path skips the gate), and the first sample that shows it above its
 * share again restarts f from the share, so a burst is held within 200 ms.
 * A hard slice that ran free near its share (PREV, the sample before, was
 * not well below it) is a loop that keeps the GPU busy about its share by
 * itself, as launch-bound loops do at a high share: it stays free within
 * FREE_MARGIN of its share, and beyond gives back only its excess (f =
 * target / used). Restarted from the share, such a loop lost a quarter of
 * its pace for the second f took to open again, and then ran free again
 * (an H200 at 75 %: 84 % of its pace where 98 % was due, its 1-s windows
 * between 72.7 and 97.4 %).
 */
static void steer(int sdev, struct hami_slice_device *d, const struct hami_device_limit *l, uint32_t used,
		  uint32_t prev, uint32_t others, uint32_t speedup)
{
	if (l->sm_share == 0 || l->sm_share >= 100)
		return;
	int target = (int)l->sm_share;
	uint32_t ppm = open_ppm(sdev, d, l->sm_share);
	uint32_t waits = __atomic_load_n(&d->sm_waits, __ATOMIC_RELAXED);
	int held = waits != __atomic_exchange_n(&d->sm_waits_steered, waits, __ATOMIC_RELAXED);
	if (l->mode == HAMI_MODE_HARD && !hami_sm_share_of_time()) {
		/* A hard share is a share of the work: a busy percent counts as
		 * what the GPU gets done in it against a busy percent at full load
		 * (sm_work.c). */
		uint64_t work = ((uint64_t)used * speedup + HAMI_SM_WORK_ONE / 2) / HAMI_SM_WORK_ONE;
		used = work > 100 ? 100 : (uint32_t)work;
	}
	if (l->mode == HAMI_MODE_ELASTIC) {
		/* Grow into time nobody uses, give it back as soon as nobody leaves
		 * any: then every slice drifts back to its share. */
		int idle = 100 - (int)used - (int)others;
		int contended = idle < ELASTIC_CONTENDED && (int)others > ELASTIC_HEADROOM;
		int fill = contended ? (int)used - ELASTIC_BACKOFF : (int)used + idle - ELASTIC_HEADROOM;
		if (fill > target)
			target = fill;
	}
	if (ppm >= FULL_PPM && (int)used > target) {
		/* Leaving the not-binding state. An elastic slice alone fills
		 * the GPU to more than its target (the idle time less its
		 * headroom): it too stays free within the margin. */
		int hard = l->mode == HAMI_MODE_HARD, near = (int)prev + NOT_BINDING_MARGIN >= target;
		if ((near || !hard) && (int)used <= target + FREE_MARGIN)
			return;
		uint32_t next = start_ppm(sdev, l->sm_share);
		if (hard && near)
			next = (uint32_t)((uint64_t)FULL_PPM * (uint64_t)target / used);
		restart_ppm(d, next < MIN_PPM ? MIN_PPM : next);
		return;
	}
	if ((int)used + NOT_BINDING_MARGIN < target && !held) {
		/* Well below the share and never held back: the share does not
		 * bind, and the launch path can skip the gate altogether. */
		__atomic_store_n(&d->sm_open_ppm, FULL_PPM, __ATOMIC_RELEASE);
		return;
	}
	if ((int)used < target && !held)
		return;
	long next = (long)ppm + (long)GAIN_PPM_PER_PCT * (target - (int)used);
	if (next < (long)MIN_PPM)
		next = MIN_PPM;
	if (next > (long)FULL_PPM)
		next = FULL_PPM;
	__atomic_store_n(&d->sm_open_ppm, (uint32_t)next, __ATOMIC_RELEASE);
}

/* Processes of the slice that NVML saw busy on sdev within the last second. */
static int busy_processes(struct hami_slice_file *f, int sdev, unsigned long long now_us)
{
	int n = 0;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++)
		if (busy_seen[sdev][i].pid && busy_seen[sdev][i].us + BUSY_RECENT_US > now_us &&
		    slot_pid(f, busy_seen[sdev][i].pid))
			n++;
	return n;
}

/* Every housekeeping tick: publish utilization, steer the open fraction. */
void hami_sm_tick(void)
{
	static uint64_t launches_seen, ticks;
	static unsigned long long seen_us[HAMI_SLICE_MAX_DEVICES];
	struct hami_slice_file *f = hami_slice();
	int slot = hami_slot();
	if (!f || slot < 0)
		return;
	/* A share set or lifted while we run: the launch hooks know within a tick. */
	hami_sm_refresh();
	/* NVML makes a new sample every 200 ms; without a share to steer, one
	 * look per sample is enough to publish utilization. */
	if (!__atomic_load_n(&hami_sm_watch, __ATOMIC_RELAXED) && ticks++ % 4 != 0)
		return;
	uint64_t launched = __atomic_load_n(&launches, __ATOMIC_RELAXED);
	for (int o = 0; o < hami_ordinal_count(); o++) {
		int sdev = hami_ordinal_device(o);
		struct hami_device_limit l;
		if (sdev < 0 || hami_slice_limit(sdev, &l) < 0)
			continue;
		struct hami_slice_device *d = &f->device[sdev];
		nvmlDevice_t dev = hami_nvml_device(sdev);
		struct sample_view v;
		if (!dev || !read_samples(f, sdev, dev, seen_us[sdev], &v))
			continue;
		seen_us[sdev] = v.newest;
		__atomic_store_n(&f->slot[slot].sm_util[sdev], v.mine, __ATOMIC_RELAXED);
		if (!v.matched && launched != launches_seen) {
			/* NVML shows other PIDs than ours (a container's PID namespace):
			 * count the whole GPU as ours. Never lets the slice run unlimited. */
			dev_util_fn util = HAMI_REAL(dev_util_fn, "nvmlDeviceGetUtilizationRates");
			nvmlUtilization_t u;
			if (util && util(dev, &u) == NVML_SUCCESS) {
				v.slice = u.gpu > 100 ? 100 : u.gpu;
				v.others = 0;
			}
		}
		/* Every process follows the GPU's power, so that any of them can
		 * start a new share from the right window. */
		uint32_t busy = v.slice + v.others > 100 ? 100 : v.slice + v.others;
		uint32_t speedup = hami_sm_work_update(sdev, dev, busy);
		/* Several processes of the slice time-share the GPU in its windows,
		 * and a busy second of theirs does less than one process's: measured
		 * on an H100, four matmul processes at a 50 % time share did 50.7 %
		 * of one process's full-load work, the boost and the sharing
		 * cancelling. The speed-up is taken for one busy process only. */
		if (busy_processes(f, sdev, v.newest) > 1)
			speedup = HAMI_SM_WORK_ONE;
		/* One process of the slice steers per sample: whoever claims it first. */
		unsigned long long claimed = __atomic_load_n(&d->sm_sample_us, __ATOMIC_ACQUIRE);
		if (v.newest <= claimed ||
		    !__atomic_compare_exchange_n(&d->sm_sample_us, &claimed, v.newest, 0, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE))
			continue;
		uint32_t prev = __atomic_exchange_n(&d->sm_util, v.slice, __ATOMIC_RELAXED);
		__atomic_store_n(&d->sm_others_util, v.others, __ATOMIC_RELAXED);
		uint32_t window = open_ppm(sdev, d, l.sm_share) / (FULL_PPM / 100);
		if (l.sm_share > 0 && l.sm_share < 100 && window < 100 && v.slice > window + BLUR_SLACK &&
		    hami_schedule_neighbours(sdev) > 0) {
			/* More than our windows let through while other slices run: the
			 * figures are not ours alone (seen: a sandboxed NVML that shows
			 * only our PID, with the whole GPU's figure). */
			v.blurred = v.strangers = 1;
		}
		if (!v.strangers && hami_schedule_busy_neighbours(sdev) > 0) {
			/* Another slice launches, yet NVML has shown none of its
			 * processes busy for a second: it shows only some processes
			 * (seen on an H100: one process of two busy slices, with the
			 * device's figure). Our figure may be theirs too. */
			v.blurred = v.strangers = 1;
		}
		if (v.blurred && v.strangers) {
			/* Other slices run, and NVML cannot tell their time from ours:
			 * feedback would starve us. Hold the window at the share. */
			if (l.sm_share > 0 && l.sm_share < 100)
				__atomic_store_n(&d->sm_open_ppm, l.sm_share * (FULL_PPM / 100), __ATOMIC_RELEASE);
			continue;
		}
		uint64_t restarted = __atomic_load_n(&d->sm_restart_ns, __ATOMIC_ACQUIRE);
		if (hami_monotonic_ns() < restarted + RESTART_HOLD_NS)
			continue; /* the sample covers time before the restart (restart_ppm) */
		steer(sdev, d, &l, v.slice, prev, v.others, speedup);
	}
	/* Our windows' place among the other slices' on each GPU. */
	for (int o = 0; o < hami_ordinal_count(); o++) {
		int sdev = hami_ordinal_device(o);
		struct hami_device_limit l;
		if (sdev < 0 || hami_slice_limit(sdev, &l) < 0)
			continue;
		if (l.sm_share > 0 && l.sm_share < 100) {
			/* A slice that does not bind claims only its share of the period. */
			uint32_t ppm = open_ppm(sdev, &f->device[sdev], l.sm_share);
			hami_schedule_tick(sdev, ppm < FULL_PPM ? ppm : l.sm_share * (FULL_PPM / 100),
					   launched != launches_seen);
		} else
			hami_schedule_leave(sdev);
	}
	launches_seen = launched;
}

/* At set-up: does any share apply here? (Later the housekeeper keeps it true.) */
void hami_sm_refresh(void)
{
	int watch = 0;
	for (int o = 0; o < hami_ordinal_count(); o++) {
		struct hami_device_limit l;
		int sdev = hami_ordinal_device(o);
		if (sdev >= 0 && hami_slice_limit(sdev, &l) == 0 && l.sm_share > 0 && l.sm_share < 100)
			watch = 1;
	}
	__atomic_store_n(&hami_sm_watch, watch, __ATOMIC_RELAXED);
}
