/*
 * What one run of a CUDA graph can map from the device's graph memory pool,
 * read from the graph before it runs: its memory allocation nodes, their
 * sizes and devices, and when each is freed again (a free node of the same
 * graph) or not (it outlives the run). The driver may give allocations whose
 * lifetimes cannot overlap the same memory, so the need is the largest set
 * of allocations that can be live at once:
 *
 *  - when the graph orders all its memory nodes one after another (a capture
 *    on one stream), walking them in that order gives it exactly;
 *  - otherwise, for each allocation, itself plus every allocation that no
 *    path in the graph keeps apart from it: never less than the true peak.
 *
 * Allocations are counted in the granularity the driver maps (2 MiB), and a
 * child graph's own need is counted as live for the whole run. A graph too
 * large to walk, or a query the driver refuses, falls back to the sum of all
 * allocations: more than enough, never less.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "hami.h"

#define GRANULE (2ull * HAMI_MIB)
#define MAX_WALK 50000000ull /* memory nodes x (nodes + edges) */
#define MAX_DEPTH 8          /* child graphs inside child graphs */

typedef CUresult (*get_nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*get_edges_fn)(CUgraph, CUgraphNode *, CUgraphNode *, size_t *);
typedef CUresult (*node_type_fn)(CUgraphNode, int *);
typedef CUresult (*alloc_params_fn)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
typedef CUresult (*free_params_fn)(CUgraphNode, CUdeviceptr *);
typedef CUresult (*child_fn)(CUgraphNode, CUgraph *);

struct mem_node {
	size_t node;     /* index among the graph's nodes */
	int is_free;
	int ordinal;     /* alloc: its device */
	uint64_t bytes;  /* alloc: rounded to GRANULE */
	CUdeviceptr ptr;
	long freed_by;   /* alloc: index (among mem nodes) of its free node, -1: outlives the run */
};

struct walk {
	CUgraphNode *nodes;
	size_t n;
	size_t *order;       /* node indices sorted by handle, to find a node by its handle */
	size_t *succ_start;  /* successors of node i: succ[succ_start[i] .. succ_start[i + 1]) */
	size_t *succ;
	struct mem_node *mem;
	size_t nmem;
	unsigned char *reach; /* reach[a * nmem + b]: mem node b comes after mem node a */
};

static int by_handle(const void *a, const void *b, void *nodes)
{
	const CUgraphNode *n = nodes;
	uintptr_t x = (uintptr_t)n[*(const size_t *)a], y = (uintptr_t)n[*(const size_t *)b];
	return x < y ? -1 : x > y;
}

