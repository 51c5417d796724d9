/*
 * Calls in which the driver takes device memory by itself, for nothing the
 * program allocated (docs/preload.md, "When the GPU is full"): loading a
 * module's or a library's code (at the load under CUDA_MODULE_LOADING=EAGER;
 * lazily, when a kernel of it is first looked up or launched), a new stream
 * or event (their pools), a raised context limit (stack, heap, printf FIFO).
 * None of them is charged here (the true-up counts what they took). Each is
 * hooked for one thing: on a full GPU the driver refuses it with
 * CUDA_ERROR_OUT_OF_MEMORY, having done nothing, so the hook waits for the
 * memory broker to make room (driver_room.c) and calls it again, as a refused
 * allocation does. Refused as "busy" while another process's GPU state moves
 * (an H200 refused PyTorch's stream creation so during a park), it waits for
 * the move (gpu_busy.c) and calls it again. Launches and graph uploads do the
 * same in their own hooks.
 *
 * Each is the driver's own prototype, forwarded as it is.
 */
#include "hami.h"

typedef int CUjit_option;     /* enums: only passed on */
typedef int CUlibraryOption;
typedef int CUlimit;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;

#define DRIVER_OWN(name, params, args, what)                                                     \
	HAMI_EXPORT CUresult name params;                                                        \
	HAMI_EXPORT CUresult name params                                                         \
	{                                                                                        \
		typedef CUresult(*real_fn) params;                                               \
		HAMI_IN_DRIVER();                                                                \
		real_fn fn = HAMI_REAL(real_fn, #name);                                          \
		if (!fn)                                                                         \
			return CUDA_ERROR_NOT_FOUND;                                             \
		CUresult rc = fn args;                                                           \
		if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) {     \
			struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;                       \
			while (hami_driver_room_again(&d, rc, -1, 0, what))                      \
				rc = fn args;                                                    \
			hami_driver_room_end(&d);                                                \
		}                                                                                \
		return rc;                                                                       \
	}

#define LOADING "loading a module's code"

/* modules (per context) */
DRIVER_OWN(cuModuleLoad, (CUmodule *m, const char *path), (m, path), LOADING)
DRIVER_OWN(cuModuleLoadData, (CUmodule *m, const void *image), (m, image), LOADING)
DRIVER_OWN(cuModuleLoadDataEx, (CUmodule *m, const void *image, unsigned int n, CUjit_option *opts, void **vals),
	   (m, image, n, opts, vals), LOADING)
DRIVER_OWN(cuModuleLoadFatBinary, (CUmodule *m, const void *fatbin), (m, fatbin), LOADING)
DRIVER_OWN(cuModuleGetFunction, (CUfunction *f, CUmodule m, const char *kname), (f, m, kname), LOADING)
DRIVER_OWN(cuModuleGetGlobal_v2, (CUdeviceptr *p, size_t *bytes, CUmodule m, const char *gname),
	   (p, bytes, m, gname), LOADING)

/* libraries (context-independent: loaded into a context when first needed there) */
DRIVER_OWN(cuLibraryLoadData,
	   (CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned int nj, CUlibraryOption *lo,
	    void **lv, unsigned int nl),
	   (l, code, jo, jv, nj, lo, lv, nl), LOADING)
DRIVER_OWN(cuLibraryLoadFromFile,
	   (CUlibrary *l, const char *path, CUjit_option *jo, void **jv, unsigned int nj, CUlibraryOption *lo,
	    void **lv, unsigned int nl),
	   (l, path, jo, jv, nj, lo, lv, nl), LOADING)
DRIVER_OWN(cuLibraryGetKernel, (CUkernel *k, CUlibrary l, const char *kname), (k, l, kname), LOADING)
DRIVER_OWN(cuLibraryGetModule, (CUmodule *m, CUlibrary l), (m, l), LOADING)
DRIVER_OWN(cuLibraryGetGlobal, (CUdeviceptr *p, size_t *bytes, CUlibrary l, const char *gname),
	   (p, bytes, l, gname), LOADING)
DRIVER_OWN(cuKernelGetFunction, (CUfunction *f, CUkernel k), (f, k), LOADING)

/* streams, events, limits */
DRIVER_OWN(cuStreamCreate, (CUstream *s, unsigned int flags), (s, flags), "a new stream")
DRIVER_OWN(cuStreamCreateWithPriority, (CUstream *s, unsigned int flags, int priority), (s, flags, priority),
	   "a new stream")
DRIVER_OWN(cuEventCreate, (CUevent *e, unsigned int flags), (e, flags), "a new event")
DRIVER_OWN(cuCtxSetLimit, (CUlimit limit, size_t value), (limit, value), "a raised context limit")

/* For hooks.c: these names, looked up by dlsym and cuGetProcAddress like the others. */
#define OWN(name) { #name, (void *)name }
const struct hami_hook hami_driver_memory_hooks[] = {
	OWN(cuModuleLoad),
	OWN(cuModuleLoadData),
	OWN(cuModuleLoadDataEx),
	OWN(cuModuleLoadFatBinary),
	OWN(cuModuleGetFunction),
	OWN(cuModuleGetGlobal_v2),
	OWN(cuLibraryLoadData),
	OWN(cuLibraryLoadFromFile),
	OWN(cuLibraryGetKernel),
	OWN(cuLibraryGetModule),
	OWN(cuLibraryGetGlobal),
	OWN(cuKernelGetFunction),
	OWN(cuStreamCreate),
	OWN(cuStreamCreateWithPriority),
	OWN(cuEventCreate),
	OWN(cuCtxSetLimit),
};
const size_t hami_driver_memory_hook_count = sizeof(hami_driver_memory_hooks) / sizeof(hami_driver_memory_hooks[0]);
