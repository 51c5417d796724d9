/*
 * Every driver call that takes device memory is charged to the slice before
 * the driver is asked (reserve, then allocate) and credited by its matching
 * free. A free of something we never saw still goes to the driver. When the
 * slice had room but the GPU had not (or the node agent's room ledger keeps
 * what is free for others), the call waits for the memory broker to make room
 * and is tried again (HAMI_TAKE), the reservation kept meanwhile. With
 * HAMI_FAST_PARK=1 the plain and pitched allocations are backed by
 * vm_backing.c where the hooks call the driver, charged the same.
 */
#include <pthread.h>
#include <string.h>

#include "hami.h"
#include "hook_api.h"

#define POOL_GRANULE (2ull * HAMI_MIB)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pool_async_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*pool_create_fn)(CUmemoryPool *, const void *);
typedef CUresult (*pool_destroy_fn)(CUmemoryPool);
typedef CUresult (*pool_trim_fn)(CUmemoryPool, size_t);
typedef CUresult (*pool_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult (*device_pool_fn)(CUmemoryPool *, CUdevice);
typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
				  unsigned long long);
typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*array_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array3d_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*array_destroy_fn)(CUarray);
typedef CUresult (*mipmap_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult (*mipmap_destroy_fn)(CUmipmappedArray);

/*
 * The slice device a new allocation on the current context lands on.
 * Fails (returns an error) when the settings are bad: never unlimited.
 * *sdev = -1: not governed (no context, unknown GPU): the driver decides.
 */
static CUresult governed_device(int *sdev, int *ordinal)
{
	*sdev = -1;
	int s = hami_setup();
	if (s < 0)
		return CUDA_SUCCESS;
	if (s != CUDA_SUCCESS)
		return (CUresult)s;
	*sdev = hami_current_device(ordinal);
	return CUDA_SUCCESS;
}

static void remember(uint32_t kind, uint64_t key, uint64_t bytes, int sdev, uint64_t pool)
{
	struct hami_record r = { .key = key, .bytes = bytes, .pool = pool, .sdev = sdev, .kind = kind };
	if (hami_record_put(&r) < 0)
		hami_log(HAMI_LOG_WARN, "out of host memory: an allocation stays charged after its free");
}

/* ---- plain allocations --------------------------------------------------- */

static CUresult charged_alloc(CUdeviceptr *dptr, size_t bytes, const char *what, alloc_fn fn,
			      managed_fn managed, unsigned int flags)
{
	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn && !managed)
		return CUDA_ERROR_NOT_FOUND;
	int sdev;
	CUresult rc = governed_device(&sdev, NULL);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (sdev >= 0 && bytes && (rc = hami_charge(sdev, bytes, what)) != CUDA_SUCCESS)
		return rc;
	HAMI_TAKE(rc, sdev, bytes, what, managed ? managed(dptr, bytes, flags) : hami_vm_alloc(dptr, bytes, fn));
	if (sdev < 0 || !bytes)
		return rc;
	if (rc != CUDA_SUCCESS)
		hami_credit(sdev, bytes);
	else
		remember(HAMI_KIND_MEMORY, *dptr, bytes, sdev, 0);
	return rc;
}

HAMI_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	HAMI_IN_DRIVER();
	return charged_alloc(dptr, bytesize, "cuMemAlloc", HAMI_REAL(alloc_fn, "cuMemAlloc_v2"), NULL, 0);
}

HAMI_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	HAMI_IN_DRIVER();
	return charged_alloc(dptr, bytesize, "cuMemAllocManaged", NULL,
			     HAMI_REAL(managed_fn, "cuMemAllocManaged"), flags);
}

