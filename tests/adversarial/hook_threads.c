/*
 * hook_threads: many threads of one process make their first (and then many
 * more) calls into the preload library's hooks at the same instant, so that
 * lazily resolved entry points, process-wide caches and the per-thread launch
 * gate are all raced on. Built by tests/adversarial/test_hook_threads.py with
 * the same sanitizer as the library (under ThreadSanitizer every race shows).
 *
 *   hook_threads THREADS ROUNDS
 *
 * Prints one JSON line of counts; exits 0 when every call answered what the
 * slice allows (success, or CUDA_ERROR_OUT_OF_MEMORY for allocations), else 1.
 * Entry points are looked up with dlsym on the driver's handle, as
 * applications do, so the lookups go through the library's dlsym hook too.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hami/cuda_types.h"

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*release_fn)(CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*mem_info_fn)(size_t *, size_t *);
typedef CUresult (*total_mem_fn)(size_t *, CUdevice);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*array_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*array_destroy_fn)(CUarray);
typedef CUresult (*ctx_create_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctx_destroy_fn)(CUcontext);
typedef CUresult (*module_load_fn)(CUmodule *, const void *);
typedef CUresult (*module_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			      unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_handle_fn)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_mem_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*nvml_mem2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);

static void *cuda, *nvml;
static pthread_barrier_t start;
static int rounds;
static atomic_ulong calls, allocations, refusals, failures;
static atomic_int first_failure_line, first_failure_rc;

#define SYM(lib, type, name) ((type)dlsym(lib, name))

static void check(CUresult rc, int line, int may_refuse)
{
	atomic_fetch_add(&calls, 1);
	if (rc == CUDA_SUCCESS)
		return;
	if (may_refuse && rc == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_fetch_add(&refusals, 1);
		return;
	}
	if (atomic_fetch_add(&failures, 1) == 0) {
		atomic_store(&first_failure_line, line);
		atomic_store(&first_failure_rc, rc);
	}
}

#define CHECK(call) check((call), __LINE__, 0)
#define CHECK_ALLOC(call) check((call), __LINE__, 1)

static unsigned long long bytes_of(unsigned int *seed)
{
	return (1ull + (unsigned long long)(rand_r(seed) % 16)) << 20; /* 1..16 MiB */
}

