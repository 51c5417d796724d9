/*
 * A CUDA context costs device memory before the program allocates anything
 * (hundreds of MiB on a Hopper GPU), so it is charged to the slice: the
 * primary context once per device per process, each created context on its
 * own. HAMI_CONTEXT_OVERHEAD sets the amount; otherwise the first context of
 * the process is measured through NVML and that figure is reused. A context
 * that the driver refuses for memory waits for the memory broker to make room
 * (room.c), as an allocation does: its cost reserved in the slice, or, for a
 * first context whose cost nobody knows yet, CONTEXT_GUESS asked of the broker
 * within what the slice's limit leaves (driver_room.c). And while another
 * process's GPU state is being checkpointed or restored (a park or a resume),
 * the driver refuses new contexts with CUDA_ERROR_DEVICE_UNAVAILABLE (seen on
 * an H100: "CUDA-capable device(s) is/are busy or unavailable" in a PyTorch
 * session's set-up while the broker parked another): a moment's wait
 * (gpu_busy.c). On a GPU the node agent calls tight, the context takes its
 * turn like an allocation (room_ledger.c), its cost (or the guess) the take.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "hami.h"
#include "hook_api.h"

typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*release_fn)(CUdevice);
typedef CUresult (*create2_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create3_fn)(CUcontext *, void *, int, unsigned int, CUdevice);
typedef CUresult (*create4_fn)(CUcontext *, void *, unsigned int, CUdevice);
typedef CUresult (*destroy_fn)(CUcontext);

#define CONTEXT_GUESS (512ull << 20) /* PyTorch's context on an H100: about 500 MiB */

pthread_mutex_t hami_context_lock = PTHREAD_MUTEX_INITIALIZER;
#define lock hami_context_lock
static int primary_retains[HAMI_MAX_CUDA_DEVICES];
static uint64_t primary_charge[HAMI_MAX_CUDA_DEVICES];
/* Written once by the first context measured; read by any thread creating one. */
static uint64_t measured_overhead;

void hami_contexts_after_fork(void)
{
	memset(primary_retains, 0, sizeof(primary_retains));
	memset(primary_charge, 0, sizeof(primary_charge));
}

static int nvml_device_used(int sdev, uint64_t *used)
{
	nvmlMemory_t m;
	if (hami_nvml_memory(sdev, &m) < 0)
		return -1;
	*used = m.used;
	return 0;
}

/* Measure what a context just created on slice device sdev cost (its cost was
 * not known before; another thread may have measured one meanwhile). */