/* The pitch is only known afterwards: reserve a likely size, then settle. */
HAMI_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
					unsigned int elementSize)
{
	HAMI_IN_DRIVER();
	pitch_fn fn = HAMI_REAL(pitch_fn, "cuMemAllocPitch_v2");
	if (!dptr || !pitch)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int sdev;
	CUresult rc = governed_device(&sdev, NULL);
	if (rc != CUDA_SUCCESS)
		return rc;
	uint64_t row, guess;
	if (hami_round_up(width, 512, &row) < 0 || hami_mul(row, height, &guess) < 0)
		guess = UINT64_MAX; /* no GPU holds it: the charge refuses it */
	if (sdev >= 0 && guess && (rc = hami_charge(sdev, guess, "cuMemAllocPitch")) != CUDA_SUCCESS)
		return rc;
	HAMI_TAKE(rc, sdev, guess, "cuMemAllocPitch", hami_vm_alloc_pitch(dptr, pitch, width, height, elementSize, fn));
	if (sdev < 0 || !guess)
		return rc;
	if (rc != CUDA_SUCCESS) {
		hami_credit(sdev, guess);
		return rc;
	}
	uint64_t actual;
	if (hami_mul(*pitch, height, &actual) < 0 ||
	    (actual > guess && hami_charge(sdev, actual - guess, "cuMemAllocPitch") != CUDA_SUCCESS)) {
		hami_vm_free(*dptr, HAMI_REAL(free_fn, "cuMemFree_v2"));
		hami_credit(sdev, guess);
		*dptr = 0;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (actual < guess)
		hami_credit(sdev, guess - actual);
	remember(HAMI_KIND_MEMORY, *dptr, actual, sdev, 0);
	return CUDA_SUCCESS;
}

HAMI_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	HAMI_IN_DRIVER();
	free_fn fn = HAMI_REAL(free_fn, "cuMemFree_v2");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_MEMORY, dptr, &r) == 0;
	CUresult rc = hami_vm_free(dptr, fn);
	hami_settle_free(known, &r, rc);
	return rc;
}

/* ---- stream-ordered pools ------------------------------------------------ */

/*
 * A pool keeps freed memory for reuse, so what the device really gives up is
 * the pool's reserved size, not the sum of live allocations. The slice is
 * charged that reserved size, followed at every pool call.
 */
pthread_mutex_t hami_pool_lock = PTHREAD_MUTEX_INITIALIZER;
#define pool_lock hami_pool_lock

/* A pool attribute. In the relaxed capture mode: a program capturing a graph
 * in the global mode on another thread must not lose its capture to us. */
static int pool_attr(CUmemoryPool pool, CUmemPool_attribute a, uint64_t *v)
{
	pool_attr_fn fn = HAMI_REAL(pool_attr_fn, "cuMemPoolGetAttribute");
	cuuint64_t x = 0;
	if (!fn)
		return -1;
	int mode = hami_capture_relaxed_begin();
	CUresult rc = fn(pool, a, &x);
	hami_capture_relaxed_end(mode);
	if (rc != CUDA_SUCCESS)
		return -1;
	*v = x;
	return 0;
}

/*
 * Bring the pool's charge to its reserved bytes now. `held` bytes were
 * already reserved for this growth by the caller; they are converted, not
 * added, so the slice never has a moment with room that is not really there.
 */
static void pool_settle(CUmemoryPool pool, int sdev, uint64_t held)
{
	pthread_mutex_lock(&pool_lock);
	struct hami_record r = { .key = (uint64_t)(uintptr_t)pool, .sdev = sdev, .kind = HAMI_KIND_POOL };
	hami_record_get(HAMI_KIND_POOL, r.key, &r);
	uint64_t reserved, charged = r.bytes + held;
	if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0)
		reserved = r.bytes;
	if (reserved > charged)
		hami_charge_force(r.sdev, reserved - charged);
	else if (charged > reserved)
		hami_credit(r.sdev, charged - reserved);
	r.bytes = reserved;
	hami_record_put(&r);
	pthread_mutex_unlock(&pool_lock);
}

static int pool_device(CUmemoryPool pool, int fallback)
{
	struct hami_record r;
	if (hami_record_get(HAMI_KIND_POOL, (uint64_t)(uintptr_t)pool, &r) == 0)
		return r.sdev;
	return fallback;
}

