/*
 * The fast park, this process's side (docs/parking.md): the memory the
 * library backed (vm_backing.c) goes to host memory and comes back at the
 * same addresses, moved by the process itself at the host link's speed,
 * instead of by the driver's checkpoint. The parking thread runs it (park.c)
 * while every other thread of the process waits at the parking gate.
 *
 * Park: every thread out of the driver, the GPU work of each context done;
 * then each block's bytes are copied to host memory (all of them first:
 * nothing is released before every copy is made), then each block is
 * unmapped and its physical memory released. Its address range stays
 * reserved: the program's pointers keep their meaning. Resume: new physical
 * memory mapped at each range, access set, bytes copied back; the host copies
 * go only when every block is back. A step that fails half-way leaves
 * nothing lost: a block is either on the GPU or in host memory, never
 * neither.
 *
 * Copies go through a few pinned host buffers (STAGES of STAGE_BYTES), never
 * the whole working set pinned: the device fills one while CPU threads drain
 * the other into the block's host copy (and the reverse on resume).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

#define STAGE_BYTES (64ull << 20)
#define STAGES 2
#define MAX_COPIERS 4              /* CPU threads that drain a staging buffer together */
#define PARALLEL_MIN (4ull << 20)  /* below this one thread copies */
#define WAIT_NS (1000000L)         /* threads still inside the driver: looked at this often */
#define CU_EVENT_DISABLE_TIMING 0x2

typedef CUresult (*set_ctx_fn)(CUcontext);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*host_alloc_fn)(void **, size_t, unsigned int);
typedef CUresult (*host_free_fn)(void *);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned int);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*event_fn)(CUevent);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*mem_info_fn)(size_t *, size_t *);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t, CUstream);

/* ---- CPU threads that copy between a staging buffer and host copies -------- */

static struct {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	char *dst;
	const char *src;
	size_t len;
	uint8_t *zero;
	unsigned gen, pending, n;
	int quit;
	pthread_t t[MAX_COPIERS];
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER };

static int all_zero(const char *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Part i of n of the job, on ZERO_RUN boundaries. Into a host copy (zero:
 * its map of runs, one byte each, NULL the other way): a host copy is fresh
 * anonymous memory, zeros until written, so a run of zeros is not written
 * into it but marked, and memory never used on the GPU takes no host memory;
 * a resume sets such a chunk on the device instead of copying it. */
#define ZERO_RUN (64u << 10)

static void copy_part(unsigned i, unsigned n, char *dst, const char *src, size_t len, uint8_t *zero)
{
	size_t per = (len / n + ZERO_RUN - 1) / ZERO_RUN * ZERO_RUN;
	size_t at = (size_t)i * per, end = at + per < len ? at + per : len;
	if (at >= end)
		return;
	if (!zero) {
		memcpy(dst + at, src + at, end - at);
		return;
	}
	size_t run = at; /* start of the data not written yet */
	for (; at < end; at += ZERO_RUN) {
		size_t k = end - at < ZERO_RUN ? end - at : ZERO_RUN;
		if (!all_zero(src + at, k))
			continue;
		zero[at / ZERO_RUN] = 1;
		if (at > run)
			memcpy(dst + run, src + run, at - run);
		run = at + k;
	}
	if (end > run)
		memcpy(dst + run, src + run, end - run);
}

static void *copier(void *arg)
{
	unsigned me = (unsigned)(uintptr_t)arg, seen = 0;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		while (!pool.quit && pool.gen == seen)
			pthread_cond_wait(&pool.go, &pool.mu);
		if (pool.quit)
			break;
		seen = pool.gen;
		char *dst = pool.dst;
		const char *src = pool.src;
		size_t len = pool.len;
		uint8_t *zero = pool.zero;
		unsigned n = pool.n + 1;
		pthread_mutex_unlock(&pool.mu);
		copy_part(me + 1, n, dst, src, len, zero);
		pthread_mutex_lock(&pool.mu);
		if (--pool.pending == 0)
			pthread_cond_signal(&pool.done);
	}
	pthread_mutex_unlock(&pool.mu);
	return NULL;
}

