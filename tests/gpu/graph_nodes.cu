// A CUDA graph with memory nodes, the way a program makes one: cudaMallocAsync
// and cudaFreeAsync captured into the graph, plus an allocation the graph
// leaves allocated. Built and run by tests/gpu/test_true_accounting_gpu.py with
// and without the preload library; both runs must answer the same.
//
//   graph_nodes MODE MIB [worker]     MODE: global | thread | relaxed
//
// worker: while the main thread captures, a second thread makes stream-ordered
// allocations on a stream of its own (made before the capture).
//
// Prints one JSON object per line; after the launches it prints
// {"step":"launched"} and waits for a line on stdin (the test reads the
// slice's charge and NVML then), trims the graph memory, prints
// {"step":"trimmed"} and waits again.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __global__ void fill(float *p, size_t n, float v)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = v + (float)(i % 7);
}

static __global__ void sum_into(const float *p, size_t n, double *out)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	if (i < n)
		atomicAdd(out, (double)p[i]);
}

struct worker_args {
	cudaStream_t s;
	int rc;
};

// While the main thread captures in the global mode, another thread makes
// ordinary stream-ordered allocations on a stream of its own: legal, and must
// not invalidate the capture.
static void *worker(void *arg)
{
	struct worker_args *a = (struct worker_args *)arg;
	void *p = NULL;
	a->rc = cudaMallocAsync(&p, 8 << 20, a->s);
	if (a->rc == 0)
		a->rc = cudaFreeAsync(p, a->s);
	return NULL;
}

static void wait_line(void)
{
	char buf[64];
	if (!fgets(buf, sizeof(buf), stdin))
		return;
}

int main(int argc, char **argv)
{
	const char *mode_name = argc > 1 ? argv[1] : "global";
	size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 256;
	int use_worker = argc > 3 && !strcmp(argv[3], "worker");
	cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
	if (!strcmp(mode_name, "thread"))
		mode = cudaStreamCaptureModeThreadLocal;
	else if (!strcmp(mode_name, "relaxed"))
		mode = cudaStreamCaptureModeRelaxed;
	size_t n = mib * (1 << 20) / sizeof(float);
	cudaStream_t s;
	double *sum = NULL;
	float *tmp = NULL, *kept = NULL;
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	cudaError_t rc;
	struct worker_args wa = { NULL, -1 };
	pthread_t t;

	if ((rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) || (rc = cudaMalloc((void **)&sum, sizeof(double)))) {
		printf("{\"step\":\"setup\",\"rc\":%d}\n", (int)rc);
		return 1;
	}
	cudaMemset(sum, 0, sizeof(double));
	if (use_worker)
		cudaStreamCreateWithFlags(&wa.s, cudaStreamNonBlocking);
	cudaDeviceSynchronize();

	rc = cudaStreamBeginCapture(s, mode);
	printf("{\"step\":\"begin\",\"rc\":%d}\n", (int)rc);
	// tmp: allocated and freed inside the graph; kept: left allocated by it.
	cudaError_t a1 = cudaMallocAsync((void **)&tmp, n * sizeof(float), s);
	cudaError_t a2 = cudaMallocAsync((void **)&kept, (1 << 20), s);
	if (!a1) {
		fill<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(tmp, n, 1.0f);
		sum_into<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(tmp, n, sum);
	}
	if (use_worker) {
		pthread_create(&t, NULL, worker, &wa);
		pthread_join(t, NULL);
	}
	cudaError_t f1 = a1 ? a1 : cudaFreeAsync(tmp, s);
	cudaStreamCaptureStatus status;
	cudaError_t st = cudaStreamIsCapturing(s, &status);
	rc = cudaStreamEndCapture(s, &graph);
	printf("{\"step\":\"captured\",\"malloc\":%d,\"malloc_kept\":%d,\"free\":%d,\"status\":%d,\"status_rc\":%d,"
	       "\"worker\":%d,\"end\":%d}\n",
	       (int)a1, (int)a2, (int)f1, (int)status, (int)st, wa.rc, (int)rc);
	if (rc)
		return 2;
	rc = cudaGraphInstantiate(&exec, graph, 0);
	printf("{\"step\":\"instantiated\",\"rc\":%d}\n", (int)rc);
	if (rc)
		return 3;
	// The graph leaves "kept" allocated: free it between launches, as a program must.
	int launches = 0;
	cudaError_t lrc = cudaSuccess;
	for (int i = 0; i < 3 && !lrc; i++) {
		lrc = cudaGraphLaunch(exec, s);
		if (!lrc)
			lrc = cudaFreeAsync(kept, s);
		if (!lrc)
			launches++;
	}
	cudaError_t sync = cudaStreamSynchronize(s);
	double host = 0;
	cudaMemcpy(&host, sum, sizeof(double), cudaMemcpyDeviceToHost);
	double expect = 0;
	for (size_t i = 0; i < 7; i++)
		expect += (1.0 + i) * (double)(n / 7 + (i < n % 7 ? 1 : 0));
	printf("{\"step\":\"launched\",\"launches\":%d,\"rc\":%d,\"sync\":%d,\"sum\":%.6e,\"expect\":%.6e}\n",
	       launches, (int)lrc, (int)sync, host, 3 * expect);
	fflush(stdout);
	wait_line();
	rc = cudaDeviceGraphMemTrim(0);
	cudaGraphExecDestroy(exec);
	cudaGraphDestroy(graph);
	cudaError_t trim2 = cudaDeviceGraphMemTrim(0);
	printf("{\"step\":\"trimmed\",\"rc\":%d,\"rc2\":%d}\n", (int)rc, (int)trim2);
	fflush(stdout);
	wait_line();
	return 0;
}
