/*
 * Allocations backed so that the process can park itself (HAMI_FAST_PARK=1,
 * docs/parking.md "The fast park"). Instead of the driver's cuMemAlloc, an
 * allocation the library serves is an address range reserved for it
 * (cuMemAddressReserve) with physical memory mapped in (cuMemCreate, cuMemMap,
 * cuMemSetAccess). The program gets the range's start and never knows: a park
 * can later copy the bytes to host memory, unmap and release the physical
 * memory, and a resume map new memory at the very same addresses
 * (fast_park.c), while the reservation keeps the addresses the program's.
 *
 * A size that is not a multiple of the granularity takes the rounding too:
 * that is charged beside the hook's charge (and credited by the free), so
 * the slice's cap holds on what the GPU really gives; when it has no room for
 * it the allocation is made the old way.
 *
 * What is not backed this way goes to the driver as before, and stays on the
 * GPU while parked: allocations smaller than the granularity (2 MiB: the
 * rounding would cost more than the allocation), a device without the
 * virtual memory API, managed, pooled and stream-ordered memory, arrays. A
 * failure of any virtual memory call but out-of-memory falls back to the
 * driver's allocation too.
 *
 * The table of backed allocations is sorted by address under vm_lock, which
 * is never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hami.h"

#define PITCH_ALIGN 512ull /* what the driver's pitch allocations use, and texture binding accepts */
#define NOT_BACKED ((CUresult)-1) /* backed(): the driver's own allocation is to be used */
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*addr_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			      unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*gran_fn)(size_t *, const CUmemAllocationProp *, int);
typedef CUresult (*attr_fn)(int *, int, CUdevice);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*dev_get_fn)(CUdevice *);
typedef CUresult (*stream_sync_fn)(CUstream);

pthread_mutex_t hami_vm_lock = PTHREAD_MUTEX_INITIALIZER;
#define vm_lock hami_vm_lock

static struct hami_vm_block *blocks; /* sorted by base */
static size_t nblocks, cap_blocks;
static int disabled;                           /* a program's IPC export: the old way from then on */
static uint64_t granularity[HAMI_MAX_CUDA_DEVICES]; /* 0: not asked yet; UINT64_MAX: no VMM here */
static uint64_t peers[HAMI_MAX_CUDA_DEVICES];       /* ordinal -> mask of ordinals that may reach its memory */

int hami_vm_enabled(void)
{
	return hami_config()->fast_park && hami_gate_thunks_available() &&
	       !__atomic_load_n(&disabled, __ATOMIC_ACQUIRE);
}

void hami_vm_disable(void)
{
	__atomic_store_n(&disabled, 1, __ATOMIC_RELEASE);
}

/* ---- the table -------------------------------------------------------------- */

