/*
 * What a program asks about the memory the library backs for the fast park
 * (vm_backing.c), answered as for the driver's own allocation, so that it
 * cannot tell: the range of an address is the allocation as asked (not the
 * reservation rounded to the granularity), its context the one it was made
 * in. Peer access reaches backed memory only through cuMemSetAccess, which
 * the library adds. An IPC export, which the driver refuses for such memory,
 * is answered with the driver's refusal and a line saying why; the process's
 * later allocations are made the old way (docs/parking.md).
 *
 * These hooks guard no limit: an unknown version of them passes through
 * cuGetProcAddress unhooked (hooks.c), and they pass the parking gate.
 */
#include "hami.h"

typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*attr_fn)(void *, int, CUdeviceptr);
typedef CUresult (*attrs_fn)(unsigned int, int *, void **, CUdeviceptr);
typedef CUresult (*ipc_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*peer_fn)(CUcontext, unsigned int);
typedef CUresult (*ctx_push_fn)(CUcontext);
typedef CUresult (*ctx_pop_fn)(CUcontext *);
typedef CUresult (*ctx_dev_fn)(CUdevice *);

HAMI_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
HAMI_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
HAMI_EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data, CUdeviceptr ptr);
HAMI_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
HAMI_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);

/* One attribute of a backed block as the driver gives it for cuMemAlloc
 * memory; 0 when the driver's own answer stands. */
static int block_attribute(const struct hami_vm_block *b, int attribute, void *data)
{
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = b->base;
		return 1;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = b->size;
		return 1;
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = b->ctx;
		return 1;
	default:
		return 0;
	}
}

HAMI_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	HAMI_IN_DRIVER();
	range_fn fn = HAMI_REAL(range_fn, "cuMemGetAddressRange_v2");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(pbase, psize, dptr);
	struct hami_vm_block b;
	if (rc == CUDA_SUCCESS && hami_vm_find(dptr, &b) == 0 && dptr - b.base < b.size) {
		if (pbase)
			*pbase = b.base;
		if (psize)
			*psize = b.size;
	}
	return rc;
}

HAMI_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
	HAMI_IN_DRIVER();
	attr_fn fn = HAMI_REAL(attr_fn, "cuPointerGetAttribute");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(data, attribute, ptr);
	struct hami_vm_block b;
	if (rc == CUDA_SUCCESS && data && hami_vm_find(ptr, &b) == 0)
		block_attribute(&b, attribute, data);
	return rc;
}

HAMI_EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data, CUdeviceptr ptr)
{
	HAMI_IN_DRIVER();
	attrs_fn fn = HAMI_REAL(attrs_fn, "cuPointerGetAttributes");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(n, attributes, data, ptr);
	struct hami_vm_block b;
	if (rc != CUDA_SUCCESS || !attributes || !data || hami_vm_find(ptr, &b) < 0)
		return rc;
	for (unsigned i = 0; i < n; i++)
		if (data[i])
			block_attribute(&b, attributes[i], data[i]);
	return rc;
}

HAMI_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	HAMI_IN_DRIVER();
	ipc_fn fn = HAMI_REAL(ipc_fn, "cuIpcGetMemHandle");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(handle, dptr);
	if (rc != CUDA_SUCCESS && hami_vm_find(dptr, NULL) == 0) {
		static int told;
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			hami_log(HAMI_LOG_ERROR, "cuIpcGetMemHandle: this allocation was made for the fast park "
				 "(HAMI_FAST_PARK=1), which the driver cannot share with another process this way; this "
				 "process makes its later allocations the old way. To share this memory too, run the "
				 "kernel with HAMI_FAST_PARK=0");
		hami_vm_disable();
	}
	return rc;
}

/* The CUDA device of context ctx, or -1. */
static int device_of(CUcontext ctx)
{
	ctx_push_fn push = HAMI_REAL(ctx_push_fn, "cuCtxPushCurrent_v2");
	ctx_pop_fn pop = HAMI_REAL(ctx_pop_fn, "cuCtxPopCurrent_v2");
	ctx_dev_fn dev = HAMI_REAL(ctx_dev_fn, "cuCtxGetDevice");
	CUdevice d = -1;
	CUcontext popped;
	if (!push || !pop || !dev || push(ctx) != CUDA_SUCCESS)
		return -1;
	if (dev(&d) != CUDA_SUCCESS)
		d = -1;
	pop(&popped);
	return d;
}

/* The current context may reach peer's memory: backed memory of peer's
 * device needs this device's access set, now and in every later mapping. */
HAMI_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	HAMI_IN_DRIVER();
	peer_fn fn = HAMI_REAL(peer_fn, "cuCtxEnablePeerAccess");
	ctx_dev_fn dev = HAMI_REAL(ctx_dev_fn, "cuCtxGetDevice");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(peer, flags);
	CUdevice mine = -1;
	if (rc == CUDA_SUCCESS && dev && dev(&mine) == CUDA_SUCCESS)
		hami_vm_peer_added(device_of(peer), mine);
	return rc;
}

#define VM_HOOK(name) { #name, (void *)name }
const struct hami_hook hami_vm_hooks[] = {
	VM_HOOK(cuMemGetAddressRange_v2),
	VM_HOOK(cuPointerGetAttribute),
	VM_HOOK(cuPointerGetAttributes),
	VM_HOOK(cuIpcGetMemHandle),
	VM_HOOK(cuCtxEnablePeerAccess),
};
const size_t hami_vm_hook_count = sizeof(hami_vm_hooks) / sizeof(hami_vm_hooks[0]);
