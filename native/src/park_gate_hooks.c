/*
 * Calls that only pass the parking gate (docs/parking.md). They charge
 * nothing; they are hooked because they are what a program waits in after a
 * quiet spell (a copy back to the host, a synchronize, an event query), and
 * in a parked process the driver would block them silently: through the gate
 * they ask for the GPU state back first.
 *
 * Each is the driver's own prototype, forwarded as it is. A version of these
 * names that is not listed here passes through cuGetProcAddress unhooked
 * (hooks.c): it still works, it only waits for the next hooked call to ask.
 */
#include "hami.h"

#define GATED(name, params, args)                                   \
	HAMI_EXPORT CUresult name params;                           \
	HAMI_EXPORT CUresult name params                            \
	{                                                           \
		typedef CUresult(*real_fn) params;                  \
		HAMI_IN_DRIVER();                                   \
		real_fn fn = HAMI_REAL(real_fn, #name);             \
		return fn ? fn args : CUDA_ERROR_NOT_FOUND;         \
	}

typedef CUdeviceptr dptr;
typedef const void *copy_params; /* CUDA_MEMCPY2D / CUDA_MEMCPY3D: only passed on */

/* copies */
GATED(cuMemcpy, (dptr d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpy_ptds, (dptr d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpyAsync, (dptr d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyAsync_ptsz, (dptr d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyPeer, (dptr d, CUcontext dc, dptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))
GATED(cuMemcpyPeer_ptds, (dptr d, CUcontext dc, dptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))
GATED(cuMemcpyPeerAsync, (dptr d, CUcontext dc, dptr s, CUcontext sc, size_t n, CUstream st),
      (d, dc, s, sc, n, st))
GATED(cuMemcpyPeerAsync_ptsz, (dptr d, CUcontext dc, dptr s, CUcontext sc, size_t n, CUstream st),
      (d, dc, s, sc, n, st))
GATED(cuMemcpyHtoD_v2, (dptr d, const void *s, size_t n), (d, s, n))
GATED(cuMemcpyHtoD_v2_ptds, (dptr d, const void *s, size_t n), (d, s, n))
GATED(cuMemcpyDtoH_v2, (void *d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpyDtoH_v2_ptds, (void *d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpyDtoD_v2, (dptr d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpyDtoD_v2_ptds, (dptr d, dptr s, size_t n), (d, s, n))
GATED(cuMemcpyHtoDAsync_v2, (dptr d, const void *s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyHtoDAsync_v2_ptsz, (dptr d, const void *s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoHAsync_v2, (void *d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoHAsync_v2_ptsz, (void *d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoDAsync_v2, (dptr d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpyDtoDAsync_v2_ptsz, (dptr d, dptr s, size_t n, CUstream st), (d, s, n, st))
GATED(cuMemcpy2D_v2, (copy_params p), (p))
GATED(cuMemcpy2D_v2_ptds, (copy_params p), (p))
GATED(cuMemcpy2DUnaligned_v2, (copy_params p), (p))
GATED(cuMemcpy2DUnaligned_v2_ptds, (copy_params p), (p))
GATED(cuMemcpy2DAsync_v2, (copy_params p, CUstream st), (p, st))
GATED(cuMemcpy2DAsync_v2_ptsz, (copy_params p, CUstream st), (p, st))
GATED(cuMemcpy3D_v2, (copy_params p), (p))
GATED(cuMemcpy3D_v2_ptds, (copy_params p), (p))
GATED(cuMemcpy3DAsync_v2, (copy_params p, CUstream st), (p, st))
GATED(cuMemcpy3DAsync_v2_ptsz, (copy_params p, CUstream st), (p, st))

/* sets */
GATED(cuMemsetD8_v2, (dptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD8_v2_ptds, (dptr d, unsigned char v, size_t n), (d, v, n))
GATED(cuMemsetD16_v2, (dptr d, unsigned short v, size_t n), (d, v, n))
GATED(cuMemsetD16_v2_ptds, (dptr d, unsigned short v, size_t n), (d, v, n))
GATED(cuMemsetD32_v2, (dptr d, unsigned int v, size_t n), (d, v, n))
GATED(cuMemsetD32_v2_ptds, (dptr d, unsigned int v, size_t n), (d, v, n))
GATED(cuMemsetD8Async, (dptr d, unsigned char v, size_t n, CUstream st), (d, v, n, st))
GATED(cuMemsetD8Async_ptsz, (dptr d, unsigned char v, size_t n, CUstream st), (d, v, n, st))
GATED(cuMemsetD16Async, (dptr d, unsigned short v, size_t n, CUstream st), (d, v, n, st))
GATED(cuMemsetD16Async_ptsz, (dptr d, unsigned short v, size_t n, CUstream st), (d, v, n, st))
GATED(cuMemsetD32Async, (dptr d, unsigned int v, size_t n, CUstream st), (d, v, n, st))
GATED(cuMemsetD32Async_ptsz, (dptr d, unsigned int v, size_t n, CUstream st), (d, v, n, st))

/* 2D sets and stream memory operations: they touch device memory too, which a
 * process that parked itself has released until its resume */
GATED(cuMemsetD2D8_v2, (dptr d, size_t p, unsigned char v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuMemsetD2D8_v2_ptds, (dptr d, size_t p, unsigned char v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuMemsetD2D16_v2, (dptr d, size_t p, unsigned short v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuMemsetD2D16_v2_ptds, (dptr d, size_t p, unsigned short v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuMemsetD2D32_v2, (dptr d, size_t p, unsigned int v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuMemsetD2D32_v2_ptds, (dptr d, size_t p, unsigned int v, size_t w, size_t h), (d, p, v, w, h))
GATED(cuStreamWaitValue32, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWaitValue32_ptsz, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWaitValue32_v2, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWaitValue32_v2_ptsz, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWriteValue32, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWriteValue32_ptsz, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWriteValue32_v2, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))
GATED(cuStreamWriteValue32_v2_ptsz, (CUstream st, dptr a, cuuint32_t v, unsigned int f), (st, a, v, f))

/* waiting */
GATED(cuCtxSynchronize, (void), ())
GATED(cuStreamSynchronize, (CUstream st), (st))
GATED(cuStreamSynchronize_ptsz, (CUstream st), (st))
GATED(cuStreamQuery, (CUstream st), (st))
GATED(cuStreamQuery_ptsz, (CUstream st), (st))
GATED(cuStreamWaitEvent, (CUstream st, CUevent e, unsigned int f), (st, e, f))
GATED(cuStreamWaitEvent_ptsz, (CUstream st, CUevent e, unsigned int f), (st, e, f))
GATED(cuEventRecord, (CUevent e, CUstream st), (e, st))
GATED(cuEventRecord_ptsz, (CUevent e, CUstream st), (e, st))
GATED(cuEventRecordWithFlags, (CUevent e, CUstream st, unsigned int f), (e, st, f))
GATED(cuEventRecordWithFlags_ptsz, (CUevent e, CUstream st, unsigned int f), (e, st, f))
GATED(cuEventQuery, (CUevent e), (e))
GATED(cuEventSynchronize, (CUevent e), (e))

/* For hooks.c: these names, looked up by dlsym and cuGetProcAddress like the others. */
#define GATE(name) { #name, (void *)name }
const struct hami_hook hami_gate_hooks[] = {
	GATE(cuMemcpy),
	GATE(cuMemcpy_ptds),
	GATE(cuMemcpyAsync),
	GATE(cuMemcpyAsync_ptsz),
	GATE(cuMemcpyPeer),
	GATE(cuMemcpyPeer_ptds),
	GATE(cuMemcpyPeerAsync),
	GATE(cuMemcpyPeerAsync_ptsz),
	GATE(cuMemcpyHtoD_v2),
	GATE(cuMemcpyHtoD_v2_ptds),
	GATE(cuMemcpyDtoH_v2),
	GATE(cuMemcpyDtoH_v2_ptds),
	GATE(cuMemcpyDtoD_v2),
	GATE(cuMemcpyDtoD_v2_ptds),
	GATE(cuMemcpyHtoDAsync_v2),
	GATE(cuMemcpyHtoDAsync_v2_ptsz),
	GATE(cuMemcpyDtoHAsync_v2),
	GATE(cuMemcpyDtoHAsync_v2_ptsz),
	GATE(cuMemcpyDtoDAsync_v2),
	GATE(cuMemcpyDtoDAsync_v2_ptsz),
	GATE(cuMemcpy2D_v2),
	GATE(cuMemcpy2D_v2_ptds),
	GATE(cuMemcpy2DUnaligned_v2),
	GATE(cuMemcpy2DUnaligned_v2_ptds),
	GATE(cuMemcpy2DAsync_v2),
	GATE(cuMemcpy2DAsync_v2_ptsz),
	GATE(cuMemcpy3D_v2),
	GATE(cuMemcpy3D_v2_ptds),
	GATE(cuMemcpy3DAsync_v2),
	GATE(cuMemcpy3DAsync_v2_ptsz),
	GATE(cuMemsetD8_v2),
	GATE(cuMemsetD8_v2_ptds),
	GATE(cuMemsetD16_v2),
	GATE(cuMemsetD16_v2_ptds),
	GATE(cuMemsetD32_v2),
	GATE(cuMemsetD32_v2_ptds),
	GATE(cuMemsetD8Async),
	GATE(cuMemsetD8Async_ptsz),
	GATE(cuMemsetD16Async),
	GATE(cuMemsetD16Async_ptsz),
	GATE(cuMemsetD32Async),
	GATE(cuMemsetD32Async_ptsz),
	GATE(cuMemsetD2D8_v2),
	GATE(cuMemsetD2D8_v2_ptds),
	GATE(cuMemsetD2D16_v2),
	GATE(cuMemsetD2D16_v2_ptds),
	GATE(cuMemsetD2D32_v2),
	GATE(cuMemsetD2D32_v2_ptds),
	GATE(cuStreamWaitValue32),
	GATE(cuStreamWaitValue32_ptsz),
	GATE(cuStreamWaitValue32_v2),
	GATE(cuStreamWaitValue32_v2_ptsz),
	GATE(cuStreamWriteValue32),
	GATE(cuStreamWriteValue32_ptsz),
	GATE(cuStreamWriteValue32_v2),
	GATE(cuStreamWriteValue32_v2_ptsz),
	GATE(cuCtxSynchronize),
	GATE(cuStreamSynchronize),
	GATE(cuStreamSynchronize_ptsz),
	GATE(cuStreamQuery),
	GATE(cuStreamQuery_ptsz),
	GATE(cuStreamWaitEvent),
	GATE(cuStreamWaitEvent_ptsz),
	GATE(cuEventRecord),
	GATE(cuEventRecord_ptsz),
	GATE(cuEventRecordWithFlags),
	GATE(cuEventRecordWithFlags_ptsz),
	GATE(cuEventQuery),
	GATE(cuEventSynchronize),
};
const size_t hami_gate_hook_count = sizeof(hami_gate_hooks) / sizeof(hami_gate_hooks[0]);
