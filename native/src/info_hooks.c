/*
 * Answers sized to the slice, so frameworks size themselves to it:
 * total = min(limit, physical); free = what the slice has left, never more
 * than the GPU really has free, never an unsigned wrap.
 */
#include "hami.h"
#include "hook_api.h"

typedef CUresult (*mem_info_fn)(size_t *, size_t *);
typedef CUresult (*total_mem_fn)(size_t *, CUdevice);

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

HAMI_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	HAMI_IN_DRIVER();
	mem_info_fn fn = HAMI_REAL(mem_info_fn, "cuMemGetInfo_v2");
	if (!free || !total)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int s = hami_setup();
	if (s > 0)
		return (CUresult)s;
	CUresult rc = fn(free, total);
	if (rc != CUDA_SUCCESS || s < 0)
		return rc;
	int sdev = hami_current_device(NULL);
	uint64_t limit = sdev >= 0 ? hami_device_limit_bytes(sdev) : 0;
	if (limit) {
		uint64_t slice_total = min_u64(limit, *total);
		uint64_t used = hami_device_used(sdev);
		uint64_t left = slice_total > used ? slice_total - used : 0;
		*total = (size_t)slice_total;
		*free = (size_t)min_u64(left, *free);
	}
	/* A process with a cap of its own inside the slice sees that cap. */
	uint64_t cap = sdev >= 0 ? hami_process_limit() : 0;
	if (cap) {
		uint64_t held = hami_process_held(sdev);
		*total = (size_t)min_u64(cap, *total);
		*free = (size_t)min_u64(cap > held ? cap - held : 0, *free);
	}
	return rc;
}

HAMI_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	HAMI_IN_DRIVER();
	total_mem_fn fn = HAMI_REAL(total_mem_fn, "cuDeviceTotalMem_v2");
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int s = hami_setup();
	if (s > 0)
		return (CUresult)s;
	CUresult rc = fn(bytes, dev);
	if (rc != CUDA_SUCCESS || s < 0)
		return rc;
	int sdev = hami_ordinal_device(dev);
	uint64_t limit = sdev >= 0 ? hami_device_limit_bytes(sdev) : 0;
	if (limit)
		*bytes = (size_t)min_u64(limit, *bytes);
	uint64_t cap = sdev >= 0 ? hami_process_limit() : 0;
	if (cap)
		*bytes = (size_t)min_u64(cap, *bytes);
	return rc;
}