static void pool_start(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int asked = hami_config()->fast_park_copiers;
	unsigned want = asked >= 0 ? (unsigned)asked
		      : cpus > 2 ? (unsigned)(cpus / 2 < MAX_COPIERS ? cpus / 2 : MAX_COPIERS) : 0;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old); /* the copiers take no signal of the program's */
	pool.quit = 0;
	pool.n = 0;
	/* New copiers start having seen job 0: the jobs of an earlier park (whose
	 * buffers are gone) must not look new to them. */
	pool.gen = 0;
	for (unsigned i = 0; i < want; i++) {
		if (pthread_create(&pool.t[i], NULL, copier, (void *)(uintptr_t)i) != 0)
			break;
		pool.n++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void pool_stop(void)
{
	pthread_mutex_lock(&pool.mu);
	pool.quit = 1;
	pthread_cond_broadcast(&pool.go);
	pthread_mutex_unlock(&pool.mu);
	for (unsigned i = 0; i < pool.n; i++)
		pthread_join(pool.t[i], NULL);
	pool.n = 0;
}

/* memcpy, by this thread and the copiers together (zero: into a fresh host
 * copy, whose runs of zeros are marked there, from dst's first run on). */
static void parallel_copy(void *dst, const void *src, size_t len, uint8_t *zero)
{
	if (!pool.n || len < PARALLEL_MIN) {
		copy_part(0, 1, dst, src, len, zero);
		return;
	}
	pthread_mutex_lock(&pool.mu);
	unsigned n = pool.n;
	pool.dst = dst;
	pool.src = src;
	pool.len = len;
	pool.zero = zero;
	pool.pending = n;
	pool.gen++;
	pthread_cond_broadcast(&pool.go);
	pthread_mutex_unlock(&pool.mu);
	copy_part(0, n + 1, dst, src, len, zero);
	pthread_mutex_lock(&pool.mu);
	while (pool.pending)
		pthread_cond_wait(&pool.done, &pool.mu);
	pthread_mutex_unlock(&pool.mu);
}

/* ---- staging: pinned buffers the device copies to and from ----------------- */

struct stage {
	void *buf;       /* pinned, STAGE_BYTES */
	CUevent done;    /* recorded after the copy that uses buf */
	int busy;
	void *host;      /* park: where buf's bytes go once the copy is done */
	uint8_t *zero;   /* park: the runs of zeros there */
	size_t len;
};

struct mover {
	CUcontext ctx;   /* the context stream and events belong to */
	CUstream stream;
	struct stage st[STAGES];
	unsigned next;
	int to_host;
};

static struct {
	host_alloc_fn host_alloc;
	host_free_fn host_free;
	stream_create_fn stream_create;
	stream_fn stream_destroy, stream_sync;
	event_create_fn event_create;
	event_fn event_destroy, event_sync;
	event_record_fn event_record;
	dtoh_fn dtoh;
	htod_fn htod;
	set_ctx_fn set_ctx;
	sync_fn ctx_sync;
	mem_info_fn mem_info;
	memset_fn memset;
} cu;

static int load_driver(void)
{
	cu.host_alloc = HAMI_REAL(host_alloc_fn, "cuMemHostAlloc");
	cu.host_free = HAMI_REAL(host_free_fn, "cuMemFreeHost");
	cu.stream_create = HAMI_REAL(stream_create_fn, "cuStreamCreate");
	cu.stream_destroy = HAMI_REAL(stream_fn, "cuStreamDestroy_v2");
	cu.stream_sync = HAMI_REAL(stream_fn, "cuStreamSynchronize");
	cu.event_create = HAMI_REAL(event_create_fn, "cuEventCreate");
	cu.event_destroy = HAMI_REAL(event_fn, "cuEventDestroy_v2");
	cu.event_sync = HAMI_REAL(event_fn, "cuEventSynchronize");
	cu.event_record = HAMI_REAL(event_record_fn, "cuEventRecord");
	cu.dtoh = HAMI_REAL(dtoh_fn, "cuMemcpyDtoHAsync_v2");
	cu.htod = HAMI_REAL(htod_fn, "cuMemcpyHtoDAsync_v2");
	cu.set_ctx = HAMI_REAL(set_ctx_fn, "cuCtxSetCurrent");
	cu.ctx_sync = HAMI_REAL(sync_fn, "cuCtxSynchronize");
	cu.mem_info = HAMI_REAL(mem_info_fn, "cuMemGetInfo_v2");
	cu.memset = HAMI_REAL(memset_fn, "cuMemsetD8Async");
	return cu.memset && cu.host_alloc && cu.host_free && cu.stream_create && cu.stream_destroy && cu.stream_sync &&
	       cu.event_create && cu.event_destroy && cu.event_sync && cu.event_record && cu.dtoh && cu.htod &&
	       cu.set_ctx && cu.ctx_sync && cu.mem_info ? 0 : -1;
}

/* A mover of one context: its stream, events and pinned buffers (made for
 * each park or resume: a context that ends takes its pinned memory along). */
static CUresult mover_open(struct mover *m, CUcontext ctx, int to_host)
{
	memset(m, 0, sizeof(*m));
	m->ctx = ctx;
	m->to_host = to_host;
	CUresult rc = cu.set_ctx(ctx);
	if (rc == CUDA_SUCCESS)
		rc = cu.stream_create(&m->stream, CU_STREAM_NON_BLOCKING);
	for (int i = 0; rc == CUDA_SUCCESS && i < STAGES; i++)
		if ((rc = cu.host_alloc(&m->st[i].buf, STAGE_BYTES, CU_MEMHOSTALLOC_PORTABLE)) == CUDA_SUCCESS)
			rc = cu.event_create(&m->st[i].done, CU_EVENT_DISABLE_TIMING);
	return rc;
}

/* Wait for stage s's copy; on the way to host memory, drain it there. */
static CUresult stage_finish(struct mover *m, struct stage *s)
{
	if (!s->busy)
		return CUDA_SUCCESS;
	s->busy = 0;
	CUresult rc = cu.event_sync(s->done);
	if (rc == CUDA_SUCCESS && m->to_host)
		parallel_copy(s->host, s->buf, s->len, s->zero);
	return rc;
}

static CUresult mover_drain(struct mover *m)
{
	CUresult rc = CUDA_SUCCESS;
	for (unsigned k = 0; k < STAGES; k++) { /* oldest first: host copies fill in order */
		CUresult r = stage_finish(m, &m->st[(m->next + k) % STAGES]);
		if (rc == CUDA_SUCCESS)
			rc = r;
	}
	return rc;
}

/* Whatever happened, the stream's work ends before its buffers can be reused. */
static void mover_close(struct mover *m)
{
	if (m->stream) {
		cu.stream_sync(m->stream);
		for (int i = 0; i < STAGES; i++)
			m->st[i].busy = 0;
		cu.stream_destroy(m->stream);
	}
	for (int i = 0; i < STAGES; i++) {
		if (m->st[i].done)
			cu.event_destroy(m->st[i].done);
		if (m->st[i].buf)
			cu.host_free(m->st[i].buf);
	}
	memset(m, 0, sizeof(*m));
}

/* Whether the runs of [off, off + n) of a host copy were all zeros. */
static int zero_chunk(const uint8_t *zero, uint64_t off, size_t n)
{
	for (uint64_t r = off / ZERO_RUN, end = (off + n + ZERO_RUN - 1) / ZERO_RUN; r < end; r++)
		if (!zero[r])
			return 0;
	return 1;
}

/* Block b's bytes between the device and its host copy, through the stages;
 * on the way back a chunk that was all zeros is set on the device instead. */
static CUresult move(struct mover *m, const struct hami_vm_block *b)
{
	char *host = b->host;
	for (uint64_t off = 0; off < b->size;) {
		size_t n = b->size - off < STAGE_BYTES ? (size_t)(b->size - off) : (size_t)STAGE_BYTES;
		CUresult rc;
		if (!m->to_host && zero_chunk(b->zero, off, n)) {
			if ((rc = cu.memset(b->base + off, 0, n, m->stream)) != CUDA_SUCCESS)
				return rc;
			off += n;
			continue;
		}
		struct stage *s = &m->st[m->next];
		m->next = (m->next + 1) % STAGES;
		if ((rc = stage_finish(m, s)) != CUDA_SUCCESS)
			return rc;
		if (m->to_host) {
			rc = cu.dtoh(s->buf, b->base + off, n, m->stream);
			s->host = host + off;
			s->zero = b->zero + off / ZERO_RUN;
		} else {
			parallel_copy(s->buf, host + off, n, NULL);
			rc = cu.htod(b->base + off, s->buf, n, m->stream);
		}
		if (rc == CUDA_SUCCESS)
			rc = cu.event_record(s->done, m->stream);
		if (rc != CUDA_SUCCESS)
			return rc;
		s->len = n;
		s->busy = 1;
		off += n;
	}
	return CUDA_SUCCESS;
}

/* ---- host copies ---------------------------------------------------------- */

/* b's host copy and its map of runs of zeros; -1 without memory for them. */
static int host_copy(struct hami_vm_block *b)
{
	void *p = mmap(NULL, b->size ? b->size : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return -1;
	madvise(p, b->size, MADV_HUGEPAGE); /* fewer page faults while it fills (where the kernel has them) */
	b->zero = calloc(b->size / ZERO_RUN + 1, 1);
	if (!b->zero) {
		munmap(p, b->size ? b->size : 1);
		return -1;
	}
	b->host = p;
	return 0;
}

static void host_free(struct hami_vm_block *b)
{
	if (b->host)
		munmap(b->host, b->size ? b->size : 1);
	free(b->zero);
	b->host = NULL;
	b->zero = NULL;
}

/* ---- what may be moved ------------------------------------------------------ */

/* Records of what the process holds that this path cannot move (its own
 * driver allocations, pools, arrays, the program's virtual memory handles,
 * graph pools), per slice device, less the blocks it can. */
#define UNMOVABLE_KINDS ((1u << HAMI_KIND_MEMORY) | (1u << HAMI_KIND_POOL) | (1u << HAMI_KIND_ARRAY) | \
			 (1u << HAMI_KIND_MIPMAP) | (1u << HAMI_KIND_HANDLE) | (1u << HAMI_KIND_GRAPH_POOL))

/* What the hook charged for b (its record), on *sdev. */
static uint64_t block_record(const struct hami_vm_block *b, int *sdev)
{
	struct hami_record r;
	if (hami_record_get(HAMI_KIND_MEMORY, b->base, &r) < 0 || r.sdev < 0 || r.sdev >= HAMI_SLICE_MAX_DEVICES)
		return 0;
	*sdev = r.sdev;
	return r.bytes;
}

/* Everything b is charged: the hook's charge and its rounding. */
static uint64_t block_charge(const struct hami_vm_block *b, int *sdev)
{
	uint64_t bytes = block_record(b, sdev);
	if (b->extra && b->sdev >= 0) {
		*sdev = b->sdev;
		bytes += b->extra;
	}
	return bytes;
}

const char *hami_fast_park_refusal(void)
{
	static char why[160];
	if (!hami_config()->fast_park || !hami_gate_thunks_available())
		return "its library does not park itself here";
	struct hami_vm_block *all;
	size_t n = hami_vm_snapshot(&all);
	if (!n) {
		free(all);
		return "none of its memory was made to be moved";
	}
	uint64_t charged[HAMI_SLICE_MAX_DEVICES], kept = 0;
	hami_record_sums(UNMOVABLE_KINDS, charged);
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		kept += charged[d];
	for (size_t i = 0; i < n; i++) {
		int sdev;
		uint64_t c = block_record(&all[i], &sdev);
		kept = kept > c ? kept - c : 0;
	}
	free(all);
	if (kept > hami_config()->fast_park_keep) {
		char a[32], b[32];
		snprintf(why, sizeof(why), "it holds %s it cannot move (more than HAMI_FAST_PARK_KEEP, %s)",
			 hami_human(kept, a), hami_human(hami_config()->fast_park_keep, b));
		return why;
	}
	return NULL;
}

/* ---- park ----------------------------------------------------------------------- */

static int withdrawn(struct hami_slot *s)
{
	return __atomic_load_n(&s->park_fast, __ATOMIC_ACQUIRE) != HAMI_FAST_TAKEN;
}

#define MAX_CONTEXTS 64

/* The distinct contexts of blocks, in the order first met; MAX_CONTEXTS + 1
 * when there are more than that (the caller then moves nothing). */
static size_t contexts_of(const struct hami_vm_block *b, size_t n, CUcontext *out)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (j < k && out[j] != b[i].ctx)
			j++;
		if (j < k)
			continue;
		if (k == MAX_CONTEXTS)
			return MAX_CONTEXTS + 1;
		out[k++] = b[i].ctx;
	}
	return k;
}