/* Index of node *h*, or -1. */
static long find_node(const struct walk *w, CUgraphNode h)
{
	size_t lo = 0, hi = w->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uintptr_t m = (uintptr_t)w->nodes[w->order[mid]];
		if (m == (uintptr_t)h)
			return (long)w->order[mid];
		if (m < (uintptr_t)h)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

static void walk_free(struct walk *w)
{
	free(w->nodes);
	free(w->order);
	free(w->succ_start);
	free(w->succ);
	free(w->mem);
	free(w->reach);
	memset(w, 0, sizeof(*w));
}

/* The graph's nodes. 0, or -1. */
static int load_nodes(CUgraph g, struct walk *w)
{
	get_nodes_fn get = HAMI_REAL(get_nodes_fn, "cuGraphGetNodes");
	size_t n = 0;
	if (!get || get(g, NULL, &n) != CUDA_SUCCESS)
		return -1;
	if (!n)
		return 0;
	w->nodes = calloc(n, sizeof(*w->nodes));
	w->order = calloc(n, sizeof(*w->order));
	if (!w->nodes || !w->order || get(g, w->nodes, &n) != CUDA_SUCCESS)
		return -1;
	w->n = n;
	for (size_t i = 0; i < n; i++)
		w->order[i] = i;
	qsort_r(w->order, n, sizeof(*w->order), by_handle, w->nodes);
	return 0;
}

/* Successor lists from the graph's edges. 0, or -1. */
static int load_edges(CUgraph g, struct walk *w)
{
	get_edges_fn get = HAMI_REAL(get_edges_fn, "cuGraphGetEdges");
	size_t e = 0;
	if (!get || get(g, NULL, NULL, &e) != CUDA_SUCCESS)
		return -1;
	CUgraphNode *from = calloc(e ? e : 1, sizeof(*from)), *to = calloc(e ? e : 1, sizeof(*to));
	w->succ_start = calloc(w->n + 1, sizeof(*w->succ_start));
	w->succ = calloc(e ? e : 1, sizeof(*w->succ));
	int rc = -1;
	if (!from || !to || !w->succ_start || !w->succ || (e && get(g, from, to, &e) != CUDA_SUCCESS))
		goto out;
	long *src = calloc(e ? e : 1, sizeof(*src));
	if (!src)
		goto out;
	for (size_t i = 0; i < e; i++) {
		long a = find_node(w, from[i]), b = find_node(w, to[i]);
		if (a < 0 || b < 0) {
			free(src);
			goto out;
		}
		src[i] = a;
		w->succ_start[a + 1]++;
	}
	for (size_t i = 0; i < w->n; i++)
		w->succ_start[i + 1] += w->succ_start[i];
	size_t *fill = calloc(w->n, sizeof(*fill));
	if (!fill) {
		free(src);
		goto out;
	}
	for (size_t i = 0; i < e; i++) {
		size_t a = (size_t)src[i];
		w->succ[w->succ_start[a] + fill[a]++] = (size_t)find_node(w, to[i]);
	}
	free(fill);
	free(src);
	rc = 0;
out:
	free(from);
	free(to);
	return rc;
}

static void add_need(uint64_t need[HAMI_MAX_CUDA_DEVICES], int ordinal, uint64_t bytes)
{
	if (ordinal >= 0 && ordinal < HAMI_MAX_CUDA_DEVICES && hami_add(need[ordinal], bytes, &need[ordinal]) < 0)
		need[ordinal] = UINT64_MAX;
}

static int graph_need_at(CUgraph g, uint64_t need[HAMI_MAX_CUDA_DEVICES], int depth);

/* The memory nodes; a child graph's need goes straight into *always*. 0, or -1. */
static int load_memory_nodes(struct walk *w, uint64_t always[HAMI_MAX_CUDA_DEVICES], int depth)
{
	node_type_fn type = HAMI_REAL(node_type_fn, "cuGraphNodeGetType");
	alloc_params_fn alloc_params = HAMI_REAL(alloc_params_fn, "cuGraphMemAllocNodeGetParams");
	free_params_fn free_params = HAMI_REAL(free_params_fn, "cuGraphMemFreeNodeGetParams");
	child_fn child = HAMI_REAL(child_fn, "cuGraphChildGraphNodeGetGraph");
	if (!type)
		return -1;
	w->mem = calloc(w->n ? w->n : 1, sizeof(*w->mem));
	if (!w->mem)
		return -1;
	for (size_t i = 0; i < w->n; i++) {
		int t = -1;
		if (type(w->nodes[i], &t) != CUDA_SUCCESS)
			return -1;
		struct mem_node *m = &w->mem[w->nmem];
		memset(m, 0, sizeof(*m));
		m->node = i;
		m->freed_by = -1;
		if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
			CUDA_MEM_ALLOC_NODE_PARAMS p;
			memset(&p, 0, sizeof(p));
			if (!alloc_params || alloc_params(w->nodes[i], &p) != CUDA_SUCCESS ||
			    p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
				return -1;
			if (hami_round_up(p.bytesize, GRANULE, &m->bytes) < 0)
				m->bytes = UINT64_MAX;
			m->ordinal = p.poolProps.location.id;
			m->ptr = p.dptr;
			w->nmem++;
		} else if (t == CU_GRAPH_NODE_TYPE_MEM_FREE) {
			if (!free_params || free_params(w->nodes[i], &m->ptr) != CUDA_SUCCESS)
				return -1;
			m->is_free = 1;
			w->nmem++;
		} else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
			CUgraph body;
			if (depth >= MAX_DEPTH || !child || child(w->nodes[i], &body) != CUDA_SUCCESS ||
			    graph_need_at(body, always, depth + 1) < 0)
				return -1;
		}
	}
	/* Each allocation's free node in this graph, if it has one. */
	for (size_t f = 0; f < w->nmem; f++) {
		if (!w->mem[f].is_free)
			continue;
		for (size_t a = 0; a < w->nmem; a++)
			if (!w->mem[a].is_free && w->mem[a].ptr == w->mem[f].ptr && w->mem[a].freed_by < 0) {
				w->mem[a].freed_by = (long)f;
				break;
			}
	}
	return 0;
}

