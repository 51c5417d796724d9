/*
 * Per-call CPU cost of the driver entry points hami-jupyter hooks, measured
 * from a plain C program through the real libcuda.so.1 (dlopen + dlsym, as
 * the CUDA runtime does). Two ways:
 *
 *   driver_overhead [iterations [alloc_free_pairs]]
 * prints one JSON line: launch_ns (cuLaunchKernel of an empty kernel, CPU time
 * per call, stream synchronised every 1000 launches), alloc_free_ns
 * (cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB), meminfo_ns (cuMemGetInfo_v2).
 * alloc_free_pairs defaults to iterations / 20 (at least 1000); a caller that
 * wants only the launch figure passes a small count so a run ends sooner.
 * Run it once without and once with LD_PRELOAD; the difference is what the
 * preload library adds (bench/run_overhead.sh). Between two processes that
 * difference moves by hundreds of ns on a shared host, far more than a hook
 * costs.
 *
 *   driver_overhead pairs [pairs [block [warm-up]]]
 * measures the hook's cost inside one process: after `warm-up` seconds (1;
 * a share that does not bind stops gating once the library's controller has
 * read NVML) of launching both ways, blocks of `block` (500)
 * launches alternate between the cuLaunchKernel that dlsym gives (under the
 * preload, its hook) and the driver's own (glibc's dlsym, asked for by
 * version, which the preload does not answer), `pairs` (200) times, the
 * order swapped every other pair, the GPU drained after every block, the
 * thread pinned to one CPU. The host's drift moves both halves of a pair
 * alike. Prints one JSON line: diff_ns, per pair the hooked block's ns per
 * launch less the driver's; hooked_ns and real_ns, their medians;
 * same_entry (no preload: both are the driver's, the differences are the
 * method's noise); and, where perf_event_open lets a process count its own
 * instructions, instructions per launch of each (else null).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/perf_event.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

/* The driver, a context and the empty kernel: what both ways need. */
static void *setup(CUfunction *fn)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "driver_overhead: no libcuda.so.1: %s\n", dlerror());
		exit(2);
	}
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CHECK(((init_fn)need(lib, "cuInit"))(0));
	CHECK(((device_get_fn)need(lib, "cuDeviceGet"))(&dev, 0));
	CHECK(((retain_fn)need(lib, "cuDevicePrimaryCtxRetain"))(&ctx, dev));
	CHECK(((set_current_fn)need(lib, "cuCtxSetCurrent"))(ctx));
	CHECK(((module_load_fn)need(lib, "cuModuleLoadData"))(&mod, empty_ptx));
	CHECK(((get_function_fn)need(lib, "cuModuleGetFunction"))(fn, mod, "hami_empty"));
	return lib;
}

/* This thread's user-space instructions, or -1 where the kernel will not count them. */
static int instructions_counter(void)
{
	struct perf_event_attr a;
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	a.type = PERF_TYPE_HARDWARE;
	a.config = PERF_COUNT_HW_INSTRUCTIONS;
	a.exclude_kernel = 1;
	a.exclude_hv = 1;
	return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static long long read_counter(int fd)
{
	long long v = 0;
	return fd >= 0 && read(fd, &v, sizeof(v)) == sizeof(v) ? v : -1;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), by_value);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One block: ns per launch, and instructions per launch into *ins (-1 unknown). */
static double block(launch_fn launch, CUfunction fn, sync_fn sync, int count, int counter, double *ins)
{
	long long i0 = read_counter(counter);
	double t0 = now_ns();
	for (int i = 0; i < count; i++)
		launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	double t = now_ns() - t0;
	long long i1 = read_counter(counter);
	*ins = i0 >= 0 && i1 >= 0 ? (double)(i1 - i0) / count : -1;
	sync();
	return t / count;
}

static int pairs_main(int npairs, int count, double warm_s)
{
	CUfunction fn;
	void *lib = setup(&fn);
	typedef void *(*dlsym_fn)(void *, const char *);
	dlsym_fn glibc_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!glibc_dlsym)
		glibc_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	launch_fn hooked = (launch_fn)need(lib, "cuLaunchKernel");
	launch_fn real = glibc_dlsym ? (launch_fn)glibc_dlsym(lib, "cuLaunchKernel") : NULL;
	sync_fn sync = (sync_fn)need(lib, "cuCtxSynchronize");
	if (!real) {
		fprintf(stderr, "driver_overhead: glibc's dlsym or the driver's cuLaunchKernel not found\n");
		return 2;
	}
	int cpu = sched_getcpu();
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	int pinned = cpu >= 0 && sched_setaffinity(0, sizeof(set), &set) == 0;
	int counter = instructions_counter();
	double *diff = calloc(npairs, sizeof(double)), *h = calloc(npairs, sizeof(double));
	double *r = calloc(npairs, sizeof(double)), hi = 0, ri = 0, ins;
	if (!diff || !h || !r)
		return 2;
	/* Warm both paths up, long enough for the library's controller to have
	 * read NVML (a share that does not bind stops gating after a sample). */
	for (double end = now_ns() + warm_s * 1e9; now_ns() < end;) {
		block(hooked, fn, sync, count, -1, &ins);
		block(real, fn, sync, count, -1, &ins);
	}
	for (int p = 0; p < npairs; p++) {
		double hins, rins;
		if (p % 2) {
			r[p] = block(real, fn, sync, count, counter, &rins);
			h[p] = block(hooked, fn, sync, count, counter, &hins);
		} else {
			h[p] = block(hooked, fn, sync, count, counter, &hins);
			r[p] = block(real, fn, sync, count, counter, &rins);
		}
		diff[p] = h[p] - r[p];
		hi += hins;
		ri += rins;
	}
	printf("{\"mode\": \"pairs\", \"pairs\": %d, \"block\": %d, \"same_entry\": %s, \"cpu\": %d, "
	       "\"pinned\": %s, \"diff_ns\": [",
	       npairs, count, hooked == real ? "true" : "false", cpu, pinned ? "true" : "false");
	for (int p = 0; p < npairs; p++)
		printf("%s%.2f", p ? ", " : "", diff[p]);
	printf("], \"hooked_ns\": %.2f, \"real_ns\": %.2f, ", median(h, npairs), median(r, npairs));
	if (counter >= 0 && hi >= 0 && ri >= 0)
		printf("\"instructions\": {\"hooked\": %.1f, \"real\": %.1f}}\n", hi / npairs, ri / npairs);
	else
		printf("\"instructions\": null}\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "pairs") == 0) {
		int npairs = argc > 2 ? atoi(argv[2]) : 200, count = argc > 3 ? atoi(argv[3]) : 500;
		double warm_s = argc > 4 ? atof(argv[4]) : 1.0;
		if (npairs < 2 || count < 1 || !(warm_s >= 0)) {
			fprintf(stderr, "usage: driver_overhead pairs [pairs >= 2 [block >= 1 [warm-up seconds]]]\n");
			return 2;
		}
		return pairs_main(npairs, count, warm_s);
	}
	long n = argc > 1 ? atol(argv[1]) : 200000;
	CUfunction fn;
	void *lib = setup(&fn);
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