/* Bring blocks [0, n) that are parked back: mapped, access set, bytes copied
 * back. The host copies stay until the caller frees them. On failure what
 * this call mapped is unmapped again: the blocks stay parked. */
static CUresult bring_back(struct hami_vm_block *b, size_t n)
{
	CUcontext ctxs[MAX_CONTEXTS];
	size_t nctx = contexts_of(b, n, ctxs);
	CUresult rc = nctx > MAX_CONTEXTS ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
	for (size_t c = 0; rc == CUDA_SUCCESS && c < nctx; c++) {
		struct mover m;
		rc = mover_open(&m, ctxs[c], 0);
		for (size_t i = 0; rc == CUDA_SUCCESS && i < n; i++) {
			if (b[i].ctx != ctxs[c] || b[i].handle || !b[i].host)
				continue;
			if ((rc = hami_vm_map(&b[i])) == CUDA_SUCCESS)
				rc = move(&m, &b[i]);
		}
		if (rc == CUDA_SUCCESS)
			rc = mover_drain(&m);
		mover_close(&m);
	}
	if (rc != CUDA_SUCCESS) /* all or nothing: this attempt's mappings go again */
		for (size_t i = 0; i < n; i++)
			if (b[i].handle && b[i].host)
				hami_vm_unmap(&b[i]);
	return rc;
}