/* Index of the first block whose base is above p. vm_lock held. */
static size_t upper(CUdeviceptr p)
{
	size_t lo = 0, hi = nblocks;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (blocks[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int insert(const struct hami_vm_block *b)
{
	pthread_mutex_lock(&vm_lock);
	if (nblocks == cap_blocks) {
		size_t cap = cap_blocks ? cap_blocks * 2 : 256;
		struct hami_vm_block *n = realloc(blocks, cap * sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&vm_lock);
			return -1;
		}
		blocks = n;
		cap_blocks = cap;
	}
	size_t at = upper(b->base);
	memmove(&blocks[at + 1], &blocks[at], (nblocks - at) * sizeof(*blocks));
	blocks[at] = *b;
	nblocks++;
	pthread_mutex_unlock(&vm_lock);
	return 0;
}

int hami_vm_find(CUdeviceptr p, struct hami_vm_block *out)
{
	pthread_mutex_lock(&vm_lock);
	size_t at = upper(p);
	int found = at > 0 && p - blocks[at - 1].base < blocks[at - 1].span;
	if (found && out)
		*out = blocks[at - 1];
	pthread_mutex_unlock(&vm_lock);
	return found ? 0 : -1;
}

/* Take the block starting at base out of the table. */
static int take(CUdeviceptr base, struct hami_vm_block *out)
{
	pthread_mutex_lock(&vm_lock);
	size_t at = upper(base);
	int found = at > 0 && blocks[at - 1].base == base;
	if (found) {
		*out = blocks[at - 1];
		memmove(&blocks[at - 1], &blocks[at], (nblocks - at) * sizeof(*blocks));
		nblocks--;
	}
	pthread_mutex_unlock(&vm_lock);
	return found ? 0 : -1;
}

size_t hami_vm_snapshot(struct hami_vm_block **out)
{
	pthread_mutex_lock(&vm_lock);
	size_t n = nblocks;
	*out = n ? malloc(n * sizeof(**out)) : NULL;
	if (*out)
		memcpy(*out, blocks, n * sizeof(**out));
	else
		n = 0;
	pthread_mutex_unlock(&vm_lock);
	return n;
}

void hami_vm_update(const struct hami_vm_block *b)
{
	pthread_mutex_lock(&vm_lock);
	size_t at = upper(b->base);
	if (at > 0 && blocks[at - 1].base == b->base)
		blocks[at - 1] = *b;
	pthread_mutex_unlock(&vm_lock);
}

void hami_vm_after_fork(void)
{
	free(blocks);
	blocks = NULL;
	nblocks = cap_blocks = 0;
	memset(granularity, 0, sizeof(granularity));
	memset(peers, 0, sizeof(peers));
}

/* ---- backing one allocation ------------------------------------------------- */

static CUmemAllocationProp device_prop(int ordinal)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = ordinal;
	return prop;
}

/* The driver's minimum granularity on CUDA device ordinal, or UINT64_MAX when
 * the device has no virtual memory API (asked once per device). */
static uint64_t gran_of(int ordinal)
{
	if (ordinal < 0 || ordinal >= HAMI_MAX_CUDA_DEVICES)
		return UINT64_MAX;
	uint64_t g = __atomic_load_n(&granularity[ordinal], __ATOMIC_ACQUIRE);
	if (g)
		return g;
	gran_fn gran = HAMI_REAL(gran_fn, "cuMemGetAllocationGranularity");
	attr_fn attr = HAMI_REAL(attr_fn, "cuDeviceGetAttribute");
	int vmm = 0;
	size_t got = 0;
	CUmemAllocationProp prop = device_prop(ordinal);
	g = UINT64_MAX;
	if (gran && attr && attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ordinal) ==
				    CUDA_SUCCESS && vmm &&
	    gran(&got, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && got && !(got & (got - 1)))
		g = got;
	__atomic_store_n(&granularity[ordinal], g, __ATOMIC_RELEASE);
	return g;
}

/* Who may reach memory of ordinal: itself and the devices given peer access to it. */
static size_t access_list(int ordinal, CUmemAccessDesc *desc, size_t cap)
{
	uint64_t mask = __atomic_load_n(&peers[ordinal], __ATOMIC_ACQUIRE) | (1ull << ordinal);
	size_t n = 0;
	for (int d = 0; d < HAMI_MAX_CUDA_DEVICES && n < cap; d++) {
		if (!(mask & (1ull << d)))
			continue;
		desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		desc[n].location.id = d;
		desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		n++;
	}
	return n;
}

CUresult hami_vm_map(struct hami_vm_block *b)
{
	create_fn create = HAMI_REAL(create_fn, "cuMemCreate");
	map_fn map = HAMI_REAL(map_fn, "cuMemMap");
	access_fn access = HAMI_REAL(access_fn, "cuMemSetAccess");
	release_fn release = HAMI_REAL(release_fn, "cuMemRelease");
	unmap_fn unmap = HAMI_REAL(unmap_fn, "cuMemUnmap");
	if (!create || !map || !access || !release || !unmap)
		return CUDA_ERROR_NOT_FOUND;
	CUmemAllocationProp prop = device_prop(b->ordinal);
	CUmemAccessDesc desc[HAMI_MAX_CUDA_DEVICES];
	size_t n = access_list(b->ordinal, desc, HAMI_MAX_CUDA_DEVICES);
	CUmemGenericAllocationHandle h = 0;
	CUresult rc = create(&h, b->span, &prop, 0);
	if (rc != CUDA_SUCCESS)
		return rc;
	if ((rc = map(b->base, b->span, 0, h, 0)) != CUDA_SUCCESS) {
		release(h);
		return rc;
	}
	if ((rc = access(b->base, b->span, desc, n)) != CUDA_SUCCESS) {
		unmap(b->base, b->span);
		release(h);
		return rc;
	}
	b->handle = h;
	return CUDA_SUCCESS;
}

CUresult hami_vm_unmap(struct hami_vm_block *b)
{
	unmap_fn unmap = HAMI_REAL(unmap_fn, "cuMemUnmap");
	release_fn release = HAMI_REAL(release_fn, "cuMemRelease");
	if (!unmap || !release)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = unmap(b->base, b->span);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Unmapped, the handle is the last reference: its release frees the memory.
	 * Should it fail, the memory stays held by the handle, still released later. */
	rc = release(b->handle);
	b->handle = 0;
	return rc;
}

/*
 * bytes addressable bytes on the current context's device, backed as above:
 * CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY (the caller's wait for room tries
 * again), or NOT_BACKED.
 */
static CUresult backed(CUdeviceptr *dptr, uint64_t bytes)
{
	ctx_get_fn get_ctx = HAMI_REAL(ctx_get_fn, "cuCtxGetCurrent");
	dev_get_fn get_dev = HAMI_REAL(dev_get_fn, "cuCtxGetDevice");
	reserve_fn reserve = HAMI_REAL(reserve_fn, "cuMemAddressReserve");
	addr_free_fn addr_free = HAMI_REAL(addr_free_fn, "cuMemAddressFree");
	CUcontext ctx = NULL;
	CUdevice dev = -1;
	if (!get_ctx || !get_dev || !reserve || !addr_free || get_ctx(&ctx) != CUDA_SUCCESS || !ctx ||
	    get_dev(&dev) != CUDA_SUCCESS)
		return NOT_BACKED;
	uint64_t g = gran_of(dev), span;
	if (g == UINT64_MAX || bytes < g || hami_round_up(bytes, g, &span) < 0)
		return NOT_BACKED;
	struct hami_vm_block b = { .size = bytes, .span = span, .ctx = ctx, .ordinal = dev,
				   .sdev = hami_ordinal_device(dev) };
	/* The rounding is memory too: charged beside what the hook charged, or,
	 * when the slice has no room for it, the allocation is made the old way. */
	if (b.sdev >= 0 && span > bytes) {
		if (hami_charge(b.sdev, span - bytes, NULL) != CUDA_SUCCESS)
			return NOT_BACKED;
		b.extra = span - bytes;
	}
	CUresult rc = reserve(&b.base, span, 0, 0, 0) == CUDA_SUCCESS ? hami_vm_map(&b) : NOT_BACKED;
	if (rc == CUDA_SUCCESS && insert(&b) < 0) {
		hami_vm_unmap(&b);
		rc = NOT_BACKED;
	}
	if (rc != CUDA_SUCCESS) {
		if (b.base)
			addr_free(b.base, span);
		if (b.extra)
			hami_credit(b.sdev, b.extra);
		return rc == CUDA_ERROR_OUT_OF_MEMORY ? rc : NOT_BACKED;
	}
	*dptr = b.base;
	return CUDA_SUCCESS;
}

CUresult hami_vm_alloc(CUdeviceptr *dptr, size_t bytes, CUresult (*driver)(CUdeviceptr *, size_t))
{
	if (hami_vm_enabled() && dptr) {
		CUresult rc = backed(dptr, bytes);
		if (rc != NOT_BACKED)
			return rc;
	}
	return driver ? driver(dptr, bytes) : CUDA_ERROR_NOT_FOUND;
}

/* The pitch is the library's choice here: width rounded up to 512 bytes, as
 * the driver's own pitch allocations come and texture binding accepts. */
CUresult hami_vm_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem,
			     CUresult (*driver)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))
{
	uint64_t row, bytes;
	if (hami_vm_enabled() && dptr && pitch && width && height && (elem == 4 || elem == 8 || elem == 16) &&
	    hami_round_up(width, PITCH_ALIGN, &row) == 0 && hami_mul(row, height, &bytes) == 0) {
		CUresult rc = backed(dptr, bytes);
		if (rc == CUDA_SUCCESS)
			*pitch = row;
		if (rc != NOT_BACKED)
			return rc;
	}
	return driver ? driver(dptr, pitch, width, height, elem) : CUDA_ERROR_NOT_FOUND;
}

