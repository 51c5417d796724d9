/*
 * A CUDA context costs device memory before the program allocates anything
 * (hundreds of MiB on a Hopper GPU), so it is charged to the slice: the
 * primary context once per device per process, each created context on its
 * own. HAMI_CONTEXT_OVERHEAD sets the amount; otherwise the first context of
 * the process is measured through NVML and that figure is reused.
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
typedef nvmlReturn_t (*nvml_procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*nvml_mem_fn)(nvmlDevice_t, nvmlMemory_t *);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int primary_retains[HAMI_MAX_ORDINALS];
static uint64_t primary_charge[HAMI_MAX_ORDINALS];
static uint64_t measured_overhead;

void hami_contexts_after_fork(void)
{
	pthread_mutex_init(&lock, NULL);
	memset(primary_retains, 0, sizeof(primary_retains));
	memset(primary_charge, 0, sizeof(primary_charge));
}

static int nvml_device_used(int sdev, uint64_t *used)
{
	nvml_mem_fn mem = (nvml_mem_fn)hami_nvml_sym("nvmlDeviceGetMemoryInfo");
	nvmlDevice_t dev = hami_nvml_device(sdev);
	nvmlMemory_t m;
	if (!mem || !dev || mem(dev, &m) != NVML_SUCCESS)
		return -1;
	*used = m.used;
	return 0;
}

/* This process's own device memory as NVML sees it (same PID namespace only). */
static int nvml_process_used(int sdev, uint64_t *used)
{
	nvml_procs_fn procs = (nvml_procs_fn)hami_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
	nvmlDevice_t dev = hami_nvml_device(sdev);
	nvmlProcessInfo_t info[64];
	unsigned int n = 64;
	if (!procs || !dev || procs(dev, &n, info) != NVML_SUCCESS)
		return -1;
	for (unsigned int i = 0; i < n; i++)
		if (info[i].pid == (unsigned int)getpid()) {
			*used = info[i].usedGpuMemory;
			return 0;
		}
	return -1;
}

static int need_measure(void)
{
	return !hami_config()->has_context_overhead && !measured_overhead;
}

/* The bytes to charge for a context just created on slice device sdev. */
static uint64_t context_bytes(int sdev, int have_before, uint64_t device_used_before)
{
	const struct hami_config *c = hami_config();
	if (c->has_context_overhead)
		return c->context_overhead;
	if (measured_overhead)
		return measured_overhead;
	uint64_t used = 0, mine = 0;
	struct hami_slice_file *f = hami_slice();
	int slot = hami_slot();
	if (f && slot >= 0)
		mine = __atomic_load_n(&f->slot[slot].memory_used[sdev], __ATOMIC_ACQUIRE);
	if (nvml_process_used(sdev, &used) == 0 && used > mine)
		measured_overhead = used - mine;
	else if (have_before && nvml_device_used(sdev, &used) == 0 && used > device_used_before)
		measured_overhead = used - device_used_before; /* racy with neighbours, still close */
	if (measured_overhead)
		hami_log(HAMI_LOG_DEBUG, "a CUDA context costs %llu bytes on this GPU",
			 (unsigned long long)measured_overhead);
	return measured_overhead;
}

/* Before creating: a device-wide reading to measure against, when needed. */
static int reading_before(int sdev, uint64_t *used)
{
	return sdev >= 0 && need_measure() && nvml_device_used(sdev, used) == 0;
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

HAMI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	static retain_fn fn;
	if (!fn)
		fn = (retain_fn)hami_cuda_sym("cuDevicePrimaryCtxRetain");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult err;
	int sdev = ready_device(dev, &err);
	if (err != CUDA_SUCCESS)
		return err;
	if (sdev < 0 || dev < 0 || dev >= HAMI_MAX_ORDINALS)
		return fn(pctx, dev);
	pthread_mutex_lock(&lock);
	uint64_t before = 0;
	int have_before = primary_retains[dev] == 0 && reading_before(sdev, &before);
	CUresult rc = fn(pctx, dev);
	if (rc == CUDA_SUCCESS && primary_retains[dev]++ == 0) {
		uint64_t bytes = context_bytes(sdev, have_before, before);
		if (hami_charge(sdev, bytes, "a CUDA context") != CUDA_SUCCESS) {
			release_fn rel = (release_fn)hami_cuda_sym("cuDevicePrimaryCtxRelease_v2");
			if (rel)
				rel(dev);
			primary_retains[dev] = 0;
			*pctx = NULL;
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			primary_charge[dev] = bytes;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

HAMI_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	static release_fn fn;
	if (!fn)
		fn = (release_fn)hami_cuda_sym("cuDevicePrimaryCtxRelease_v2");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	if (dev < 0 || dev >= HAMI_MAX_ORDINALS)
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

/* What cuCtxCreate* needs before the real call: the slice device and a reading. */
struct ctx_create {
	int sdev;
	int have_before;
	uint64_t before;
};

static CUresult begin_create(CUcontext *pctx, void *fn, CUdevice dev, struct ctx_create *c)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult err;
	c->sdev = ready_device(dev, &err);
	c->before = 0;
	c->have_before = err == CUDA_SUCCESS && reading_before(c->sdev, &c->before);
	return err;
}

/* Charge a context created by cuCtxCreate*, or destroy it if the slice is full. */
static CUresult finish_create(CUresult rc, CUcontext *pctx, const struct ctx_create *c)
{
	if (rc != CUDA_SUCCESS || c->sdev < 0)
		return rc;
	uint64_t bytes = context_bytes(c->sdev, c->have_before, c->before);
	if (hami_charge(c->sdev, bytes, "a CUDA context") != CUDA_SUCCESS) {
		destroy_fn d = (destroy_fn)hami_cuda_sym("cuCtxDestroy_v2");
		if (d)
			d(*pctx);
		*pctx = NULL;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct hami_record r = { .key = (uint64_t)(uintptr_t)*pctx, .bytes = bytes, .sdev = c->sdev,
				 .kind = HAMI_KIND_CONTEXT };
	hami_record_put(&r);
	return rc;
}

HAMI_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	static create2_fn fn;
	if (!fn)
		fn = (create2_fn)hami_cuda_sym("cuCtxCreate_v2");
	struct ctx_create c;
	CUresult err = begin_create(pctx, (void *)fn, dev, &c);
	return err != CUDA_SUCCESS ? err : finish_create(fn(pctx, flags, dev), pctx, &c);
}

HAMI_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int numParams, unsigned int flags,
				    CUdevice dev)
{
	static create3_fn fn;
	if (!fn)
		fn = (create3_fn)hami_cuda_sym("cuCtxCreate_v3");
	struct ctx_create c;
	CUresult err = begin_create(pctx, (void *)fn, dev, &c);
	return err != CUDA_SUCCESS ? err : finish_create(fn(pctx, params, numParams, flags, dev), pctx, &c);
}

HAMI_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *params, unsigned int flags, CUdevice dev)
{
	static create4_fn fn;
	if (!fn)
		fn = (create4_fn)hami_cuda_sym("cuCtxCreate_v4");
	struct ctx_create c;
	CUresult err = begin_create(pctx, (void *)fn, dev, &c);
	return err != CUDA_SUCCESS ? err : finish_create(fn(pctx, params, flags, dev), pctx, &c);
}

HAMI_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	static destroy_fn fn;
	if (!fn)
		fn = (destroy_fn)hami_cuda_sym("cuCtxDestroy_v2");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_CONTEXT, (uint64_t)(uintptr_t)ctx, &r) == 0;
	CUresult rc = fn(ctx);
	hami_settle_free(known, &r, rc);
	return rc;
}