static CUresult pooled_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream,
			     int per_thread, async_fn fn, pool_async_fn from_pool, const char *what)
{
	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn && !from_pool)
		return CUDA_ERROR_NOT_FOUND;
	int sdev, ordinal = -1;
	CUresult rc = governed_device(&sdev, &ordinal);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (sdev >= 0 && hami_stream_capturing(stream, per_thread)) {
		/* A graph memory node: nothing is allocated now; charged when the graph runs. */
		hami_graph_memory_seen();
		sdev = -1;
	}
	if (sdev < 0)
		return from_pool ? from_pool(dptr, bytes, pool, stream) : fn(dptr, bytes, stream);
	if (!pool) {
		device_pool_fn current = HAMI_REAL(device_pool_fn, "cuDeviceGetMemPool");
		if (!current || current(&pool, ordinal) != CUDA_SUCCESS)
			pool = NULL;
	}
	CUmemoryPool tracked = pool;
	sdev = pool ? pool_device(pool, sdev) : sdev;
	uint64_t reserved, in_use, need = bytes;
	if (pool && pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0 &&
	    pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &in_use) == 0) {
		uint64_t spare = reserved > in_use ? reserved - in_use : 0;
		if (bytes <= spare)
			need = 0;
		else if (hami_round_up(bytes - spare, POOL_GRANULE, &need) < 0)
			need = UINT64_MAX; /* refused by the charge */
	} else {
		tracked = NULL; /* no pool figures: charge each allocation instead */
	}
	if (need && (rc = hami_charge(sdev, need, what)) != CUDA_SUCCESS)
		return rc;
	/* Only growth the slice reserved waits for room: a refusal with spare in
	 * the pool is the driver's own business. */
	HAMI_TAKE(rc, sdev, need, what, from_pool ? from_pool(dptr, bytes, pool, stream) : fn(dptr, bytes, stream));
	if (!tracked) {
		if (rc != CUDA_SUCCESS)
			hami_credit(sdev, need);
		else
			remember(HAMI_KIND_MEMORY, *dptr, need, sdev, 0);
		return rc;
	}
	if (rc == CUDA_SUCCESS)
		remember(HAMI_KIND_POOLED, *dptr, bytes, sdev, (uint64_t)(uintptr_t)tracked);
	pool_settle(tracked, sdev, need);
	return rc;
}

HAMI_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
	HAMI_IN_DRIVER();
	return pooled_alloc(dptr, bytesize, NULL, stream, 0, HAMI_REAL(async_fn, "cuMemAllocAsync"), NULL,
			    "cuMemAllocAsync");
}

HAMI_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
	HAMI_IN_DRIVER();
	return pooled_alloc(dptr, bytesize, NULL, stream, 1, HAMI_REAL(async_fn, "cuMemAllocAsync_ptsz"),
			    NULL, "cuMemAllocAsync");
}

HAMI_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					     CUstream stream)
{
	HAMI_IN_DRIVER();
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	return pooled_alloc(dptr, bytesize, pool, stream, 0, NULL,
			    HAMI_REAL(pool_async_fn, "cuMemAllocFromPoolAsync"), "cuMemAllocFromPoolAsync");
}

HAMI_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						  CUstream stream)
{
	HAMI_IN_DRIVER();
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	return pooled_alloc(dptr, bytesize, pool, stream, 1, NULL,
			    HAMI_REAL(pool_async_fn, "cuMemAllocFromPoolAsync_ptsz"), "cuMemAllocFromPoolAsync");
}

/*
 * Captured into a graph (a free node), the memory goes back when the graph
 * runs; it is counted as freed now: a pooled block simply leaves the pool's
 * charge to be settled at the pool's next call, a plain one is credited.
 */
static CUresult free_async(CUdeviceptr dptr, CUstream stream, int per_thread, free_async_fn fn)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	if (hami_record_take(HAMI_KIND_POOLED, dptr, &r) == 0) {
		int captured = hami_stream_capturing(stream, per_thread);
		CUresult rc = fn(dptr, stream);
		if (rc != CUDA_SUCCESS)
			hami_record_put(&r);
		else if (!captured)
			pool_settle((CUmemoryPool)(uintptr_t)r.pool, r.sdev, 0);
		return rc;
	}
	/* cuMemFreeAsync may also free memory from cuMemAlloc. */
	int known = hami_record_take(HAMI_KIND_MEMORY, dptr, &r) == 0;
	CUresult rc = hami_vm_free_async(dptr, stream, per_thread, fn);
	hami_settle_free(known, &r, rc);
	return rc;
}

