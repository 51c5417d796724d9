/*
 * Graph memory: what a CUDA graph's memory nodes (a cudaMallocAsync captured
 * into the graph) really take. Nothing is allocated at capture (capture.c
 * lets those calls through); the device's graph memory pool grows when an
 * executable is uploaded or first launched, keeps that mapping for its
 * relaunches, and shrinks only when trimmed.
 *
 * Before: at instantiation the graph's need is read (graph_need.c); before
 * an upload or a launch that may map it, what the pool cannot serve from its
 * spare bytes is reserved against the slice like any allocation, and a
 * launch that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY before
 * the driver takes anything. After: the slice is charged the pool's reserved
 * bytes as the driver reports them (a forced charge: the memory is there),
 * and the reservation is handed back. An executable whose graph could not be
 * read is only charged after (the NVML true-up would find it too).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hami.h"
#include "hook_api.h"

typedef CUresult (*graph_mem_attr_fn)(CUdevice, CUgraphMem_attribute, void *);
typedef CUresult (*upload_fn)(CUgraphExec, CUstream);
typedef CUresult (*trim_fn)(CUdevice);
typedef CUresult (*inst_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*inst_v2_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*inst_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*exec_destroy_fn)(CUgraphExec);

pthread_mutex_t hami_graph_lock = PTHREAD_MUTEX_INITIALIZER;
#define settle_lock hami_graph_lock

static int graph_nodes_seen; /* a memory node was captured or read: launches may grow the pool */
static uint64_t trims;       /* cuDeviceGraphMemTrim calls: a trim may unmap any executable */

/* An executable's need per CUDA device, and whether its mapping is in place. */
struct hami_exec_need {
	uint64_t bytes[HAMI_MAX_CUDA_DEVICES];
	uint64_t mapped_at; /* trims + 1 when a launch or upload mapped it; 0: not mapped */
};

void hami_graph_memory_seen(void)
{
	__atomic_store_n(&graph_nodes_seen, 1, __ATOMIC_RELAXED);
}

static int pool_attr(int ordinal, CUgraphMem_attribute a, uint64_t *v)
{
	graph_mem_attr_fn attr = HAMI_REAL(graph_mem_attr_fn, "cuDeviceGetGraphMemAttribute");
	cuuint64_t x = 0;
	if (!attr)
		return -1;
	int mode = hami_capture_relaxed_begin();
	CUresult rc = attr(ordinal, a, &x);
	hami_capture_relaxed_end(mode);
	if (rc != CUDA_SUCCESS)
		return -1;
	*v = x;
	return 0;
}