CUresult hami_vm_free(CUdeviceptr p, CUresult (*driver)(CUdeviceptr))
{
	struct hami_vm_block b;
	if (!p || take(p, &b) < 0)
		return driver ? driver(p) : CUDA_ERROR_NOT_FOUND;
	addr_free_fn addr_free = HAMI_REAL(addr_free_fn, "cuMemAddressFree");
	CUresult rc = hami_vm_unmap(&b);
	if (rc != CUDA_SUCCESS && b.handle) { /* still mapped: the program keeps its memory */
		insert(&b);
		return rc;
	}
	if (addr_free)
		addr_free(b.base, b.span);
	if (b.extra)
		hami_credit(b.sdev, b.extra);
	return CUDA_SUCCESS;
}

/* A stream-ordered free of backed memory: the stream's work first (it may
 * still use the memory), then at once. A free captured into a graph is the
 * driver's to answer (it refuses memory it did not allocate). */
CUresult hami_vm_free_async(CUdeviceptr p, CUstream stream, int per_thread,
			    CUresult (*driver)(CUdeviceptr, CUstream))
{
	if (!p || hami_vm_find(p, NULL) < 0 || hami_stream_capturing(stream, per_thread))
		return driver ? driver(p, stream) : CUDA_ERROR_NOT_FOUND;
	stream_sync_fn sync = HAMI_REAL(stream_sync_fn, per_thread ? "cuStreamSynchronize_ptsz" : "cuStreamSynchronize");
	CUresult rc = sync ? sync(stream) : CUDA_ERROR_NOT_FOUND;
	return rc == CUDA_SUCCESS ? hami_vm_free(p, NULL) : rc;
}

