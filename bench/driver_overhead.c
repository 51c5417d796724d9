/*
 * Per-call CPU cost of the driver entry points hami-jupyter hooks, measured
 * from a plain C program through the real libcuda.so.1 (dlopen + dlsym, as
 * the CUDA runtime does). Run it once without and once with LD_PRELOAD; the
 * difference is what the preload library adds. bench/run_overhead.sh does both.
 *
 *   driver_overhead [iterations [alloc_free_pairs]]
 * prints one JSON line: launch_ns (cuLaunchKernel of an empty kernel, CPU time
 * per call, stream synchronised every 1000 launches), alloc_free_ns
 * (cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB), meminfo_ns (cuMemGetInfo_v2).
 * alloc_free_pairs defaults to iterations / 20 (at least 1000); a caller that
 * wants only the launch figure passes a small count so a run ends sooner.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "hami/cuda_types.h"

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*module_load_fn)(CUmodule *, const void *);
typedef CUresult (*get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      unsigned, CUstream, void **, void **);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);

static const char empty_ptx[] =
	".version 7.0\n.target sm_70\n.address_size 64\n"
	".visible .entry hami_empty()\n{\n\tret;\n}\n";

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *need(void *lib, const char *name)
{
	void *f = dlsym(lib, name);
	if (!f) {
		fprintf(stderr, "driver_overhead: %s missing\n", name);
		exit(2);
	}
	return f;
}

#define CHECK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "%s failed: %d\n", #call, r_); exit(1); } } while (0)

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "driver_overhead: no libcuda.so.1: %s\n", dlerror());
		return 2;
	}
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CHECK(((init_fn)need(lib, "cuInit"))(0));
	CHECK(((device_get_fn)need(lib, "cuDeviceGet"))(&dev, 0));
	CHECK(((retain_fn)need(lib, "cuDevicePrimaryCtxRetain"))(&ctx, dev));
	CHECK(((set_current_fn)need(lib, "cuCtxSetCurrent"))(ctx));
	CHECK(((module_load_fn)need(lib, "cuModuleLoadData"))(&mod, empty_ptx));
	CHECK(((get_function_fn)need(lib, "cuModuleGetFunction"))(&fn, mod, "hami_empty"));
	launch_fn launch = (launch_fn)need(lib, "cuLaunchKernel");
	sync_fn sync = (sync_fn)need(lib, "cuCtxSynchronize");
	alloc_fn alloc = (alloc_fn)need(lib, "cuMemAlloc_v2");
	free_fn mfree = (free_fn)need(lib, "cuMemFree_v2");
	info_fn info = (info_fn)need(lib, "cuMemGetInfo_v2");

	/* warm up, then measure launches excluding the periodic synchronise */
	for (int i = 0; i < 1000; i++)
		CHECK(launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	CHECK(sync());
	double launch_total = 0;
	for (long done = 0; done < n; done += 1000) {
		double t0 = now_ns();
		for (int i = 0; i < 1000; i++)
			launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		launch_total += now_ns() - t0;
		sync();
	}
	long pairs = n / 20 > 1000 ? n / 20 : 1000;
	if (argc > 2)
		pairs = atol(argv[2]) > 0 ? atol(argv[2]) : 1;
	CUdeviceptr p;
	for (int i = 0; i < 100; i++) {
		CHECK(alloc(&p, 1 << 20));
		CHECK(mfree(p));
	}
	double t0 = now_ns();
	for (long i = 0; i < pairs; i++) {
		alloc(&p, 1 << 20);
		mfree(p);
	}
	double alloc_total = now_ns() - t0;
	size_t fr, tot;
	t0 = now_ns();
	for (long i = 0; i < pairs; i++)
		info(&fr, &tot);
	double info_total = now_ns() - t0;
	printf("{\"launches\": %ld, \"launch_ns\": %.1f, \"alloc_free_pairs\": %ld, \"alloc_free_ns\": %.1f, "
	       "\"meminfo_ns\": %.1f, \"total_bytes\": %zu}\n",
	       n, launch_total / n, pairs, alloc_total / pairs, info_total / pairs, tot);
	return 0;
}