/* reach[a][b] for every pair of memory nodes: a depth-first walk from each. 0, or -1. */
static int load_reach(struct walk *w)
{
	long *mem_of = malloc(w->n * sizeof(*mem_of));
	size_t *stack = malloc((w->n + 1) * sizeof(*stack));
	unsigned *seen = calloc(w->n, sizeof(*seen));
	w->reach = calloc(w->nmem * w->nmem, 1);
	int rc = -1;
	if (!mem_of || !stack || !seen || !w->reach)
		goto out;
	for (size_t i = 0; i < w->n; i++)
		mem_of[i] = -1;
	for (size_t m = 0; m < w->nmem; m++)
		mem_of[w->mem[m].node] = (long)m;
	for (size_t a = 0; a < w->nmem; a++) {
		unsigned stamp = (unsigned)a + 1;
		size_t top = 0;
		stack[top++] = w->mem[a].node;
		seen[w->mem[a].node] = stamp;
		while (top) {
			size_t v = stack[--top];
			for (size_t k = w->succ_start[v]; k < w->succ_start[v + 1]; k++) {
				size_t s = w->succ[k];
				if (seen[s] == stamp)
					continue;
				seen[s] = stamp;
				stack[top++] = s;
				if (mem_of[s] >= 0)
					w->reach[a * w->nmem + (size_t)mem_of[s]] = 1;
			}
		}
	}
	rc = 0;
out:
	free(mem_of);
	free(stack);
	free(seen);
	return rc;
}

static int before(const struct walk *w, long a, long b)
{
	return a >= 0 && b >= 0 && w->reach[(size_t)a * w->nmem + (size_t)b];
}

/* Allocations a and b may be live at the same time: neither is freed on every path before the other is made. */
static int may_overlap(const struct walk *w, size_t a, size_t b)
{
	return !before(w, w->mem[a].freed_by, (long)b) && !before(w, w->mem[b].freed_by, (long)a);
}

static int totally_ordered(const struct walk *w)
{
	for (size_t a = 0; a < w->nmem; a++)
		for (size_t b = a + 1; b < w->nmem; b++)
			if (!before(w, (long)a, (long)b) && !before(w, (long)b, (long)a))
				return 0;
	return 1;
}

/* In a total order, a node's rank is how many memory nodes come before it. */
static size_t rank_of(const struct walk *w, size_t m)
{
	size_t r = 0;
	for (size_t a = 0; a < w->nmem; a++)
		r += before(w, (long)a, (long)m);
	return r;
}