/* ---- peers ---------------------------------------------------------------------- */

/* Devices given access to ordinal's memory from now on, and every block of it
 * now (peer access reaches memory the virtual memory API mapped only through
 * cuMemSetAccess). A block that cannot be given it keeps what it had. */
void hami_vm_peer_added(int ordinal, int peer)
{
	if (ordinal < 0 || ordinal >= HAMI_MAX_CUDA_DEVICES || peer < 0 || peer >= HAMI_MAX_CUDA_DEVICES)
		return;
	__atomic_or_fetch(&peers[ordinal], 1ull << peer, __ATOMIC_ACQ_REL);
	access_fn access = HAMI_REAL(access_fn, "cuMemSetAccess");
	struct hami_vm_block *all;
	size_t n = hami_vm_snapshot(&all);
	for (size_t i = 0; access && i < n; i++) {
		if (all[i].ordinal != ordinal || !all[i].handle)
			continue;
		CUmemAccessDesc desc[HAMI_MAX_CUDA_DEVICES];
		size_t k = access_list(ordinal, desc, HAMI_MAX_CUDA_DEVICES);
		if (access(all[i].base, all[i].span, desc, k) != CUDA_SUCCESS)
			hami_log(HAMI_LOG_WARN, "peer access to memory of GPU %d could not be given to an allocation "
				 "of %llu bytes", ordinal, (unsigned long long)all[i].size);
	}
	free(all);
}
