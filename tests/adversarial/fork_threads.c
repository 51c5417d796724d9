/*
 * fork_threads: a program forks over and over while its other threads are
 * inside the preload library (set-up, the gate's thunk table, the charge and
 * record tables). Every child then makes CUDA calls of its own and exits: a
 * child that inherited one of the library's locks held would wait forever.
 * Built by tests/adversarial/test_fork_threads.py with the library's sanitizer.
 *
 *   fork_threads THREADS FORKS
 *
 * The parent gives each child 10 s; one that has not exited by then is
 * killed and counted as stuck. Prints one JSON line of counts; exits 0 when
 * no child was stuck or failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hami/cuda_types.h"

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *cuda;
static atomic_int stop;
static atomic_long calls;

/* Unhooked names: each lookup passes the parking gate's thunk table. */
static const char *const unhooked[] = { "cuCtxGetCurrent", "cuStreamQuery", "cuEventQuery", "cuCtxSynchronize",
					 "cuMemcpyHtoD", "cuModuleGetFunction" };

static int context(void)
{
	init_fn init = (init_fn)dlsym(cuda, "cuInit");
	device_get_fn get = (device_get_fn)dlsym(cuda, "cuDeviceGet");
	retain_fn retain = (retain_fn)dlsym(cuda, "cuDevicePrimaryCtxRetain");
	set_current_fn set = (set_current_fn)dlsym(cuda, "cuCtxSetCurrent");
	CUdevice dev;
	CUcontext ctx;
	if (!init || !get || !retain || !set || init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx))
		return -1;
	return 0;
}

/* The calls a thread keeps making: lookups, set-up, allocations and frees. */
static int round_of_calls(unsigned *seed)
{
	getproc_fn getproc = (getproc_fn)dlsym(cuda, "cuGetProcAddress_v2");
	alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
	free_fn release = (free_fn)dlsym(cuda, "cuMemFree_v2");
	void *fn;
	CUdriverProcAddressQueryResult found;
	CUdeviceptr p;
	if (!getproc || !alloc || !release)
		return -1;
	for (size_t i = 0; i < sizeof(unhooked) / sizeof(unhooked[0]); i++)
		getproc(unhooked[i], &fn, 12000, 0, &found);
	if (context() < 0)
		return -1;
	if (alloc(&p, (size_t)(1 + rand_r(seed) % 8) << 20) == CUDA_SUCCESS)
		release(p);
	atomic_fetch_add(&calls, 1);
	return 0;
}

static void *busy(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	while (!atomic_load(&stop))
		round_of_calls(&seed);
	return NULL;
}

/* 0: exited 0; 1: failed; 2: stuck (killed after 10 s). */
static int reap(pid_t pid)
{
	for (int waited_ms = 0; waited_ms < 10000; waited_ms += 2) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return 2;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	int forks = argc > 2 ? atoi(argv[2]) : 200;
	pthread_t t[64];
	int stuck = 0, failed = 0;
	if (nthreads > 64)
		nthreads = 64;
	cuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cuda) {
		fprintf(stderr, "fork_threads: %s\n", dlerror());
		return 2;
	}
	/* The threads start before anything is set up: early forks meet set-up under way. */
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, busy, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < forks; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			unsigned seed = (unsigned)getpid();
			_exit(round_of_calls(&seed) == 0 ? 0 : 3);
		}
		if (pid < 0) {
			failed++;
			continue;
		}
		int r = reap(pid);
		stuck += r == 2;
		failed += r == 1;
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	printf("{\"threads\": %d, \"forks\": %d, \"stuck\": %d, \"failed\": %d, \"calls\": %ld}\n", nthreads, forks,
	       stuck, failed, atomic_load(&calls));
	return stuck || failed ? 1 : 0;
}
