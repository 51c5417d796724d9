/*
 * Graph memory: what a CUDA graph's memory nodes (a cudaMallocAsync captured
 * into the graph) really take. Nothing is allocated at capture (capture.c
 * lets those calls through); the device's graph memory pool grows when a
 * graph is uploaded or launched and shrinks only when trimmed. The slice is
 * charged the pool's reserved bytes, followed after each of those calls: a
 * forced charge, since the memory is already there when we see it (the next
 * allocation past the cap is refused). The NVML true-up (true_up.c) would
 * find it too, within a second; this is at once.
 */
#include <pthread.h>

#include "hami.h"
#include "hook_api.h"

typedef CUresult (*graph_mem_attr_fn)(CUdevice, CUgraphMem_attribute, void *);
typedef CUresult (*upload_fn)(CUgraphExec, CUstream);
typedef CUresult (*trim_fn)(CUdevice);

pthread_mutex_t hami_graph_lock = PTHREAD_MUTEX_INITIALIZER;
#define settle_lock hami_graph_lock
static int graph_nodes_seen; /* a memory node was captured: launches may grow the pool */

void hami_graph_memory_seen(void)
{
	__atomic_store_n(&graph_nodes_seen, 1, __ATOMIC_RELAXED);
}

/* Bring the charge for ordinal's graph memory pool to its reserved bytes. */
static void settle(int ordinal)
{
	int sdev = hami_ordinal_device(ordinal);
	graph_mem_attr_fn attr = HAMI_REAL(graph_mem_attr_fn, "cuDeviceGetGraphMemAttribute");
	cuuint64_t reserved = 0;
	if (sdev < 0 || !attr)
		return;
	int mode = hami_capture_relaxed_begin();
	CUresult rc = attr(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
	hami_capture_relaxed_end(mode);
	if (rc != CUDA_SUCCESS)
		return;
	pthread_mutex_lock(&settle_lock);
	struct hami_record r = { .key = (uint64_t)ordinal, .sdev = sdev, .kind = HAMI_KIND_GRAPH_POOL };
	hami_record_get(HAMI_KIND_GRAPH_POOL, r.key, &r);
	if (reserved > r.bytes)
		hami_charge_force(sdev, reserved - r.bytes);
	else if (r.bytes > reserved)
		hami_credit(sdev, r.bytes - reserved);
	r.bytes = reserved;
	hami_record_put(&r);
	pthread_mutex_unlock(&settle_lock);
}

/* After a graph launch or upload on the current context's GPU. */
void hami_graph_memory_after_launch(CUresult rc)
{
	int ordinal;
	if (rc != CUDA_SUCCESS || !__atomic_load_n(&graph_nodes_seen, __ATOMIC_RELAXED))
		return;
	if (hami_current_device(&ordinal) >= 0)
		settle(ordinal);
}

static CUresult upload(upload_fn fn, CUgraphExec exec, CUstream stream)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(exec, stream);
	hami_graph_memory_after_launch(rc);
	return rc;
}

HAMI_EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream)
{
	HAMI_IN_DRIVER();
	return upload(HAMI_REAL(upload_fn, "cuGraphUpload"), exec, stream);
}

HAMI_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream)
{
	HAMI_IN_DRIVER();
	return upload(HAMI_REAL(upload_fn, "cuGraphUpload_ptsz"), exec, stream);
}

HAMI_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
	HAMI_IN_DRIVER();
	trim_fn fn = HAMI_REAL(trim_fn, "cuDeviceGraphMemTrim");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(device);
	if (rc == CUDA_SUCCESS && __atomic_load_n(&graph_nodes_seen, __ATOMIC_RELAXED) && hami_setup() == CUDA_SUCCESS)
		settle(device);
	return rc;
}
