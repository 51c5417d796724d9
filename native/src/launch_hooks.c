/*
 * Every way to put work on the GPU passes the SM-share gate: kernels one by
 * one, with extended attributes, cooperatively, and whole graphs, each also
 * in its per-thread-default-stream (_ptsz) form. With no share set anywhere
 * in this process the hook is one load of a process-local flag.
 *
 * A launch may need device memory the driver takes by itself: a kernel's
 * code, loaded lazily at its first launch, or more local memory. On a full
 * GPU the driver refuses it with CUDA_ERROR_OUT_OF_MEMORY and the kernel does
 * not start, so the launch waits for room (driver_room.c) and is made again.
 */
#include "hami.h"
#include "hook_api.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			      unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const void *, CUfunction, void **, void **);
typedef CUresult (*cooperative_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, CUstream, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

/* CUlaunchConfig begins with the grid, the block, shared memory, then the stream. */
struct launch_config_head {
	unsigned int grid[3];
	unsigned int block[3];
	unsigned int shared_mem;
	CUstream stream;
};


#define LAUNCH_NEEDS "a kernel launch (its code, loaded at its first launch, or its local memory)"

/* The launch was refused (for memory, or a busy GPU): whether to make it again. */
static int launch_again(CUresult rc, struct hami_driver_room *d, const char *what)
{
	return hami_driver_room_again(d, rc, -1, 0, what);
}

static inline int watching(void)
{
	return __atomic_load_n(&hami_sm_watch, __ATOMIC_RELAXED);
}

static CUresult launch(launch_fn fn, int per_thread, CUfunction f, unsigned int gx, unsigned int gy,
		       unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
		       CUstream stream, void **params, void **extra)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int watch = watching();
	if (watch)
		hami_sm_before_launch(stream, per_thread);
	CUresult rc = fn(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) { /* did not start: made again */
		struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;
		while (launch_again(rc, &d, LAUNCH_NEEDS))
			rc = fn(f, gx, gy, gz, bx, by, bz, shm, stream, params, extra);
		hami_driver_room_end(&d);
	}
	if (watch)
		hami_sm_after_launch(rc);
	return rc;
}

HAMI_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
				    CUstream stream, void **params, void **extra)
{
	HAMI_IN_DRIVER();
	return launch(HAMI_REAL(launch_fn, "cuLaunchKernel"), 0, f, gx, gy, gz, bx, by, bz, shm, stream,
		      params, extra);
}

HAMI_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
					 unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
					 CUstream stream, void **params, void **extra)
{
	HAMI_IN_DRIVER();
	return launch(HAMI_REAL(launch_fn, "cuLaunchKernel_ptsz"), 1, f, gx, gy, gz, bx, by, bz, shm,
		      stream, params, extra);
}

static CUresult launch_ex(launch_ex_fn fn, int per_thread, const void *config, CUfunction f, void **params,
			  void **extra)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int watch = watching() && config;
	if (watch)
		hami_sm_before_launch(((const struct launch_config_head *)config)->stream, per_thread);
	CUresult rc = fn(config, f, params, extra);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) { /* did not start: made again */
		struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;
		while (launch_again(rc, &d, LAUNCH_NEEDS))
			rc = fn(config, f, params, extra);
		hami_driver_room_end(&d);
	}
	if (watch)
		hami_sm_after_launch(rc);
	return rc;
}

HAMI_EXPORT CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra)
{
	HAMI_IN_DRIVER();
	return launch_ex(HAMI_REAL(launch_ex_fn, "cuLaunchKernelEx"), 0, config, f, params, extra);
}

HAMI_EXPORT CUresult cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **params, void **extra)
{
	HAMI_IN_DRIVER();
	return launch_ex(HAMI_REAL(launch_ex_fn, "cuLaunchKernelEx_ptsz"), 1, config, f, params, extra);
}

static CUresult cooperative(cooperative_fn fn, int per_thread, CUfunction f, unsigned int gx,
			    unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
			    unsigned int bz, unsigned int shm, CUstream stream, void **params)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	int watch = watching();
	if (watch)
		hami_sm_before_launch(stream, per_thread);
	CUresult rc = fn(f, gx, gy, gz, bx, by, bz, shm, stream, params);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) { /* did not start: made again */
		struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;
		while (launch_again(rc, &d, LAUNCH_NEEDS))
			rc = fn(f, gx, gy, gz, bx, by, bz, shm, stream, params);
		hami_driver_room_end(&d);
	}
	if (watch)
		hami_sm_after_launch(rc);
	return rc;
}

HAMI_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
					       unsigned int gz, unsigned int bx, unsigned int by,
					       unsigned int bz, unsigned int shm, CUstream stream,
					       void **params)
{
	HAMI_IN_DRIVER();
	return cooperative(HAMI_REAL(cooperative_fn, "cuLaunchCooperativeKernel"), 0, f, gx, gy, gz, bx,
			   by, bz, shm, stream, params);
}

HAMI_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
						    unsigned int gz, unsigned int bx, unsigned int by,
						    unsigned int bz, unsigned int shm, CUstream stream,
						    void **params)
{
	HAMI_IN_DRIVER();
	return cooperative(HAMI_REAL(cooperative_fn, "cuLaunchCooperativeKernel_ptsz"), 1, f, gx, gy, gz,
			   bx, by, bz, shm, stream, params);
}

/* A graph's first launch may map its memory: held against the slice first (graph_memory.c). */
static CUresult graph(graph_fn fn, int per_thread, CUgraphExec exec, CUstream stream)
{
	struct hami_graph_hold h;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	if (hami_graph_hold(exec, &h) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	int watch = watching();
	if (watch)
		hami_sm_before_launch(stream, per_thread);
	CUresult rc = fn(exec, stream);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY || rc == CUDA_ERROR_DEVICE_UNAVAILABLE) { /* did not start: made again */
		struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;
		while (launch_again(rc, &d, "a CUDA graph's launch"))
			rc = fn(exec, stream);
		hami_driver_room_end(&d);
	}
	if (watch)
		hami_sm_after_launch(rc);
	hami_graph_release(&h, rc);
	return rc;
}

HAMI_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
	HAMI_IN_DRIVER();
	return graph(HAMI_REAL(graph_fn, "cuGraphLaunch"), 0, exec, stream);
}

HAMI_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
	HAMI_IN_DRIVER();
	return graph(HAMI_REAL(graph_fn, "cuGraphLaunch_ptsz"), 1, exec, stream);
}