static uint64_t measure_context(int sdev, int have_before, uint64_t device_used_before)
{
	uint64_t known = __atomic_load_n(&measured_overhead, __ATOMIC_RELAXED);
	if (known)
		return known;
	uint64_t used = 0, mine = 0, measured = 0;
	struct hami_slice_file *f = hami_slice();
	int slot = hami_slot();
	if (f && slot >= 0)
		mine = __atomic_load_n(&f->slot[slot].memory_used[sdev], __ATOMIC_ACQUIRE);
	if (hami_nvml_process_used(sdev, &used) == 0 && used > mine)
		measured = used - mine;
	else if (have_before && nvml_device_used(sdev, &used) == 0 && used > device_used_before)
		measured = used - device_used_before; /* racy with neighbours, still close */
	if (!measured)
		return 0;
	/* Threads creating contexts at once may each measure: the first figure stays. */
	if (!__atomic_compare_exchange_n(&measured_overhead, &known, measured, 0, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return known;
	hami_log(HAMI_LOG_DEBUG, "a CUDA context costs %llu bytes on this GPU", (unsigned long long)measured);
	return measured;
}

/*
 * What a context costs, when that is known before one is made (configured, or
 * measured by an earlier context of this process): then it is reserved before
 * the real call, so the slice is never over its cap while a context is being
 * made. Otherwise (the process's first context, not configured) it is
 * measured after, and charged then.
 */
static int known_context_bytes(uint64_t *bytes)
{
	const struct hami_config *c = hami_config();
	if (c->has_context_overhead) {
		*bytes = c->context_overhead;
		return 1;
	}
	*bytes = __atomic_load_n(&measured_overhead, __ATOMIC_RELAXED);
	return *bytes != 0;
}

/* A context about to be made on slice device sdev: its known cost, reserved,
 * or a device-wide reading to measure it against afterwards. */
struct ctx_cost {
	int sdev;
	int ordinal;
	int reserved;
	uint64_t bytes;
	int have_before;
	uint64_t before;
};

/* Before the real call: CUDA_ERROR_OUT_OF_MEMORY when the slice has no room. */
static CUresult reserve_context(struct ctx_cost *c, int sdev, CUdevice dev)
{
	c->sdev = sdev;
	c->ordinal = dev;
	c->before = 0;
	c->reserved = known_context_bytes(&c->bytes);
	if (c->reserved && hami_charge(sdev, c->bytes, "a CUDA context") != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->have_before = !c->reserved && nvml_device_used(sdev, &c->before) == 0;
	return CUDA_SUCCESS;
}

/*
 * After it (rc): CUDA_SUCCESS with *bytes charged for the new context; the
 * call's own error with the reservation handed back; or
 * CUDA_ERROR_OUT_OF_MEMORY when the measured cost does not fit (the caller
 * undoes the context).
 */
static CUresult settle_context(CUresult rc, const struct ctx_cost *c, uint64_t *bytes)
{
	if (rc != CUDA_SUCCESS) {
		if (c->reserved)
			hami_credit(c->sdev, c->bytes);
		return rc;
	}
	if (c->reserved) {
		*bytes = c->bytes;
		return CUDA_SUCCESS;
	}
	*bytes = measure_context(c->sdev, c->have_before, c->before);
	return hami_charge(c->sdev, *bytes, "a CUDA context") == CUDA_SUCCESS ? CUDA_SUCCESS
									      : CUDA_ERROR_OUT_OF_MEMORY;
}

static int ready_device(CUdevice dev, CUresult *err)
{
	int s = hami_setup();
	*err = CUDA_SUCCESS;
	if (s > 0) {
		*err = (CUresult)s;
		return -1;
	}
	return s == CUDA_SUCCESS ? hami_ordinal_device(dev) : -1;
}

/* Not a CUresult: the primary context was made by another thread while this one waited. */
#define RETAINED_MEANWHILE ((CUresult)-1)

/* The driver refused a context (rc): wait for room (its cost reserved, or a
 * guess at it asked of the broker) or for a busy GPU. 1: make it again. */
static int context_again(CUresult rc, struct hami_driver_room *d, const struct ctx_cost *cost)
{
	if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE)
		return hami_busy_wait(&d->room.busy, cost->sdev, cost->ordinal, "a CUDA context");
	if (rc != CUDA_ERROR_OUT_OF_MEMORY)
		return 0;
	if (cost->reserved)
		return hami_room_wait(&d->room, cost->sdev, cost->bytes, "a CUDA context", NULL);
	return hami_driver_room_wait(d, cost->sdev, CONTEXT_GUESS, "a CUDA context");
}

/* Whether the room ledger lets the context be made now (CUDA_SUCCESS), or it
 * waits its turn (CUDA_ERROR_OUT_OF_MEMORY, as if the driver had refused it). */
static CUresult context_turn(struct hami_driver_room *d, const struct ctx_cost *cost)
{
	return hami_room_turn(&d->room, cost->sdev, cost->reserved ? cost->bytes : CONTEXT_GUESS);
}

/*
 * The driver refused the primary context for memory, its cost reserved: wait
 * for room with the lock dropped (called and returning with it held), then
 * retain again. RETAINED_MEANWHILE when another thread made the context while
 * this one waited: then this retain is counted and its reservation given back.
 */
static CUresult retain_when_room(retain_fn fn, CUcontext *pctx, CUdevice dev, const struct ctx_cost *cost,
				 CUresult rc)
{
	struct hami_driver_room room = HAMI_DRIVER_ROOM_INIT;
	for (;;) {
		pthread_mutex_unlock(&lock); /* never held while waiting */
		int again = context_again(rc, &room, cost);
		pthread_mutex_lock(&lock);
		if (!again)
			break;
		if (primary_retains[dev] > 0) {
			rc = fn(pctx, dev);
			if (rc == CUDA_SUCCESS) {
				primary_retains[dev]++;
				if (cost->reserved)
					hami_credit(cost->sdev, cost->bytes);
				rc = RETAINED_MEANWHILE;
			}
			break;
		}
		if ((rc = context_turn(&room, cost)) == CUDA_SUCCESS)
			rc = fn(pctx, dev);
		if (rc != CUDA_ERROR_OUT_OF_MEMORY && rc != CUDA_ERROR_DEVICE_UNAVAILABLE)
			break;
	}
	hami_driver_room_end(&room);
	return rc;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	HAMI_IN_DRIVER();
	retain_fn fn = HAMI_REAL(retain_fn, "cuDevicePrimaryCtxRetain");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult err;
	int sdev = ready_device(dev, &err);
	if (err != CUDA_SUCCESS)
		return err;
	if (sdev < 0 || dev < 0 || dev >= HAMI_MAX_CUDA_DEVICES)
		return fn(pctx, dev);
	pthread_mutex_lock(&lock);
	if (primary_retains[dev] > 0) { /* charged once, at the first retain */
		CUresult rc = fn(pctx, dev);
		if (rc == CUDA_SUCCESS)
			primary_retains[dev]++;
		pthread_mutex_unlock(&lock);
		return rc;
	}
	struct ctx_cost cost;
	if (reserve_context(&cost, sdev, dev) != CUDA_SUCCESS) {
		pthread_mutex_unlock(&lock);
		*pctx = NULL;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct hami_driver_room turn = HAMI_DRIVER_ROOM_INIT;
	CUresult rc = context_turn(&turn, &cost);
	hami_driver_room_end(&turn);
	if (rc == CUDA_SUCCESS)
		rc = fn(pctx, dev);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE)
		rc = retain_when_room(fn, pctx, dev, &cost, rc);
	if (rc == RETAINED_MEANWHILE) {
		pthread_mutex_unlock(&lock);
		return CUDA_SUCCESS;
	}
	uint64_t bytes = 0;
	CUresult settled = settle_context(rc, &cost, &bytes);
	if (settled == CUDA_SUCCESS) {
		primary_retains[dev] = 1;
		primary_charge[dev] = bytes;
	} else if (rc == CUDA_SUCCESS) {
		release_fn rel = HAMI_REAL(release_fn, "cuDevicePrimaryCtxRelease_v2");
		if (rel)
			rel(dev);
		*pctx = NULL;
	}
	pthread_mutex_unlock(&lock);
	return settled;
}

/* The real release, then the credit when the last retain is gone. */
static CUresult release_primary(release_fn fn, CUdevice dev)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	if (dev < 0 || dev >= HAMI_MAX_CUDA_DEVICES)
		return fn(dev);
	pthread_mutex_lock(&lock);
	CUresult rc = fn(dev);
	if (rc == CUDA_SUCCESS && primary_retains[dev] > 0 && --primary_retains[dev] == 0) {
		hami_credit(hami_ordinal_device(dev), primary_charge[dev]);
		primary_charge[dev] = 0;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	HAMI_IN_DRIVER();
	return release_primary(HAMI_REAL(release_fn, "cuDevicePrimaryCtxRelease_v2"), dev);
}

/* The CUDA runtime asks cuGetProcAddress for this one at version 7000 and gets
 * the first export (seen with PyTorch, CuPy and JAX on driver 580). */
HAMI_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	HAMI_IN_DRIVER();
	return release_primary(HAMI_REAL(release_fn, "cuDevicePrimaryCtxRelease"), dev);
}

static CUresult begin_create(CUcontext *pctx, void *fn, CUdevice dev, struct ctx_cost *c)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult err;
	c->sdev = ready_device(dev, &err);
	if (err != CUDA_SUCCESS || c->sdev < 0)
		return err;
	if (reserve_context(c, c->sdev, dev) != CUDA_SUCCESS) {
		*pctx = NULL;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

/* Whether a context the driver refused waits (for room, or a busy GPU): one in a slice. */
static int waits_for_room(CUresult rc, const struct ctx_cost *c)
{
	return (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) && c->sdev >= 0;
}

/* Charge a context created by cuCtxCreate*, or destroy it if the slice is full. */
static CUresult finish_create(CUresult rc, CUcontext *pctx, const struct ctx_cost *c)
{
	if (c->sdev < 0)
		return rc;
	uint64_t bytes = 0;
	CUresult settled = settle_context(rc, c, &bytes);
	if (settled != CUDA_SUCCESS) {
		if (rc == CUDA_SUCCESS) {
			destroy_fn d = HAMI_REAL(destroy_fn, "cuCtxDestroy_v2");
			if (d)
				d(*pctx);
			*pctx = NULL;
		}
		return settled;
	}
	struct hami_record r = { .key = (uint64_t)(uintptr_t)*pctx, .bytes = bytes, .sdev = c->sdev,
				 .kind = HAMI_KIND_CONTEXT };
	hami_record_put(&r);
	return rc;
}

HAMI_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	HAMI_IN_DRIVER();
	create2_fn fn = HAMI_REAL(create2_fn, "cuCtxCreate_v2");
	struct ctx_cost c = { .sdev = -1 };
	CUresult rc = begin_create(pctx, (void *)fn, dev, &c);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct hami_driver_room room = HAMI_DRIVER_ROOM_INIT;
	do
		if ((rc = context_turn(&room, &c)) == CUDA_SUCCESS)
			rc = fn(pctx, flags, dev);
	while (waits_for_room(rc, &c) && context_again(rc, &room, &c));
	hami_driver_room_end(&room);
	return finish_create(rc, pctx, &c);
}

HAMI_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int numParams, unsigned int flags,
				    CUdevice dev)
{
	HAMI_IN_DRIVER();
	create3_fn fn = HAMI_REAL(create3_fn, "cuCtxCreate_v3");
	struct ctx_cost c = { .sdev = -1 };
	CUresult rc = begin_create(pctx, (void *)fn, dev, &c);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct hami_driver_room room = HAMI_DRIVER_ROOM_INIT;
	do
		if ((rc = context_turn(&room, &c)) == CUDA_SUCCESS)
			rc = fn(pctx, params, numParams, flags, dev);
	while (waits_for_room(rc, &c) && context_again(rc, &room, &c));
	hami_driver_room_end(&room);
	return finish_create(rc, pctx, &c);
}

HAMI_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
	HAMI_IN_DRIVER();
	create4_fn fn = HAMI_REAL(create4_fn, "cuCtxCreate_v4");
	struct ctx_cost c = { .sdev = -1 };
	CUresult rc = begin_create(pctx, (void *)fn, dev, &c);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct hami_driver_room room = HAMI_DRIVER_ROOM_INIT;
	do
		if ((rc = context_turn(&room, &c)) == CUDA_SUCCESS)
			rc = fn(pctx, params, flags, dev);
	while (waits_for_room(rc, &c) && context_again(rc, &room, &c));
	hami_driver_room_end(&room);
	return finish_create(rc, pctx, &c);
}

HAMI_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	HAMI_IN_DRIVER();
	destroy_fn fn = HAMI_REAL(destroy_fn, "cuCtxDestroy_v2");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_CONTEXT, (uint64_t)(uintptr_t)ctx, &r) == 0;
	CUresult rc = fn(ctx);
	hami_settle_free(known, &r, rc);
	return rc;
}