static void *worker(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg * 2654435761u + 1;
	pthread_barrier_wait(&start);
	/* Every thread resolves and calls everything at once: the first calls race. */
	CHECK(SYM(cuda, init_fn, "cuInit")(0));
	CUdevice dev;
	CHECK(SYM(cuda, device_get_fn, "cuDeviceGet")(&dev, 0));
	if ((uintptr_t)arg % 2) {
		/* Half the threads begin with a context of their own: the first contexts (measured
		 * through NVML when no overhead is set) are created at once. */
		CUcontext own = NULL;
		CUresult rc = SYM(cuda, ctx_create_fn, "cuCtxCreate_v2")(&own, 0, dev);
		CHECK_ALLOC(rc);
		if (rc == CUDA_SUCCESS)
			CHECK(SYM(cuda, ctx_destroy_fn, "cuCtxDestroy_v2")(own));
	}
	CUcontext primary = NULL;
	CHECK_ALLOC(SYM(cuda, retain_fn, "cuDevicePrimaryCtxRetain")(&primary, dev));
	if (!primary)
		return NULL;
	CHECK(SYM(cuda, set_current_fn, "cuCtxSetCurrent")(primary));
	nvmlDevice_t nd;
	int have_nvml = SYM(nvml, nvml_init_fn, "nvmlInit_v2")() == NVML_SUCCESS &&
			SYM(nvml, nvml_handle_fn, "nvmlDeviceGetHandleByIndex_v2")(0, &nd) == NVML_SUCCESS;
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	CHECK(SYM(cuda, module_load_fn, "cuModuleLoadData")(&mod, "hami_threads"));
	if (mod)
		CHECK(SYM(cuda, module_function_fn, "cuModuleGetFunction")(&fn, mod, "hami_sim_busy_threads"));
	for (int r = 0; r < rounds; r++) {
		size_t free_b = 0, total_b = 0;
		CHECK(SYM(cuda, mem_info_fn, "cuMemGetInfo_v2")(&free_b, &total_b));
		CHECK(SYM(cuda, total_mem_fn, "cuDeviceTotalMem_v2")(&total_b, dev));
		if (have_nvml) {
			nvmlMemory_t m;
			nvmlMemory_v2_t m2 = { .version = nvmlMemory_v2 };
			CHECK(SYM(nvml, nvml_mem_fn, "nvmlDeviceGetMemoryInfo")(nd, &m));
			CHECK(SYM(nvml, nvml_mem2_fn, "nvmlDeviceGetMemoryInfo_v2")(nd, &m2));
		}
		CUdeviceptr p[5] = { 0 };
		size_t pitch = 0;
		CUarray arr = NULL;
		CUDA_ARRAY_DESCRIPTOR ad = { .Width = 1024, .Height = 256, .Format = CU_AD_FORMAT_FLOAT,
					     .NumChannels = 1 };
		CHECK_ALLOC(SYM(cuda, alloc_fn, "cuMemAlloc_v2")(&p[0], bytes_of(&seed)));
		CHECK_ALLOC(SYM(cuda, managed_fn, "cuMemAllocManaged")(&p[1], bytes_of(&seed), CU_MEM_ATTACH_GLOBAL));
		CHECK_ALLOC(SYM(cuda, pitch_fn, "cuMemAllocPitch_v2")(&p[2], &pitch, 4096, 64, 4));
		CHECK_ALLOC(SYM(cuda, async_fn, "cuMemAllocAsync")(&p[3], bytes_of(&seed), NULL));
		CHECK_ALLOC(SYM(cuda, array_fn, "cuArrayCreate_v2")(&arr, &ad));
		for (int i = 0; i < 5; i++)
			if (p[i])
				atomic_fetch_add(&allocations, 1);
		if (fn) {
			unsigned long long ns = 1000;
			void *params[] = { &ns };
			CHECK(SYM(cuda, launch_fn, "cuLaunchKernel")(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
			CHECK(SYM(cuda, launch_fn, "cuLaunchKernel_ptsz")(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
		}
		if (r % 8 == 0) {
			/* Created contexts, and lookups through cuGetProcAddress_v2, in the middle of it all. */
			CUcontext c = NULL;
			CUresult rc = SYM(cuda, ctx_create_fn, "cuCtxCreate_v2")(&c, 0, dev);
			CHECK_ALLOC(rc);
			if (rc == CUDA_SUCCESS) {
				CHECK(SYM(cuda, ctx_destroy_fn, "cuCtxDestroy_v2")(c));
				CHECK(SYM(cuda, set_current_fn, "cuCtxSetCurrent")(primary));
			}
			void *found = NULL;
			CUdriverProcAddressQueryResult q;
			CHECK(SYM(cuda, getproc_fn, "cuGetProcAddress_v2")("cuMemGetInfo", &found, 12000, 0, &q));
			if (found)
				CHECK(((mem_info_fn)found)(&free_b, &total_b));
		}
		if (p[0])
			CHECK(SYM(cuda, free_fn, "cuMemFree_v2")(p[0]));
		if (p[1])
			CHECK(SYM(cuda, free_fn, "cuMemFree_v2")(p[1]));
		if (p[2])
			CHECK(SYM(cuda, free_fn, "cuMemFree_v2")(p[2]));
		if (p[3])
			CHECK(SYM(cuda, free_async_fn, "cuMemFreeAsync")(p[3], NULL));
		if (arr)
			CHECK(SYM(cuda, array_destroy_fn, "cuArrayDestroy")(arr));
	}
	CHECK(SYM(cuda, sync_fn, "cuCtxSynchronize")());
	CHECK(SYM(cuda, release_fn, "cuDevicePrimaryCtxRelease_v2")(dev));
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 8;
	rounds = argc > 2 ? atoi(argv[2]) : 50;
	if (threads < 1 || threads > 256 || rounds < 1) {
		fprintf(stderr, "usage: hook_threads THREADS(1-256) ROUNDS\n");
		return 2;
	}
	cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cuda || !nvml) {
		fprintf(stderr, "hook_threads: cannot load the driver: %s\n", dlerror());
		return 2;
	}
	pthread_t tid[256];
	pthread_barrier_init(&start, NULL, (unsigned)threads);
	for (int i = 0; i < threads; i++)
		if (pthread_create(&tid[i], NULL, worker, (void *)(uintptr_t)i) != 0) {
			fprintf(stderr, "hook_threads: cannot start thread %d\n", i);
			return 2;
		}
	for (int i = 0; i < threads; i++)
		pthread_join(tid[i], NULL);
	printf("{\"threads\": %d, \"rounds\": %d, \"calls\": %lu, \"allocations\": %lu, \"refusals\": %lu, "
	       "\"failures\": %lu, \"first_failure_line\": %d, \"first_failure_rc\": %d}\n",
	       threads, rounds, atomic_load(&calls), atomic_load(&allocations), atomic_load(&refusals),
	       atomic_load(&failures), atomic_load(&first_failure_line), atomic_load(&first_failure_rc));
	return atomic_load(&failures) ? 1 : 0;
}