int hami_fast_park(struct hami_slot *s, CUresult *error)
{
	*error = CUDA_SUCCESS;
	if (load_driver() < 0) {
		*error = CUDA_ERROR_NOT_FOUND;
		return HAMI_FAST_FAILED;
	}
	/* Every other thread out of the driver: new calls wait at the gate. */
	uint64_t calls;
	for (;;) {
		if (withdrawn(s))
			return HAMI_FAST_WITHDRAWN;
		if (!hami_threads_in_driver(&calls))
			break;
		struct timespec ts = { 0, WAIT_NS };
		nanosleep(&ts, NULL);
	}
	struct hami_vm_block *b;
	size_t n = hami_vm_snapshot(&b);
	CUcontext ctxs[MAX_CONTEXTS];
	size_t nctx = contexts_of(b, n, ctxs);
	int mode = hami_capture_relaxed_begin(); /* a capture under way elsewhere stays valid */
	CUresult rc = nctx > MAX_CONTEXTS ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS; /* refused below */
	/* The GPU work in flight ends before anything of its memory moves. */
	for (size_t c = 0; rc == CUDA_SUCCESS && c < nctx && !withdrawn(s); c++)
		if ((rc = cu.set_ctx(ctxs[c])) == CUDA_SUCCESS)
			rc = cu.ctx_sync();
	/* A context it cannot synchronize (gone, or its work failed), or more
	 * of them than it keeps track of: the driver's checkpoint judges that
	 * process, as before the fast park. */
	uint32_t taken = HAMI_FAST_TAKEN;
	if (!__atomic_compare_exchange_n(&s->park_fast, &taken, rc == CUDA_SUCCESS ? HAMI_FAST_COPYING
										     : HAMI_FAST_REFUSED,
					 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		free(b); /* the parker checkpoints instead: no driver call any more */
		return HAMI_FAST_WITHDRAWN;
	}
	if (rc != CUDA_SUCCESS) {
		hami_capture_relaxed_end(mode);
		free(b);
		hami_log(HAMI_LOG_INFO, "asked to park itself: a context's work could not be waited for (error %d); "
			 "the parker checkpoints it", rc);
		return HAMI_FAST_REFUSED;
	}
	pool_start();
	/* 1: every block's bytes to host memory; nothing is released yet. */
	for (size_t c = 0; rc == CUDA_SUCCESS && c < nctx; c++) {
		struct mover m;
		rc = mover_open(&m, ctxs[c], 1);
		for (size_t i = 0; rc == CUDA_SUCCESS && i < n; i++) {
			if (b[i].ctx != ctxs[c])
				continue;
			if (host_copy(&b[i]) < 0)
				rc = CUDA_ERROR_OUT_OF_MEMORY;
			else
				rc = move(&m, &b[i]);
		}
		if (rc == CUDA_SUCCESS)
			rc = mover_drain(&m);
		mover_close(&m);
	}
	/* A thread that passed the gate before the park began and called after
	 * the wait above would be using memory about to go: then not now. */
	uint64_t calls_now;
	hami_threads_in_driver(&calls_now);
	if (rc == CUDA_SUCCESS && calls_now != calls)
		rc = CUDA_ERROR_NOT_READY;
	/* 2: each block's device memory released (never one without its host copy). */
	size_t released = 0;
	for (size_t i = 0; rc == CUDA_SUCCESS && i < n; i++)
		if (b[i].host && ((rc = hami_vm_unmap(&b[i])) == CUDA_SUCCESS || !b[i].handle))
			released++;
	if (rc != CUDA_SUCCESS && released) {
		/* Half-way: what went comes back, as a resume brings it; what cannot
		 * come back now stays parked, its bytes safe in host memory. */
		if (bring_back(b, n) != CUDA_SUCCESS)
			hami_log(HAMI_LOG_WARN, "a park that failed half-way (error %d) could not bring the memory "
				 "it had released back; it completes the park instead: nothing is lost", rc);
	}
	size_t parked = 0;
	for (size_t i = 0; i < n; i++) {
		if (b[i].handle)
			host_free(&b[i]); /* on the GPU: no host copy */
		else
			parked++;
	}
	if (rc != CUDA_SUCCESS && parked) /* it could not come back: the rest goes too */
		for (size_t i = 0; i < n; i++)
			if (b[i].handle && host_copy(&b[i]) == 0) {
				struct mover m;
				CUresult r = mover_open(&m, b[i].ctx, 1);
				if (r == CUDA_SUCCESS)
					r = move(&m, &b[i]);
				if (r == CUDA_SUCCESS)
					r = mover_drain(&m);
				mover_close(&m);
				if (r != CUDA_SUCCESS || hami_vm_unmap(&b[i]) != CUDA_SUCCESS)
					host_free(&b[i]); /* stays on the GPU, as it is */
				else
					parked++;
			}
	pool_stop();
	hami_capture_relaxed_end(mode);
	/* The charge of what went: to parked[], as the slice counts host memory. */
	uint64_t moved[HAMI_SLICE_MAX_DEVICES] = { 0 };
	for (size_t i = 0; i < n; i++) {
		int sdev = -1;
		uint64_t c = block_charge(&b[i], &sdev);
		if (!b[i].handle && sdev >= 0)
			moved[sdev] += c;
		hami_vm_update(&b[i]);
	}
	free(b);
	if (!parked) {
		*error = rc;
		return HAMI_FAST_FAILED;
	}
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		if (!moved[d])
			continue;
		__atomic_store_n(&s->parked[d], moved[d], __ATOMIC_RELEASE);
		hami_credit(d, moved[d]);
	}
	return HAMI_FAST_DONE;
}