/* The exact peak per device, walking the memory nodes in their one order. */
static void peak_in_order(const struct walk *w, uint64_t need[HAMI_MAX_CUDA_DEVICES])
{
	size_t *at = calloc(w->nmem, sizeof(*at));
	uint64_t live[HAMI_MAX_CUDA_DEVICES] = { 0 }, peak[HAMI_MAX_CUDA_DEVICES] = { 0 };
	if (!at) { /* no memory to sort: the sum, which is never less */
		for (size_t m = 0; m < w->nmem; m++)
			if (!w->mem[m].is_free)
				add_need(need, w->mem[m].ordinal, w->mem[m].bytes);
		return;
	}
	for (size_t m = 0; m < w->nmem; m++)
		at[rank_of(w, m)] = m;
	for (size_t k = 0; k < w->nmem; k++) {
		const struct mem_node *m = &w->mem[at[k]];
		if (m->is_free) {
			for (size_t a = 0; a < w->nmem; a++) {
				const struct mem_node *x = &w->mem[a];
				if (!x->is_free && x->freed_by == (long)at[k] && x->ordinal >= 0 &&
				    x->ordinal < HAMI_MAX_CUDA_DEVICES)
					live[x->ordinal] = live[x->ordinal] > x->bytes ? live[x->ordinal] - x->bytes : 0;
			}
			continue;
		}
		if (m->ordinal < 0 || m->ordinal >= HAMI_MAX_CUDA_DEVICES)
			continue;
		if (hami_add(live[m->ordinal], m->bytes, &live[m->ordinal]) < 0)
			live[m->ordinal] = UINT64_MAX;
		if (live[m->ordinal] > peak[m->ordinal])
			peak[m->ordinal] = live[m->ordinal];
	}
	for (int d = 0; d < HAMI_MAX_CUDA_DEVICES; d++)
		add_need(need, d, peak[d]);
	free(at);
}

/* An upper bound per device: for each allocation, itself and all that may overlap it. */
static void peak_bound(const struct walk *w, uint64_t need[HAMI_MAX_CUDA_DEVICES])
{
	uint64_t peak[HAMI_MAX_CUDA_DEVICES] = { 0 };
	for (size_t b = 0; b < w->nmem; b++) {
		const struct mem_node *mb = &w->mem[b];
		if (mb->is_free || mb->ordinal < 0 || mb->ordinal >= HAMI_MAX_CUDA_DEVICES)
			continue;
		uint64_t sum = 0;
		for (size_t a = 0; a < w->nmem; a++) {
			const struct mem_node *ma = &w->mem[a];
			if (ma->is_free || ma->ordinal != mb->ordinal || (a != b && !may_overlap(w, a, b)))
				continue;
			if (hami_add(sum, ma->bytes, &sum) < 0)
				sum = UINT64_MAX;
		}
		if (sum > peak[mb->ordinal])
			peak[mb->ordinal] = sum;
	}
	for (int d = 0; d < HAMI_MAX_CUDA_DEVICES; d++)
		add_need(need, d, peak[d]);
}

static int graph_need_at(CUgraph g, uint64_t need[HAMI_MAX_CUDA_DEVICES], int depth)
{
	struct walk w;
	memset(&w, 0, sizeof(w));
	int rc = -1;
	if (load_nodes(g, &w) < 0 || load_memory_nodes(&w, need, depth) < 0)
		goto out;
	rc = 0;
	size_t allocs = 0;
	for (size_t m = 0; m < w.nmem; m++)
		allocs += !w.mem[m].is_free;
	if (!allocs)
		goto out;
	uint64_t work;
	if (hami_mul(w.nmem, w.n * 2, &work) < 0 || work > MAX_WALK || load_edges(g, &w) < 0 ||
	    load_reach(&w) < 0) {
		for (size_t m = 0; m < w.nmem; m++) /* the sum: never less than the peak */
			if (!w.mem[m].is_free)
				add_need(need, w.mem[m].ordinal, w.mem[m].bytes);
		goto out;
	}
	if (totally_ordered(&w))
		peak_in_order(&w, need);
	else
		peak_bound(&w, need);
out:
	walk_free(&w);
	return rc;
}

/*
 * need[ordinal] += what one run of graph *g* can map on each CUDA device.
 * 0, or -1 when the graph cannot be read (its need is then unknown).
 */
int hami_graph_need(CUgraph g, uint64_t need[HAMI_MAX_CUDA_DEVICES])
{
	int mode = hami_capture_relaxed_begin();
	int rc = graph_need_at(g, need, 0);
	hami_capture_relaxed_end(mode);
	return rc;
}