HAMI_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	HAMI_IN_DRIVER();
	return free_async(dptr, stream, 0, HAMI_REAL(free_async_fn, "cuMemFreeAsync"));
}

HAMI_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
	HAMI_IN_DRIVER();
	return free_async(dptr, stream, 1, HAMI_REAL(free_async_fn, "cuMemFreeAsync_ptsz"));
}

/* CUmemPoolProps starts like CUmemAllocationProp: type, handle types, location. */
struct pool_props_head {
	int allocType;
	int handleTypes;
	CUmemLocation location;
};

HAMI_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props)
{
	HAMI_IN_DRIVER();
	pool_create_fn fn = HAMI_REAL(pool_create_fn, "cuMemPoolCreate");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(pool, props);
	if (rc != CUDA_SUCCESS || !pool || !props || hami_setup() != CUDA_SUCCESS)
		return rc;
	const struct pool_props_head *p = props;
	if (p->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
		int sdev = hami_ordinal_device(p->location.id);
		if (sdev >= 0)
			remember(HAMI_KIND_POOL, (uint64_t)(uintptr_t)*pool, 0, sdev, 0);
	}
	return rc;
}

HAMI_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	HAMI_IN_DRIVER();
	pool_destroy_fn fn = HAMI_REAL(pool_destroy_fn, "cuMemPoolDestroy");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(pool);
	struct hami_record r;
	if (rc == CUDA_SUCCESS && hami_record_take(HAMI_KIND_POOL, (uint64_t)(uintptr_t)pool, &r) == 0)
		hami_credit(r.sdev, r.bytes);
	return rc;
}

HAMI_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	HAMI_IN_DRIVER();
	pool_trim_fn fn = HAMI_REAL(pool_trim_fn, "cuMemPoolTrimTo");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(pool, minBytesToKeep);
	struct hami_record r;
	if (rc == CUDA_SUCCESS && hami_record_get(HAMI_KIND_POOL, (uint64_t)(uintptr_t)pool, &r) == 0)
		pool_settle(pool, r.sdev, 0);
	return rc;
}

/* ---- virtual memory handles ---------------------------------------------- */

HAMI_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				 const CUmemAllocationProp *prop, unsigned long long flags)
{
	HAMI_IN_DRIVER();
	mem_create_fn fn = HAMI_REAL(mem_create_fn, "cuMemCreate");
	if (!handle || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int sdev = -1;
	if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
		int s = hami_setup();
		if (s > 0)
			return (CUresult)s;
		if (s == CUDA_SUCCESS)
			sdev = hami_ordinal_device(prop->location.id);
	}
	CUresult rc;
	if (sdev >= 0 && size && (rc = hami_charge(sdev, size, "cuMemCreate")) != CUDA_SUCCESS)
		return rc;
	HAMI_TAKE(rc, sdev, size, "cuMemCreate", fn(handle, size, prop, flags));
	if (sdev < 0 || !size)
		return rc;
	if (rc != CUDA_SUCCESS)
		hami_credit(sdev, size);
	else
		remember(HAMI_KIND_HANDLE, *handle, size, sdev, 0);
	return rc;
}

HAMI_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	HAMI_IN_DRIVER();
	mem_release_fn fn = HAMI_REAL(mem_release_fn, "cuMemRelease");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_HANDLE, handle, &r) == 0;
	CUresult rc = fn(handle);
	hami_settle_free(known, &r, rc);
	return rc;
}

/* ---- arrays ----------------------------------------------------------------- */

static uint64_t element_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	default:
		return 4; /* 32-bit formats; compressed and video formats are no larger */
	}
}