/* ---- resume ----------------------------------------------------------------------- */

uint64_t hami_fast_parked_bytes(int sdev)
{
	struct hami_vm_block *b;
	size_t n = hami_vm_snapshot(&b);
	uint64_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		if (!b[i].handle && b[i].host && b[i].sdev == sdev)
			bytes += b[i].span;
	free(b);
	return bytes;
}

int hami_fast_free_memory(int sdev, uint64_t *free_bytes)
{
	if (load_driver() < 0)
		return -1;
	struct hami_vm_block *b;
	size_t n = hami_vm_snapshot(&b);
	CUcontext ctx = NULL;
	for (size_t i = 0; i < n && !ctx; i++)
		if (b[i].sdev == sdev)
			ctx = b[i].ctx;
	free(b);
	size_t fr = 0, total = 0;
	if (!ctx || cu.set_ctx(ctx) != CUDA_SUCCESS || cu.mem_info(&fr, &total) != CUDA_SUCCESS)
		return -1;
	*free_bytes = fr;
	return 0;
}

CUresult hami_fast_resume(void)
{
	if (load_driver() < 0)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_vm_block *b;
	size_t n = hami_vm_snapshot(&b);
	int mode = hami_capture_relaxed_begin();
	pool_start();
	CUresult rc = bring_back(b, n);
	pool_stop();
	hami_capture_relaxed_end(mode);
	if (rc == CUDA_SUCCESS)
		for (size_t i = 0; i < n; i++) {
			host_free(&b[i]);
			hami_vm_update(&b[i]);
		}
	free(b);
	return rc;
}