/* Bring the charge for ordinal's graph memory pool to its reserved bytes. */
static void settle(int ordinal)
{
	int sdev = hami_ordinal_device(ordinal);
	uint64_t reserved = 0;
	if (sdev < 0 || pool_attr(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0)
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

/* ---- the need of an executable -------------------------------------------- */

static struct hami_exec_need *need_of(CUgraphExec exec)
{
	struct hami_record r;
	if (hami_record_get(HAMI_KIND_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, &r) < 0)
		return NULL;
	return (struct hami_exec_need *)(uintptr_t)r.pool;
}

/* Read graph g's need before it is instantiated; NULL when it has no memory
 * nodes the slice governs, or cannot be read (told once). */
static struct hami_exec_need *read_need(CUgraph g)
{
	static int told;
	if (hami_setup() != CUDA_SUCCESS)
		return NULL;
	struct hami_exec_need *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	if (hami_graph_need(g, n->bytes) < 0) {
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			hami_log(HAMI_LOG_WARN, "cannot read a CUDA graph's memory nodes: its memory is charged "
				 "when it runs, not reserved before");
		free(n);
		return NULL;
	}
	for (int o = 0; o < HAMI_MAX_CUDA_DEVICES; o++)
		if (n->bytes[o] && hami_ordinal_device(o) >= 0) {
			hami_graph_memory_seen();
			return n;
		}
	free(n);
	return NULL;
}

static void keep_need(CUgraphExec exec, struct hami_exec_need *n)
{
	struct hami_record r = { .key = (uint64_t)(uintptr_t)exec, .pool = (uint64_t)(uintptr_t)n,
				 .sdev = -1, .kind = HAMI_KIND_GRAPH_EXEC };
	if (!n)
		return;
	if (hami_record_put(&r) < 0)
		free(n);
}

/* ---- around an upload or a launch ------------------------------------------- */

/*
 * Reserve what mapping need n may add on each device: its bytes beyond the
 * pool's spare ones (reserved, not associated with any graph), unless it is
 * mapped already. CUDA_ERROR_OUT_OF_MEMORY (nothing held) when a device's
 * slice has no room.
 */
static CUresult hold(struct hami_exec_need *n, struct hami_graph_hold *h)
{
	h->need = NULL;
	if (!n || __atomic_load_n(&n->mapped_at, __ATOMIC_ACQUIRE) == __atomic_load_n(&trims, __ATOMIC_ACQUIRE) + 1)
		return CUDA_SUCCESS;
	memset(h->held, 0, sizeof(h->held));
	h->need = n;
	for (int o = 0; o < HAMI_MAX_CUDA_DEVICES; o++) {
		int sdev = hami_ordinal_device(o);
		uint64_t reserved, used;
		if (!n->bytes[o] || sdev < 0)
			continue;
		if (pool_attr(o, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0 ||
		    pool_attr(o, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) < 0)
			reserved = used = 0;
		uint64_t spare = reserved > used ? reserved - used : 0;
		uint64_t grow = n->bytes[o] > spare ? n->bytes[o] - spare : 0;
		if (grow && hami_charge(sdev, grow, "a CUDA graph's memory") != CUDA_SUCCESS) {
			hami_graph_release(h, CUDA_ERROR_OUT_OF_MEMORY);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		h->held[o] = grow;
	}
	return CUDA_SUCCESS;
}

CUresult hami_graph_hold(CUgraphExec exec, struct hami_graph_hold *h)
{
	h->need = NULL;
	if (!__atomic_load_n(&graph_nodes_seen, __ATOMIC_RELAXED))
		return CUDA_SUCCESS;
	return hold(need_of(exec), h);
}

/* After the call (rc): charge what the pools really hold, give the holds back. */
void hami_graph_release(struct hami_graph_hold *h, CUresult rc)
{
	struct hami_exec_need *n = h->need;
	int ordinal;
	if (!n) {
		if (rc == CUDA_SUCCESS && __atomic_load_n(&graph_nodes_seen, __ATOMIC_RELAXED) &&
		    hami_current_device(&ordinal) >= 0)
			settle(ordinal);
		return;
	}
	for (int o = 0; o < HAMI_MAX_CUDA_DEVICES; o++) {
		if (rc == CUDA_SUCCESS && n->bytes[o])
			settle(o);
		if (h->held[o])
			hami_credit(hami_ordinal_device(o), h->held[o]);
	}
	if (rc == CUDA_SUCCESS)
		__atomic_store_n(&n->mapped_at, __atomic_load_n(&trims, __ATOMIC_ACQUIRE) + 1, __ATOMIC_RELEASE);
	h->need = NULL;
}

static CUresult upload(upload_fn fn, CUgraphExec exec, CUstream stream)
{
	struct hami_graph_hold h;
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	if (hami_graph_hold(exec, &h) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* A full GPU refuses the upload and maps nothing: wait for room, upload again. */
	struct hami_driver_room d = HAMI_DRIVER_ROOM_INIT;
	CUresult rc = fn(exec, stream);
	while (hami_driver_room_again(&d, rc, -1, 0, "a CUDA graph's upload"))
		rc = fn(exec, stream);
	hami_driver_room_end(&d);
	hami_graph_release(&h, rc);
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

/* ---- instantiation and its end ------------------------------------------------- */

HAMI_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
	HAMI_IN_DRIVER();
	inst_flags_fn fn = HAMI_REAL(inst_flags_fn, "cuGraphInstantiateWithFlags");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_exec_need *n = exec ? read_need(g) : NULL;
	CUresult rc = fn(exec, g, flags);
	if (rc == CUDA_SUCCESS)
		keep_need(*exec, n);
	else
		free(n);
	return rc;
}

static CUresult instantiate_v2(inst_v2_fn fn, CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log,
			       size_t log_size)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_exec_need *n = exec ? read_need(g) : NULL;
	CUresult rc = fn(exec, g, err_node, log, log_size);
	if (rc == CUDA_SUCCESS)
		keep_need(*exec, n);
	else
		free(n);
	return rc;
}

HAMI_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log,
					   size_t log_size)
{
	HAMI_IN_DRIVER();
	return instantiate_v2(HAMI_REAL(inst_v2_fn, "cuGraphInstantiate_v2"), exec, g, err_node, log, log_size);
}

/* The CUDA 10 name, with the same arguments. */
HAMI_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log,
					size_t log_size)
{
	HAMI_IN_DRIVER();
	return instantiate_v2(HAMI_REAL(inst_v2_fn, "cuGraphInstantiate"), exec, g, err_node, log, log_size);
}

/* With CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD the executable is uploaded (its
 * memory mapped) by the instantiation itself: held first, as for an upload. */
static CUresult instantiate_params(inst_params_fn fn, CUgraphExec *exec, CUgraph g,
				   CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_exec_need *n = exec && params ? read_need(g) : NULL;
	struct hami_graph_hold h = { .need = NULL };
	if (n && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) && hold(n, &h) != CUDA_SUCCESS) {
		free(n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult rc = fn(exec, g, params);
	hami_graph_release(&h, rc);
	if (rc == CUDA_SUCCESS)
		keep_need(*exec, n);
	else
		free(n);
	return rc;
}

HAMI_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph g,
						  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	HAMI_IN_DRIVER();
	return instantiate_params(HAMI_REAL(inst_params_fn, "cuGraphInstantiateWithParams"), exec, g, params);
}

HAMI_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph g,
						       CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	HAMI_IN_DRIVER();
	return instantiate_params(HAMI_REAL(inst_params_fn, "cuGraphInstantiateWithParams_ptsz"), exec, g,
				  params);
}

HAMI_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
	HAMI_IN_DRIVER();
	exec_destroy_fn fn = HAMI_REAL(exec_destroy_fn, "cuGraphExecDestroy");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_GRAPH_EXEC, (uint64_t)(uintptr_t)exec, &r) == 0;
	CUresult rc = fn(exec);
	if (known && rc != CUDA_SUCCESS)
		hami_record_put(&r);
	else if (known)
		free((void *)(uintptr_t)r.pool);
	return rc;
}

HAMI_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
	HAMI_IN_DRIVER();
	trim_fn fn = HAMI_REAL(trim_fn, "cuDeviceGraphMemTrim");
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fn(device);
	if (rc == CUDA_SUCCESS)
		__atomic_add_fetch(&trims, 1, __ATOMIC_ACQ_REL); /* executables not running lost their mapping */
	if (rc == CUDA_SUCCESS && __atomic_load_n(&graph_nodes_seen, __ATOMIC_RELAXED) && hami_setup() == CUDA_SUCCESS)
		settle(device);
	return rc;
}