/* Estimate: rows padded to 512 bytes, like pitched memory. docs/slice-file.md.
 * UINT64_MAX when it does not fit in 64 bits: the charge refuses that. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
	uint64_t texel, row, plane, all;
	if (hami_mul(element_bytes(f), ch ? ch : 1, &texel) < 0 || hami_mul(w, texel, &row) < 0 ||
	    hami_round_up(row, 512, &row) < 0 || hami_mul(row, h ? h : 1, &plane) < 0 ||
	    hami_mul(plane, d ? d : 1, &all) < 0)
		return UINT64_MAX;
	return all;
}

static CUresult charged_array(void *out, uint64_t bytes, const char *what, uint32_t kind,
			      CUresult (*create)(void *, const void *, unsigned), const void *desc,
			      unsigned levels)
{
	int sdev;
	CUresult rc = governed_device(&sdev, NULL);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (sdev >= 0 && (rc = hami_charge(sdev, bytes, what)) != CUDA_SUCCESS)
		return rc;
	HAMI_TAKE(rc, sdev, bytes, what, create(out, desc, levels));
	if (sdev < 0)
		return rc;
	if (rc != CUDA_SUCCESS)
		hami_credit(sdev, bytes);
	else
		remember(kind, (uint64_t)(uintptr_t)*(void **)out, bytes, sdev, 0);
	return rc;
}

static CUresult create_array(void *out, const void *desc, unsigned levels)
{
	array_fn fn = HAMI_REAL(array_fn, "cuArrayCreate_v2");
	return fn ? fn(out, desc) : CUDA_ERROR_NOT_FOUND;
}

static CUresult create_array3d(void *out, const void *desc, unsigned levels)
{
	array3d_fn fn = HAMI_REAL(array3d_fn, "cuArray3DCreate_v2");
	return fn ? fn(out, desc) : CUDA_ERROR_NOT_FOUND;
}

static CUresult create_mipmap(void *out, const void *desc, unsigned levels)
{
	mipmap_fn fn = HAMI_REAL(mipmap_fn, "cuMipmappedArrayCreate");
	return fn ? fn(out, desc, levels) : CUDA_ERROR_NOT_FOUND;
}

HAMI_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	HAMI_IN_DRIVER();
	if (!array || !desc)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
	return charged_array(array, bytes, "cuArrayCreate", HAMI_KIND_ARRAY, create_array, desc, 0);
}

HAMI_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	HAMI_IN_DRIVER();
	if (!array || !desc)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
	return charged_array(array, bytes, "cuArray3DCreate", HAMI_KIND_ARRAY, create_array3d, desc, 0);
}

HAMI_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
					    unsigned int levels)
{
	HAMI_IN_DRIVER();
	if (!array || !desc)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t bytes = 0;
	size_t w = desc->Width, h = desc->Height, d = desc->Depth;
	for (unsigned i = 0; i < (levels ? levels : 1) && i < 64; i++) {
		if (hami_add(bytes, array_bytes(w, h, d, desc->Format, desc->NumChannels), &bytes) < 0)
			bytes = UINT64_MAX;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		d = d > 1 ? d / 2 : d;
	}
	return charged_array(array, bytes, "cuMipmappedArrayCreate", HAMI_KIND_MIPMAP, create_mipmap, desc,
			     levels);
}

static CUresult destroy_charged(uint32_t kind, void *handle, CUresult (*destroy)(void *))
{
	struct hami_record r;
	int known = hami_record_take(kind, (uint64_t)(uintptr_t)handle, &r) == 0;
	CUresult rc = destroy(handle);
	hami_settle_free(known, &r, rc);
	return rc;
}

static CUresult destroy_array(void *a)
{
	array_destroy_fn fn = HAMI_REAL(array_destroy_fn, "cuArrayDestroy");
	return fn ? fn(a) : CUDA_ERROR_NOT_FOUND;
}

static CUresult destroy_mipmap(void *a)
{
	mipmap_destroy_fn fn = HAMI_REAL(mipmap_destroy_fn, "cuMipmappedArrayDestroy");
	return fn ? fn(a) : CUDA_ERROR_NOT_FOUND;
}

HAMI_EXPORT CUresult cuArrayDestroy(CUarray array)
{
	HAMI_IN_DRIVER();
	return destroy_charged(HAMI_KIND_ARRAY, array, destroy_array);
}

HAMI_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
	HAMI_IN_DRIVER();
	return destroy_charged(HAMI_KIND_MIPMAP, array, destroy_mipmap);
}
