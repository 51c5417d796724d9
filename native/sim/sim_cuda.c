/*
 * libcuda.so.1 of the simulated GPU: the driver API subset hami-jupyter uses,
 * with the real ABI. What matters most is that every byte a call takes or
 * gives back is charged to the shared device (sim_state) exactly as the real
 * driver would take it, so the device's used/peak_used witness what any
 * process really got. Allocations also hold bytes (sim_mem.c): copies move
 * real data, which a checkpoint saves and a restore brings back.
 *
 * Process-local objects (contexts, streams, pools, modules, functions, arrays,
 * memory handles, events, graphs and graph executables) live in a slot table;
 * a handle encodes slot, generation and kind, so a stale or foreign handle is
 * refused instead of dereferenced.
 * Device pointers are numbers from a private range, kept sorted for range
 * lookups. One process-local mutex guards all of it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "sim_api.h"
#include "sim_mem.h"
#include "sim_state.h"

#define GRAN (2ull << 20)       /* allocation granularity, pool growth step */
#define PITCH_ALIGN 512ull
#define VA_BASE (1ull << 40)    /* device addresses start here */
#define VA_END (1ull << 62)
#define CTX_STACK 256
#define DRIVER_VERSION 13000

enum kind {
	K_NONE, K_CTX, K_STREAM, K_POOL, K_MODULE, K_FUNC, K_ARRAY, K_MIPMAP, K_MEMHANDLE, K_EVENT, K_GRAPH, K_GEXEC,
	K_GNODE /* handles only: a graph's memory node (graph_node_handle) */
};

/* A stream's capture: its CUstreamCaptureStatus. */
enum { CAPTURE_NONE = SIM_CU_STREAM_CAPTURE_STATUS_NONE, CAPTURE_ACTIVE = SIM_CU_STREAM_CAPTURE_STATUS_ACTIVE,
       CAPTURE_INVALIDATED = SIM_CU_STREAM_CAPTURE_STATUS_INVALIDATED };

/* A graph's memory nodes, in capture order (kernels are only counted). */
enum gnode_kind {
	GN_ALLOC,   /* an allocation node: its address, taken at capture */
	GN_FREE,    /* a free node of an allocation node of the same graph */
	GN_FREE_EXT /* a free node of an allocation made before the capture */
};

struct gnode {
	enum gnode_kind kind;
	CUdeviceptr addr;
	uint64_t size; /* alloc, free: the allocation's size as asked */
	int freed;     /* alloc: a free node of the same graph frees it */
	int ordinal;   /* alloc: the CUDA ordinal it was captured for */
};

/* Work a stream holds back behind a cuStreamWaitValue32 whose condition is
 * not met yet, in stream order. */
enum held_kind { H_WAIT, H_WRITE, H_KERNEL, H_EVENT };

struct held {
	enum held_kind kind;
	unsigned flags;  /* wait: CUstreamWaitValue_flags */
	CUdeviceptr addr; /* wait, write: the 32-bit word */
	uint32_t value;
	uint64_t ns;  /* kernel: its duration */
	uint64_t obj; /* kernel: its graph executable (0: none); event: the event */
	uint64_t seq; /* event: which of its records */
};

/* The end of work a stream holds back: not known until the wait is met. */
#define HELD_END UINT64_MAX
/* How often a synchronize looks again while the work it waits for is held back. */
#define HELD_POLL_NS 1000000ull

struct obj {
	enum kind kind;
	int dev;           /* physical device; -1 for host memory handles */
	int ordinal;       /* ctx: the CUDA ordinal it was made for */
	uint64_t ctx;      /* owning context: streams, modules, functions, arrays */
	uint64_t parent;   /* function: its module */
	uint64_t bytes;    /* device memory held: contexts, arrays, memory handles */
	uint64_t last_end; /* ctx, stream: when the last launch on it ends; event: when it completes */
	unsigned flags;
	int recorded; /* event */
	/* stream: its capture; graph, exec: what a launch runs (kernels back to
	 * back, ns in all); stream under capture: what it captured so far */
	int capture;
	uint64_t kernels, ns;
	/* stream under capture: its mode, the thread that began it, the graph it
	 * fills (handed out by cuStreamEndCapture) and the sequence's id */
	int cap_mode;
	uint64_t cap_thread, cap_graph, cap_id;
	/* graph, exec: memory nodes */
	struct gnode *nodes;
	size_t nnodes, cap_nodes;
	int capturing;   /* graph: a capture still fills it */
	unsigned execs;  /* graph with memory nodes: its live executables (at most one) */
	int mdev;        /* graph, exec: the device its memory nodes allocate on */
	uint64_t graph;  /* exec: the graph it was instantiated from */
	uint64_t need;   /* exec: graph pool bytes one run needs (its allocations' peak) */
	uint64_t mapped; /* exec: graph pool bytes mapped to it */
	unsigned live;   /* exec: its allocations still live after a run (not freed in the graph) */
	uint64_t live_bytes;
	int primary, active; /* ctx */
	uint64_t local;      /* ctx: local memory its launches made the driver keep */
	int code_loaded;     /* module: its code is on the device (bytes) */
	uint64_t ctx_id;     /* ctx: cuCtxGetId's answer, new at each activation */
	unsigned held_streams; /* ctx: its streams that hold work back */
	uint64_t seq;        /* event: its records so far */
	/* stream: work held back behind an unmet wait (none: runs as it comes) */
	struct held *held;
	size_t nheld, cap_held;
	/* pool */
	int is_default, dying;
	uint64_t reserved, used, reserved_high, used_high, threshold, max_size;
	char *name; /* function */
	/* memory handle (cuMemCreate): its bytes are an extent of the backing
	 * file; it lives while the program holds a reference (refs: the create
	 * and each cuMemRetainAllocationHandle) or a mapping uses it (maps) */
	uint64_t vsize, voff;
	unsigned char *vhost;
	int vdirty;
	uint32_t refs, maps;
	CUmemAllocationProp prop;
	/* ctx: the sticky error of a fault (an illegal address), 0 while none;
	 * the physical devices whose memory it may reach (peer access) */
	CUresult fault;
	uint32_t peers;
};

struct slot {
	uint32_t gen;
	uint32_t next_free;
	struct obj *o;
};

struct alloc {
	CUdeviceptr base;
	uint64_t size;    /* as asked: range checks */
	uint64_t charged; /* device bytes it holds itself; 0 for pool memory */
	uint64_t ctx;
	uint64_t pool; /* 0 unless stream-ordered */
	int dev;
	int live;
	/* its bytes: an extent of the backing file, mapped at the first copy */
	uint64_t off;
	unsigned char *host;
	int dirty; /* written by a copy: the extent's data must go on free */
	int managed; /* cuMemAllocManaged */
	/* A graph allocation a run left live: its memory is the graph pool's
	 * (footprint bytes, mapped to the executable GEXEC, 0 once destroyed). */
	int graph;
	uint64_t gexec, footprint;
};

/* An address range cuMemAddressReserve handed out. */
struct vres {
	CUdeviceptr base;
	uint64_t size;
};

/* Physical memory mapped into a reserved range (cuMemMap): HANDLE's bytes from
 * OFFSET on. ACCESS: bit d set when physical device d may read it, WRITE when
 * it may also write (cuMemSetAccess; none at first). */
struct vmap {
	CUdeviceptr base;
	uint64_t size;
	uint64_t handle, offset;
	uint32_t access, write;
};

/* A device's graph memory pool (this process's). reserved is charged to the
 * device; used is what is associated with graphs: the executables' mappings
 * plus orphan, the live allocations of destroyed executables. */
struct gpool {
	uint64_t reserved, reserved_high, used, used_high, orphan;
};

static struct {
	pthread_mutex_t mu;
	_Atomic int inited;
	CUresult init_rc;
	unsigned nvis;
	int vis[SIM_MAX_DEVICES]; /* ordinal -> physical device */
	struct slot *slots;
	uint32_t nslots, cap, free_head, gen;
	struct alloc *al; /* sorted by base: bases only grow */
	size_t nal, cap_al, dead_al;
	uint64_t next_va;
	uint64_t prim[SIM_MAX_DEVICES]; /* primary context handles */
	unsigned prim_refs[SIM_MAX_DEVICES];
	unsigned prim_flags[SIM_MAX_DEVICES];
	uint64_t def_pool[SIM_MAX_DEVICES];
	uint64_t cur_pool[SIM_MAX_DEVICES];
	struct gpool gp[SIM_MAX_DEVICES];
	uint64_t internal[SIM_MAX_DEVICES]; /* hamiSimDriverInternal's bytes */
	uint64_t own[SIM_MAX_DEVICES];      /* modules' code and contexts' local memory */
	int eager;                          /* CUDA_MODULE_LOADING=EAGER: code loads with its module */
	/* virtual memory management: reserved ranges and the mappings in them,
	 * each sorted by base */
	struct vres *vr;
	size_t nvr, cap_vr;
	struct vmap *vm;
	size_t nvm, cap_vm;
	unsigned ncaptures;                 /* streams capturing (active or invalidated) */
	uint64_t capture_ids;
	uint64_t ctx_ids;
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .free_head = UINT32_MAX, .next_va = VA_BASE};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void held_drop(struct obj *so);
static struct vmap *vm_find(CUdeviceptr p, size_t *at);
static struct vres *vr_find(CUdeviceptr p);

/* The calling thread's context stack; the top is the current context. */
static __thread uint64_t t_stack[CTX_STACK];
static __thread int t_depth;

/* The calling thread's stream capture interaction mode
 * (cuThreadExchangeStreamCaptureMode; GLOBAL by default), and a number for it
 * that no other thread of the process ever has. */
static __thread int t_capmode = SIM_CU_STREAM_CAPTURE_MODE_GLOBAL;
static __thread uint64_t t_id;
static _Atomic uint64_t thread_ids;

static uint64_t thread_id(void)
{
	if (!t_id)
		t_id = atomic_fetch_add(&thread_ids, 1) + 1;
	return t_id;
}

#define H(x) ((uint64_t)(uintptr_t)(x))

static struct sim_state *S(void)
{
	return sim_st();
}

static CUresult ready(void)
{
	return atomic_load(&C.inited) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* The checkpoint gate. Every entry point a program works through (devices,
 * contexts, memory, copies, streams, modules, launches, events, graphs)
 * begins with GATE(): while another process holds this one locked or
 * checkpointed the call waits there, holding nothing; then it counts as in
 * flight until it returns, so that a lock waits for it. Not gated: cuInit,
 * cuDriverGetVersion, cuGetErrorString/Name, cuGetProcAddress,
 * cuGetExportTable and the checkpoint calls. Calls from within a gated call
 * pass: only the outermost counts. */
static __thread int t_gated;

static int gate_enter(void)
{
	if (t_gated++ || !atomic_load(&C.inited))
		return -1;
	return sim_gate_enter();
}

static void gate_leave(int *entry)
{
	t_gated--;
	sim_gate_leave(*entry);
}

#define GATE() int gate_ __attribute__((cleanup(gate_leave))) = gate_enter()

static int phys(CUdevice d)
{
	return d >= 0 && (unsigned)d < C.nvis ? C.vis[d] : -1;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return v > UINT64_MAX - (a - 1) ? UINT64_MAX / a * a : (v + a - 1) / a * a;
}

static CUresult charge(int dev, uint64_t bytes)
{
	int r = sim_charge((unsigned)dev, bytes);
	return r == SIM_OK ? CUDA_SUCCESS : r == SIM_ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
}

/* What the driver holds by itself on DEV changed by DELTA bytes (already
 * charged or uncharged): the process entry shows it as driver-internal. C.mu held. */
static void own_add(int dev, int64_t delta)
{
	C.own[dev] += (uint64_t)delta;
	sim_note_internal((unsigned)dev, C.internal[dev] + C.own[dev]);
}

/* ---- objects ------------------------------------------------------------ */

static uint64_t obj_new(enum kind k, struct obj **out)
{
	uint32_t i;
	struct obj *o = calloc(1, sizeof(*o));
	if (!o)
		return 0;
	if (C.free_head != UINT32_MAX) {
		i = C.free_head;
		C.free_head = C.slots[i].next_free;
	} else {
		if (C.nslots == C.cap) {
			uint32_t cap = C.cap ? C.cap * 2 : 64;
			struct slot *s = cap < (1u << 24) ? realloc(C.slots, cap * sizeof(*s)) : NULL;
			if (!s) {
				free(o);
				return 0;
			}
			C.slots = s;
			C.cap = cap;
		}
		i = C.nslots++;
	}
	if (++C.gen == 0)
		C.gen = 1;
	C.slots[i].gen = C.gen;
	C.slots[i].o = o;
	o->kind = k;
	o->dev = -1;
	*out = o;
	return (uint64_t)C.gen << 32 | (uint64_t)(i + 1) << 8 | (uint64_t)k;
}

static struct obj *obj_get(uint64_t h, enum kind k)
{
	uint64_t i = (h >> 8) & 0xffffff;
	if ((h & 0xff) != (uint64_t)k || i == 0 || i > C.nslots)
		return NULL;
	struct slot *s = &C.slots[i - 1];
	if (!s->o || s->gen != (uint32_t)(h >> 32) || s->o->kind != k)
		return NULL;
	return s->o;
}

static void obj_free(uint64_t h)
{
	uint32_t i = (uint32_t)((h >> 8) & 0xffffff) - 1;
	struct obj *o = C.slots[i].o;
	free(o->name);
	free(o->nodes);
	free(o->held);
	free(o);
	C.slots[i].o = NULL;
	C.slots[i].next_free = C.free_head;
	C.free_head = i;
}

static uint64_t slot_handle(uint32_t i)
{
	return (uint64_t)C.slots[i].gen << 32 | (uint64_t)(i + 1) << 8 | (uint64_t)C.slots[i].o->kind;
}

/* ---- device pointers ---------------------------------------------------- */

/* Addresses are never reused; a gap after each allocation keeps neighbours
 * apart so that an overrun is outside every allocation. */
static CUdeviceptr va_take(uint64_t size)
{
	uint64_t span = round_up(size, GRAN);
	if (span > VA_END - C.next_va || VA_END - C.next_va - span < GRAN)
		return 0;
	CUdeviceptr p = C.next_va;
	C.next_va += span + GRAN;
	return p;
}

static int al_reserve(void)
{
	if (C.nal < C.cap_al)
		return 1;
	size_t cap = C.cap_al ? C.cap_al * 2 : 256;
	struct alloc *a = realloc(C.al, cap * sizeof(*a));
	if (!a)
		return 0;
	C.al = a;
	C.cap_al = cap;
	return 1;
}

/* After al_reserve: cannot fail. */
static void al_push(CUdeviceptr base, uint64_t size, uint64_t charged, uint64_t ctx, uint64_t pool, int dev,
		    uint64_t off)
{
	C.al[C.nal++] = (struct alloc){.base = base, .size = size, .charged = charged, .ctx = ctx, .pool = pool,
				       .dev = dev, .live = 1, .off = off};
}

/* After al_room(1): a record at its place in base order (graph allocations
 * come back at the address their node took at capture), after any dead
 * record of the same base. */
static struct alloc *al_insert(CUdeviceptr base, uint64_t size, uint64_t ctx, int dev, uint64_t off)
{
	size_t lo = 0, hi = C.nal;
	while (lo < hi) { /* first base > base */
		size_t mid = lo + (hi - lo) / 2;
		if (C.al[mid].base <= base)
			lo = mid + 1;
		else
			hi = mid;
	}
	memmove(&C.al[lo + 1], &C.al[lo], (C.nal - lo) * sizeof(*C.al));
	C.nal++;
	C.al[lo] = (struct alloc){.base = base, .size = size, .ctx = ctx, .dev = dev, .live = 1, .off = off};
	return &C.al[lo];
}

/* Room for N more records. */
static int al_room(size_t n)
{
	while (C.cap_al - C.nal < n) {
		size_t cap = C.cap_al ? C.cap_al * 2 : 256;
		struct alloc *a = realloc(C.al, cap * sizeof(*a));
		if (!a)
			return 0;
		C.al = a;
		C.cap_al = cap;
	}
	return 1;
}

/* The live allocation starting at P (exact) or containing P. */
static struct alloc *al_find(CUdeviceptr p, int exact)
{
	size_t lo = 0, hi = C.nal;
	while (lo < hi) { /* first base > p */
		size_t mid = lo + (hi - lo) / 2;
		if (C.al[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	struct alloc *a = &C.al[lo - 1];
	if (!a->live)
		return NULL;
	if (exact)
		return a->base == p ? a : NULL;
	return p - a->base < a->size ? a : NULL;
}

/* Drop dead records once they are the majority (never while iterating). */
static void al_compact(void)
{
	if (C.dead_al < 64 || C.dead_al * 2 < C.nal)
		return;
	size_t n = 0;
	for (size_t i = 0; i < C.nal; i++)
		if (C.al[i].live)
			C.al[n++] = C.al[i];
	C.nal = n;
	C.dead_al = 0;
}

/* ---- pools -------------------------------------------------------------- */

static void pool_trim(struct obj *p, uint64_t keep)
{
	uint64_t target = round_up(p->used, GRAN);
	uint64_t k = round_up(keep, GRAN);
	if (k > target)
		target = k;
	if (target < p->reserved) {
		sim_uncharge((unsigned)p->dev, p->reserved - target);
		p->reserved = target;
	}
}

/* Reuse free reserved bytes first; grow by the shortfall in GRAN steps. */
static CUresult pool_take(struct obj *p, uint64_t size)
{
	uint64_t spare = p->reserved - p->used;
	if (size > spare) {
		uint64_t grow = round_up(size - spare, GRAN);
		if (grow < size - spare || (p->max_size && grow > p->max_size - p->reserved))
			return CUDA_ERROR_OUT_OF_MEMORY;
		CUresult r = charge(p->dev, grow);
		if (r)
			return r;
		p->reserved += grow;
		if (p->reserved > p->reserved_high)
			p->reserved_high = p->reserved;
	}
	p->used += size;
	if (p->used > p->used_high)
		p->used_high = p->used;
	return CUDA_SUCCESS;
}

static void pool_give(uint64_t h, uint64_t size)
{
	struct obj *p = obj_get(h, K_POOL);
	if (!p)
		return;
	p->used = p->used > size ? p->used - size : 0;
	if (p->dying && p->used == 0) {
		sim_uncharge((unsigned)p->dev, p->reserved);
		obj_free(h);
	}
}

/* Pools of DEV give back what they may: after a synchronize or a context's end. */
static void pools_settle(int dev)
{
	for (uint32_t i = 0; i < C.nslots; i++) {
		struct obj *o = C.slots[i].o;
		if (o && o->kind == K_POOL && o->dev == dev)
			pool_trim(o, o->threshold);
	}
}

static uint64_t default_pool(int dev)
{
	if (!obj_get(C.def_pool[dev], K_POOL)) {
		struct obj *o;
		uint64_t h = obj_new(K_POOL, &o);
		if (!h)
			return 0;
		o->dev = dev;
		o->is_default = 1;
		C.def_pool[dev] = h;
	}
	return C.def_pool[dev];
}

static uint64_t current_pool(int dev)
{
	return obj_get(C.cur_pool[dev], K_POOL) ? C.cur_pool[dev] : default_pool(dev);
}

/* ---- the graph memory pools --------------------------------------------- */

/*
 * Graph allocations take no memory when captured. An executable maps what one
 * run of it needs (its allocations' peak, each rounded to GRAN) at its first
 * launch or upload, out of its device's graph pool: spare reserved bytes
 * first, then the pool grows (charged to the device, or OUT_OF_MEMORY). The
 * mapping stays for relaunches; destroying the executable leaves it reserved
 * as spare, and only cuDeviceGraphMemTrim (or the end of a context on the
 * device) gives spare memory back, along with the mappings of executables not
 * running. Allocations a run leaves live keep their bytes in use throughout.
 */

static void sub_to_zero(uint64_t *v, uint64_t n)
{
	*v = *v > n ? *v - n : 0;
}

/* High watermarks, and the figure hami-simctl shows for our entry. */
static void gp_note(int dev)
{
	struct gpool *g = &C.gp[dev];
	if (g->used > g->used_high)
		g->used_high = g->used;
	if (g->reserved > g->reserved_high)
		g->reserved_high = g->reserved;
	sim_note_graph((unsigned)dev, g->reserved);
}

/* A live graph allocation was freed: its bytes stay mapped to its executable,
 * or, that gone, become spare. */
static void graph_alloc_gone(struct alloc *a)
{
	struct obj *x = a->gexec ? obj_get(a->gexec, K_GEXEC) : NULL;
	if (x) {
		x->live = x->live ? x->live - 1 : 0;
		sub_to_zero(&x->live_bytes, a->footprint);
		return;
	}
	struct gpool *g = &C.gp[a->dev];
	sub_to_zero(&g->orphan, a->footprint);
	sub_to_zero(&g->used, a->footprint);
	gp_note(a->dev);
}

/* Map what executable X needs; OUT_OF_MEMORY (nothing changed) when the
 * device has no room for the pool to grow. */
static CUresult exec_map(struct obj *x)
{
	if (x->mapped >= x->need)
		return CUDA_SUCCESS;
	struct gpool *g = &C.gp[x->mdev];
	uint64_t shortfall = x->need - x->mapped, spare = g->reserved - g->used;
	uint64_t grow = shortfall > spare ? shortfall - spare : 0;
	if (grow) {
		CUresult r = charge(x->mdev, grow);
		if (r)
			return r;
		g->reserved += grow;
	}
	g->used += shortfall;
	x->mapped = x->need;
	gp_note(x->mdev);
	return CUDA_SUCCESS;
}

/* cuDeviceGraphMemTrim: executables whose work has ended keep only what their
 * live allocations use; every byte not associated with a graph goes back. */
static void gpool_trim(int dev)
{
	struct gpool *g = &C.gp[dev];
	uint64_t now = sim_now_ns();
	for (uint32_t i = 0; i < C.nslots; i++) {
		struct obj *x = C.slots[i].o;
		if (!x || x->kind != K_GEXEC || x->mdev != dev || x->mapped <= x->live_bytes || x->last_end > now)
			continue;
		sub_to_zero(&g->used, x->mapped - x->live_bytes);
		x->mapped = x->live_bytes;
	}
	if (g->reserved > g->used) {
		sim_uncharge((unsigned)dev, g->reserved - g->used);
		g->reserved = g->used;
	}
	gp_note(dev);
}

/* ---- allocations -------------------------------------------------------- */

static void alloc_release(struct alloc *a)
{
	sim_mem_release(a->off, a->size, a->host, a->dirty);
	a->host = NULL;
	if (a->graph)
		graph_alloc_gone(a);
	else if (a->pool)
		pool_give(a->pool, a->size);
	else
		sim_uncharge((unsigned)a->dev, a->charged);
	a->live = 0;
	C.dead_al++;
}

/* A plain allocation of SIZE addressable bytes taking BYTES of DEV. */
static CUresult alloc_plain(CUdeviceptr *dptr, uint64_t size, uint64_t bytes, uint64_t ctxh, int dev)
{
	uint64_t off;
	if (!al_reserve())
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUdeviceptr base = va_take(size);
	if (!base || sim_mem_reserve(size, &off) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = charge(dev, bytes);
	if (r) {
		sim_mem_release(off, size, NULL, 0);
		return r;
	}
	al_push(base, size, bytes, ctxh, 0, dev, off);
	*dptr = base;
	return CUDA_SUCCESS;
}

/* ---- capture bookkeeping ------------------------------------------------ */

/* Executable H goes: its mapping minus what its live allocations use becomes
 * spare; those allocations stay live (and in use) until freed. */
static void exec_destroy(uint64_t h, struct obj *x)
{
	int dev = x->mdev;
	struct gpool *g = &C.gp[dev];
	if (x->live) {
		for (size_t i = 0; i < C.nal; i++)
			if (C.al[i].live && C.al[i].graph && C.al[i].gexec == h)
				C.al[i].gexec = 0;
		g->orphan += x->live_bytes;
	}
	sub_to_zero(&g->used, x->mapped - x->live_bytes);
	struct obj *gr = obj_get(x->graph, K_GRAPH);
	if (gr && gr->execs)
		gr->execs--;
	obj_free(h);
	gp_note(dev);
}

/* A stream's capture ends without a graph (stream destroyed, capture
 * invalidated and ended). */
static void capture_drop(struct obj *so)
{
	if (so->capture == CAPTURE_NONE)
		return;
	if (obj_get(so->cap_graph, K_GRAPH))
		obj_free(so->cap_graph);
	so->capture = CAPTURE_NONE;
	so->cap_graph = 0;
	if (C.ncaptures)
		C.ncaptures--;
}

/*
 * A capture-unsafe call (cuMemAlloc, cuMemFree, cuCtxSynchronize...) from the
 * calling thread; C.mu held. As the driver documents the interaction modes:
 * a thread whose mode is RELAXED may make them; otherwise they are prohibited
 * while the thread itself has a capture under way that did not begin RELAXED,
 * and, when the thread's mode is GLOBAL, while any other thread has a capture
 * under way that began GLOBAL. A prohibited call does nothing and answers
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and every capture that prohibited it
 * is invalidated. An invalidated capture still counts until its
 * cuStreamEndCapture.
 */
static CUresult capture_unsafe(void)
{
	if (!C.ncaptures || t_capmode == SIM_CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_SUCCESS;
	uint64_t me = thread_id();
	int hit = 0;
	for (uint32_t i = 0; i < C.nslots; i++) {
		struct obj *o = C.slots[i].o;
		if (!o || o->kind != K_STREAM || o->capture == CAPTURE_NONE ||
		    o->cap_mode == SIM_CU_STREAM_CAPTURE_MODE_RELAXED)
			continue;
		if (o->cap_thread == me ||
		    (o->cap_mode == SIM_CU_STREAM_CAPTURE_MODE_GLOBAL && t_capmode == SIM_CU_STREAM_CAPTURE_MODE_GLOBAL)) {
			o->capture = CAPTURE_INVALIDATED;
			hit = 1;
		}
	}
	return hit ? SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* A captured operation that failed invalidates its capture (as an error
 * during capture does on the real driver). */
static CUresult capture_fail(struct obj *so, CUresult r)
{
	if (r != CUDA_SUCCESS && r != SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
		so->capture = CAPTURE_INVALIDATED;
	return r;
}

static int graph_node_add(struct obj *g, struct gnode n)
{
	if (g->nnodes == g->cap_nodes) {
		size_t cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
		struct gnode *a = realloc(g->nodes, cap * sizeof(*a));
		if (!a)
			return 0;
		g->nodes = a;
		g->cap_nodes = cap;
	}
	g->nodes[g->nnodes++] = n;
	return 1;
}

/* [P, P + N) lies in a live allocation, or in an allocation node of SO's
 * capture that no free node freed yet. */
static int capture_range_ok(struct obj *so, CUdeviceptr p, size_t n)
{
	struct alloc *a = al_find(p, 0);
	if (a)
		return n <= a->base + a->size - p;
	struct vmap *m = vm_find(p, NULL);
	if (m)
		return n <= m->base + m->size - p;
	struct obj *g = obj_get(so->cap_graph, K_GRAPH);
	for (size_t i = 0; g && i < g->nnodes; i++) {
		const struct gnode *k = &g->nodes[i];
		if (k->kind == GN_ALLOC && !k->freed && p >= k->addr && p - k->addr < k->size)
			return n <= k->addr + k->size - p;
	}
	return 0;
}

/* cuMemAllocAsync / cuMemAllocFromPoolAsync on capturing stream SO: an
 * allocation node. Its address is taken now and is its own for good; no
 * memory is (POOL: a given pool must be valid; its memory is not used). */
static CUresult capture_alloc(struct obj *so, CUdeviceptr *dptr, uint64_t size, uint64_t poolh)
{
	if (so->capture == CAPTURE_INVALIDATED)
		return SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	struct obj *p = poolh ? obj_get(poolh, K_POOL) : NULL;
	if (poolh && (!p || p->dying))
		return capture_fail(so, CUDA_ERROR_INVALID_VALUE);
	struct obj *g = obj_get(so->cap_graph, K_GRAPH);
	CUdeviceptr base = va_take(size);
	struct obj *c = obj_get(so->ctx, K_CTX);
	if (!g || !base || !graph_node_add(g, (struct gnode){GN_ALLOC, base, size, 0, c ? c->ordinal : 0}))
		return capture_fail(so, CUDA_ERROR_OUT_OF_MEMORY);
	*dptr = base;
	return CUDA_SUCCESS;
}

/* cuMemFreeAsync on capturing stream SO: a free node, of an allocation node
 * of the same capture (once), or of a live allocation made before it (freed
 * when the graph runs). */
static CUresult capture_free(struct obj *so, CUdeviceptr p)
{
	if (so->capture == CAPTURE_INVALIDATED)
		return SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	struct obj *g = obj_get(so->cap_graph, K_GRAPH);
	if (!g)
		return capture_fail(so, CUDA_ERROR_INVALID_VALUE);
	for (size_t i = 0; i < g->nnodes; i++) {
		struct gnode *k = &g->nodes[i];
		if (k->addr != p || k->kind == GN_FREE)
			continue;
		if (k->kind == GN_FREE_EXT || k->freed)
			return capture_fail(so, CUDA_ERROR_INVALID_VALUE); /* freed twice */
		if (!graph_node_add(g, (struct gnode){GN_FREE, p, k->size, 0, 0}))
			return capture_fail(so, CUDA_ERROR_OUT_OF_MEMORY);
		g->nodes[i].freed = 1; /* (the add may have moved the array) */
		return CUDA_SUCCESS;
	}
	struct alloc *a = p ? al_find(p, 1) : NULL;
	if (!a)
		return capture_fail(so, CUDA_ERROR_INVALID_VALUE);
	if (!graph_node_add(g, (struct gnode){GN_FREE_EXT, p, a->size, 0, 0}))
		return capture_fail(so, CUDA_ERROR_OUT_OF_MEMORY);
	return CUDA_SUCCESS;
}

static CUresult unsafe_call(void)
{
	pthread_mutex_lock(&C.mu);
	CUresult r = capture_unsafe();
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ---- contexts ----------------------------------------------------------- */

static struct obj *cur_ctx(uint64_t *h)
{
	if (t_depth == 0)
		return NULL;
	uint64_t c = t_stack[t_depth - 1];
	struct obj *o = obj_get(c, K_CTX);
	if (!o || !o->active)
		return NULL;
	if (h)
		*h = c;
	return o;
}

static void ctx_push(uint64_t h)
{
	if (t_depth == CTX_STACK) { /* drop the oldest rather than fail */
		memmove(t_stack, t_stack + 1, (CTX_STACK - 1) * sizeof(t_stack[0]));
		t_depth--;
	}
	t_stack[t_depth++] = h;
}

/*
 * While another process on the device is being locked, checkpointed or
 * restored by a parker, the driver refuses new contexts there with
 * CUDA_ERROR_DEVICE_UNAVAILABLE: a PyTorch session on an H100 (driver 580)
 * met "CUDA-capable device(s) is/are busy or unavailable" making its context
 * while the memory broker parked another session, and on an H200 its stream
 * creation; here new contexts, streams, events and module loads are refused
 * so. A process parked already (checkpointed, at rest) does not stand in the way.
 */
static int device_busy(int dev)
{
	struct sim_state *st = S();
	int self = sim_self();
	for (int i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &st->proc[i];
		if (i == self || atomic_load(&p->state) != SIM_PROC_LIVE || !sim_proc_alive((unsigned)i))
			continue;
		uint32_t c = atomic_load(&p->ckpt);
		if ((c == SIM_CKPT_LOCKING || c == SIM_CKPT_LOCKED || c == SIM_CKPT_CHECKPOINTING ||
		     c == SIM_CKPT_RESTORING) &&
		    (atomic_load(&p->contexts[dev]) || atomic_load(&p->used[dev]) || atomic_load(&p->parked[dev])))
			return 1;
	}
	return 0;
}

/*
 * HAMI_SIM_COMPUTE_MODE (read at each call, as an administrator's nvidia-smi
 * -c may change it): default, exclusive-process or prohibited. A prohibited
 * device takes no context; an exclusive-process one none while another live
 * process has one there: CUDA_ERROR_DEVICE_UNAVAILABLE, as the real driver.
 */
static int compute_mode(void)
{
	const char *v = getenv("HAMI_SIM_COMPUTE_MODE");
	if (v && strcmp(v, "exclusive-process") == 0)
		return CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
	if (v && strcmp(v, "prohibited") == 0)
		return CU_COMPUTEMODE_PROHIBITED;
	return CU_COMPUTEMODE_DEFAULT;
}

static int mode_refuses(int dev)
{
	int mode = compute_mode();
	if (mode == CU_COMPUTEMODE_PROHIBITED)
		return 1;
	if (mode != CU_COMPUTEMODE_EXCLUSIVE_PROCESS)
		return 0;
	struct sim_state *st = S();
	int self = sim_self();
	for (int i = 0; i < SIM_MAX_PROCS; i++)
		if (i != self && atomic_load(&st->proc[i].state) == SIM_PROC_LIVE && sim_proc_alive((unsigned)i) &&
		    atomic_load(&st->proc[i].contexts[dev]))
			return 1;
	return 0;
}

static CUresult ctx_activate(struct obj *o)
{
	if (device_busy(o->dev) || mode_refuses(o->dev))
		return CUDA_ERROR_DEVICE_UNAVAILABLE;
	uint64_t bytes = S()->hdr.context_bytes;
	CUresult r = charge(o->dev, bytes);
	if (r)
		return r;
	o->bytes = bytes;
	o->active = 1;
	o->last_end = 0;
	o->ctx_id = ++C.ctx_ids;
	sim_ctx_count((unsigned)o->dev, 1);
	return CUDA_SUCCESS;
}

/* A context's end frees everything made in it, like the real driver. */
static void ctx_teardown(uint64_t h, struct obj *c)
{
	for (size_t i = 0; i < C.nal; i++)
		if (C.al[i].live && C.al[i].ctx == h)
			alloc_release(&C.al[i]);
	for (uint32_t i = 0; i < C.nslots; i++) {
		struct obj *o = C.slots[i].o;
		if (!o || o->ctx != h || o->kind == K_CTX)
			continue;
		if (o->kind == K_GEXEC) {
			exec_destroy(slot_handle(i), o);
			continue;
		}
		if (o->kind == K_STREAM)
			capture_drop(o);
		if (o->bytes)
			sim_uncharge((unsigned)o->dev, o->bytes);
		if (o->kind == K_MODULE && o->bytes)
			own_add(o->dev, -(int64_t)o->bytes);
		obj_free(slot_handle(i));
	}
	pools_settle(c->dev);
	gpool_trim(c->dev);
	sim_uncharge((unsigned)c->dev, c->bytes);
	if (c->local) {
		sim_uncharge((unsigned)c->dev, c->local);
		own_add(c->dev, -(int64_t)c->local);
		c->local = 0;
	}
	sim_ctx_count((unsigned)c->dev, -1);
	c->bytes = 0;
	c->active = 0;
	c->last_end = 0;
	c->held_streams = 0;
	al_compact();
}

/* The context work on stream S goes to, and the stream object (NULL for the
 * default streams, which follow the current context). */
static CUresult stream_ctx(CUstream s, struct obj **ctx, uint64_t *ctxh, struct obj **so)
{
	*so = NULL;
	if (!s || s == SIM_STREAM_LEGACY || s == SIM_STREAM_PER_THREAD) {
		*ctx = cur_ctx(ctxh);
		return *ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
	}
	struct obj *st = obj_get(H(s), K_STREAM);
	if (!st)
		return CUDA_ERROR_INVALID_HANDLE;
	struct obj *c = obj_get(st->ctx, K_CTX);
	if (!c || !c->active)
		return CUDA_ERROR_INVALID_CONTEXT;
	*so = st;
	*ctx = c;
	*ctxh = st->ctx;
	return CUDA_SUCCESS;
}

/* ---- init, fork --------------------------------------------------------- */

/* CUDA_VISIBLE_DEVICES: indices or (unique prefixes of) UUIDs; the list
 * ends at the first entry that names no device, as with the real driver. */
static void parse_visible(void)
{
	const struct sim_state *st = S();
	unsigned ndev = st->hdr.ndev;
	const char *v = getenv("CUDA_VISIBLE_DEVICES");

	C.nvis = 0;
	if (!v) {
		for (unsigned i = 0; i < ndev; i++)
			C.vis[C.nvis++] = (int)i;
		return;
	}
	while (*v && C.nvis < ndev) {
		const char *end = strchr(v, ',');
		size_t len = end ? (size_t)(end - v) : strlen(v);
		const char *t = v;
		while (len && *t == ' ')
			t++, len--;
		while (len && t[len - 1] == ' ')
			len--;
		int idx = -1;
		if (len && strspn(t, "0123456789") >= len) {
			unsigned long n = 0;
			for (size_t i = 0; i < len && n <= ndev; i++)
				n = n * 10 + (unsigned long)(t[i] - '0');
			if (n < ndev)
				idx = (int)n;
		} else if (len > 4 && strncasecmp(t, "GPU-", 4) == 0) {
			for (unsigned i = 0; i < ndev; i++) {
				if (strlen(st->dev[i].uuid) >= len && strncasecmp(st->dev[i].uuid, t, len) == 0) {
					if (idx >= 0) {
						idx = -1; /* ambiguous */
						break;
					}
					idx = (int)i;
				}
			}
		}
		for (unsigned i = 0; idx >= 0 && i < C.nvis; i++)
			if (C.vis[i] == idx)
				idx = -1; /* listed twice */
		if (idx < 0)
			break;
		C.vis[C.nvis++] = idx;
		if (!end)
			break;
		v = end + 1;
	}
}

static void cu_prepare(void)
{
	pthread_mutex_lock(&C.mu);
}

static void cu_parent(void)
{
	pthread_mutex_unlock(&C.mu);
}

/* What a forked child inherited belongs to the parent (whose entry holds its
 * memory): start empty; the child claims its own entry when it needs one. */
static void cu_child(void)
{
	for (size_t i = 0; i < C.nal; i++)
		if (C.al[i].live && C.al[i].host)
			munmap(C.al[i].host, C.al[i].size);
	for (uint32_t i = 0; i < C.nslots; i++)
		if (C.slots[i].o && C.slots[i].o->kind == K_MEMHANDLE && C.slots[i].o->vhost)
			munmap(C.slots[i].o->vhost, C.slots[i].o->vsize);
	free(C.vr);
	free(C.vm);
	C.vr = NULL;
	C.vm = NULL;
	C.nvr = C.cap_vr = C.nvm = C.cap_vm = 0;
	sim_mem_forget();
	for (uint32_t i = 0; i < C.nslots; i++) {
		if (C.slots[i].o) {
			free(C.slots[i].o->name);
			free(C.slots[i].o->nodes);
			free(C.slots[i].o->held);
			free(C.slots[i].o);
		}
	}
	free(C.slots);
	free(C.al);
	C.slots = NULL;
	C.nslots = C.cap = 0;
	C.free_head = UINT32_MAX;
	C.al = NULL;
	C.nal = C.cap_al = C.dead_al = 0;
	memset(C.prim, 0, sizeof(C.prim));
	memset(C.prim_refs, 0, sizeof(C.prim_refs));
	memset(C.def_pool, 0, sizeof(C.def_pool));
	memset(C.cur_pool, 0, sizeof(C.cur_pool));
	memset(C.gp, 0, sizeof(C.gp));
	memset(C.internal, 0, sizeof(C.internal));
	memset(C.own, 0, sizeof(C.own));
	C.ncaptures = 0;
	t_depth = 0;
	pthread_mutex_unlock(&C.mu);
}

static void do_init(void)
{
	/* sim_state's fork handlers first, so fork takes C.mu before its lock. */
	sim_atfork_init();
	pthread_atfork(cu_prepare, cu_parent, cu_child);
	int r = sim_open(NULL);
	if (r == SIM_ECONFIG) {
		C.init_rc = CUDA_ERROR_UNKNOWN;
		return;
	}
	if (r < 0) {
		C.init_rc = CUDA_ERROR_OPERATING_SYSTEM;
		return;
	}
	parse_visible();
	if (C.nvis == 0) {
		C.init_rc = CUDA_ERROR_NO_DEVICE;
		return;
	}
	const char *loading = getenv("CUDA_MODULE_LOADING");
	C.eager = loading && strcasecmp(loading, "EAGER") == 0;
	C.init_rc = CUDA_SUCCESS;
	atomic_store(&C.inited, 1);
}

CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&init_once, do_init);
	if (C.init_rc != CUDA_SUCCESS)
		return C.init_rc;
	/* Claim our process entry now (again in a forked child); it names a
	 * CUDA process from now on. */
	if (sim_self() < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	sim_mark_cuda();
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = DRIVER_VERSION;
	return CUDA_SUCCESS;
}

/* ---- errors ------------------------------------------------------------- */

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} errors[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
	 "OS call failed or operation not supported on this OS"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{SIM_CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state"},
	{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	 "operation not permitted when stream is capturing"},
	{SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	 "operation failed due to a previous error during capture"},
	{CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "the operation timed out"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult e, const char **p, int name)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
		if (errors[i].code == e) {
			*p = name ? errors[i].name : errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	return error_lookup(error, pStr, 0);
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	return error_lookup(error, pStr, 1);
}

/* ---- devices ------------------------------------------------------------ */

CUresult cuDeviceGetCount(int *count)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = (int)C.nvis;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (phys(ordinal) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "%s", S()->dev[p].name);
	return CUDA_SUCCESS;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	const char *s = S()->dev[p].uuid + 4; /* after "GPU-" */
	for (int n = 0; n < 16; s++) {
		if (*s == '-')
			continue;
		unsigned hi, lo;
		if (sscanf(s, "%1x%1x", &hi, &lo) != 2)
			return CUDA_ERROR_UNKNOWN;
		uuid->bytes[n++] = (char)(hi << 4 | lo);
		s++;
	}
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	GATE();
	return device_uuid(uuid, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	GATE();
	return device_uuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = S()->dev[p].total;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pi || attrib <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = (int)S()->dev[p].sm_count; break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = p + 1; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *pi = compute_mode(); break;
	/* features the sim really provides */
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
	case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
	default: *pi = 0; break;
	}
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", (unsigned)(p + 1));
	return CUDA_SUCCESS;
}

/* ---- primary contexts --------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	uint64_t h = C.prim[p];
	struct obj *o = obj_get(h, K_CTX);
	if (!o) {
		h = obj_new(K_CTX, &o);
		if (!h) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		o->primary = 1;
		o->dev = p;
		o->ordinal = dev;
		C.prim[p] = h;
	}
	if (!o->active && (r = ctx_activate(o)) != CUDA_SUCCESS)
		goto out;
	C.prim_refs[p]++;
	*pctx = (CUcontext)(uintptr_t)h;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

static CUresult primary_release(CUdevice dev, int reset)
{
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(C.prim[p], K_CTX);
	if (!reset && C.prim_refs[p] == 0) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else {
		C.prim_refs[p] = reset ? 0 : C.prim_refs[p] - 1;
		if (C.prim_refs[p] == 0 && o && o->active)
			ctx_teardown(C.prim[p], o);
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	GATE();
	return primary_release(dev, 0);
}

/* The first export, which real drivers still hand out for CUDA versions before 11.0. */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	GATE();
	return primary_release(dev, 0);
}

/* Frees everything made in the primary context; the next retain starts it
 * afresh (same handle). */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	GATE();
	return primary_release(dev, 1);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(C.prim[p], K_CTX);
	*flags = C.prim_flags[p];
	*active = o && o->active;
	pthread_mutex_unlock(&C.mu);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	C.prim_flags[p] = flags;
	pthread_mutex_unlock(&C.mu);
	return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------- */

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	struct obj *o;
	uint64_t h = obj_new(K_CTX, &o);
	if (!h) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	o->dev = p;
	o->ordinal = dev;
	o->flags = flags;
	if ((r = ctx_activate(o)) != CUDA_SUCCESS) {
		obj_free(h);
		goto out;
	}
	ctx_push(h);
	*pctx = (CUcontext)(uintptr_t)h;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	GATE();
	return ctx_create(pctx, flags, dev);
}

/* Execution affinity parameters are accepted and ignored. */
CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags, CUdevice dev)
{
	GATE();
	if (numParams < 0 || (numParams > 0 && !paramsArray))
		return CUDA_ERROR_INVALID_VALUE;
	return ctx_create(pctx, flags, dev);
}

/* CUctxCreateParams (affinity, CIG) are accepted and ignored; NULL is fine. */
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev)
{
	GATE();
	return ctx_create(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	uint64_t h = H(ctx);
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(h, K_CTX);
	if (!o || o->primary) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else {
		if (o->active)
			ctx_teardown(h, o);
		obj_free(h);
		if (t_depth && t_stack[t_depth - 1] == h)
			t_depth--;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!ctx) {
		if (t_depth)
			t_depth--;
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&C.mu);
	if (!obj_get(H(ctx), K_CTX))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (t_depth)
		t_stack[t_depth - 1] = H(ctx);
	else
		ctx_push(H(ctx));
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = t_depth ? (CUcontext)(uintptr_t)t_stack[t_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c = cur_ctx(NULL);
	if (c)
		*device = c->ordinal;
	else
		r = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The context's id, unique in the process: a primary context gets a new one
 * each time it is made active again (its handle stays), as on driver 580.
 * NULL: the current context (none: CUDA_ERROR_INVALID_CONTEXT); a context
 * that is gone: CUDA_ERROR_CONTEXT_IS_DESTROYED, as driver 580 answers. */
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!ctxId)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c = ctx ? obj_get(H(ctx), K_CTX) : cur_ctx(NULL);
	if (c && c->active)
		*ctxId = c->ctx_id;
	else
		r = ctx ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	if (!obj_get(H(ctx), K_CTX))
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		ctx_push(H(ctx));
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (t_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (pctx)
		*pctx = (CUcontext)(uintptr_t)t_stack[t_depth - 1];
	t_depth--;
	return CUDA_SUCCESS;
}

static void sleep_until(uint64_t end)
{
	struct timespec ts = {(time_t)(end / 1000000000ull), (long)(end % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Wait for END, then let DEV's pools release down to their thresholds. */
static void synchronize(uint64_t end, int dev)
{
	sleep_until(end);
	pthread_mutex_lock(&C.mu);
	pools_settle(dev);
	pthread_mutex_unlock(&C.mu);
}

CUresult cuCtxSynchronize(void)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	for (;;) { /* work a stream holds back has no end yet: look again */
		pthread_mutex_lock(&C.mu);
		struct obj *c = cur_ctx(NULL);
		uint64_t end = !c ? 0 : c->held_streams ? HELD_END : c->last_end;
		int dev = c ? c->dev : -1;
		CUresult sticky = c ? c->fault : CUDA_SUCCESS;
		pthread_mutex_unlock(&C.mu);
		if (!c)
			return CUDA_ERROR_INVALID_CONTEXT;
		if (sticky)
			return sticky;
		if (end != HELD_END) {
			synchronize(end, dev);
			return CUDA_SUCCESS;
		}
		sleep_until(sim_now_ns() + HELD_POLL_NS);
	}
}

/* ---- injected failures (hamiSimFail) ------------------------------------- */

#define FAIL_SLOTS 8

static struct {
	char name[48];
	unsigned left; /* calls of NAME until the one that fails (1: the next) */
} fails[FAIL_SLOTS];

/* Whether this call of NAME is one hamiSimFail asked to fail (it fails once). */
static int fail_now(const char *name)
{
	int hit = 0;
	pthread_mutex_lock(&C.mu);
	for (int i = 0; i < FAIL_SLOTS; i++) {
		if (!fails[i].left || strcmp(fails[i].name, name) != 0)
			continue;
		if (--fails[i].left == 0)
			hit = 1;
	}
	pthread_mutex_unlock(&C.mu);
	return hit;
}

/* The Nth next call of CALL (cuMemCreate, cuMemMap, cuMemUnmap, cuMemSetAccess,
 * cuMemRelease, cuMemcpyDtoHAsync_v2, cuMemcpyHtoDAsync_v2) in this process
 * answers CUDA_ERROR_UNKNOWN and does nothing; N 0 takes the wish back. */
int hamiSimFail(const char *call, unsigned n)
{
	if (!atomic_load(&C.inited))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!call || strlen(call) >= sizeof(fails[0].name))
		return CUDA_ERROR_INVALID_VALUE;
	int r = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&C.mu);
	for (int i = 0; i < FAIL_SLOTS; i++) {
		if (fails[i].left && strcmp(fails[i].name, call) != 0)
			continue;
		snprintf(fails[i].name, sizeof(fails[i].name), "%s", call);
		fails[i].left = n;
		r = CUDA_SUCCESS;
		break;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

#define FAIL_IF_ASKED(name)                      \
	do {                                     \
		if (fail_now(name))              \
			return CUDA_ERROR_UNKNOWN; \
	} while (0)

/* ---- memory ------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	uint64_t ch;
	struct obj *c = cur_ctx(&ch);
	r = !c ? CUDA_ERROR_INVALID_CONTEXT : c->fault ? c->fault : alloc_plain(dptr, bytesize, bytesize, ch, c->dev);
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
			    unsigned int ElementSizeBytes)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!dptr || !pPitch || !WidthInBytes || !Height ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t pitch = round_up(WidthInBytes, PITCH_ALIGN), bytes;
	if (pitch < WidthInBytes || __builtin_mul_overflow(pitch, (uint64_t)Height, &bytes))
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&C.mu);
	uint64_t ch;
	struct obj *c = cur_ctx(&ch);
	r = !c ? CUDA_ERROR_INVALID_CONTEXT : c->fault ? c->fault : alloc_plain(dptr, bytes, bytes, ch, c->dev);
	pthread_mutex_unlock(&C.mu);
	if (r == CUDA_SUCCESS)
		*pPitch = pitch;
	return r;
}

/* Managed memory is charged to the current device in full, at once. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!dptr || !bytesize || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	uint64_t ch;
	struct obj *c = cur_ctx(&ch);
	r = !c ? CUDA_ERROR_INVALID_CONTEXT : c->fault ? c->fault : alloc_plain(dptr, bytesize, bytesize, ch, c->dev);
	if (r == CUDA_SUCCESS)
		al_find(*dptr, 1)->managed = 1;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	pthread_mutex_lock(&C.mu);
	struct alloc *a = dptr ? al_find(dptr, 1) : NULL;
	if (a) {
		alloc_release(a);
		al_compact();
	} else {
		r = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Physical: free = total - what every process holds, as on a real GPU. */
CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!free || !total)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c = cur_ctx(NULL);
	int dev = c ? c->dev : -1;
	pthread_mutex_unlock(&C.mu);
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	sim_sweep();
	const struct sim_device *d = &S()->dev[dev];
	uint64_t used = atomic_load(&d->used);
	*total = d->total;
	*free = used < d->total ? d->total - used : 0;
	return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct alloc *a = al_find(dptr, 0);
	struct vres *v = a ? NULL : vr_find(dptr);
	if (!cur_ctx(NULL)) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (!a && !v) {
		r = CUDA_ERROR_NOT_FOUND;
	} else { /* a reserved range answers for itself, mapped or not */
		if (pbase)
			*pbase = a ? a->base : v->base;
		if (psize)
			*psize = a ? a->size : v->size;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The reserved range (cuMemAddressReserve) holding P, or NULL. C.mu held. */
static struct vres *vr_find(CUdeviceptr p)
{
	size_t lo = 0, hi = C.nvr;
	while (lo < hi) { /* first base > p */
		size_t mid = lo + (hi - lo) / 2;
		if (C.vr[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	struct vres *r = &C.vr[lo - 1];
	return p - r->base < r->size ? r : NULL;
}

/* The mapping (cuMemMap) holding P, or NULL; *at: where one starting after P
 * would go. C.mu held. */
static struct vmap *vm_find(CUdeviceptr p, size_t *at)
{
	size_t lo = 0, hi = C.nvm;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (C.vm[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (at)
		*at = lo;
	if (lo == 0)
		return NULL;
	struct vmap *m = &C.vm[lo - 1];
	return p - m->base < m->size ? m : NULL;
}

/* The CUDA ordinal of physical device DEV in this process, or -1. */
static int ordinal_of(int dev)
{
	for (unsigned i = 0; i < C.nvis; i++)
		if (C.vis[i] == dev)
			return (int)i;
	return -1;
}

/* A fault: an access to memory the device may not reach. Like the real
 * driver's illegal address, it is sticky: the context's later calls answer
 * it too. */
static CUresult fault(struct obj *c)
{
	if (c)
		c->fault = CUDA_ERROR_ILLEGAL_ADDRESS;
	return CUDA_ERROR_ILLEGAL_ADDRESS;
}

/* The bytes of [P, P + N), reached from context C (NULL: any), if they lie in
 * one live allocation of ours or in one mapping of a reserved range that C's
 * device may reach (read, or WRITE too). An address outside everything is
 * CUDA_ERROR_INVALID_VALUE, as before; inside a reserved range but not mapped
 * there, or without access, it is a fault. The allocation's (or the memory
 * handle's) extent is mapped at the first touch. C.mu held. */
static CUresult dev_bytes_from(struct obj *c, CUdeviceptr p, size_t n, int write, unsigned char **out)
{
	struct alloc *a = al_find(p, 0);
	if (a) {
		if (n > a->base + a->size - p)
			return CUDA_ERROR_INVALID_VALUE;
		if (!a->host && !(a->host = sim_mem_map(a->off, a->size)))
			return CUDA_ERROR_OUT_OF_MEMORY;
		a->dirty |= write;
		*out = a->host + (p - a->base);
		return CUDA_SUCCESS;
	}
	if (!vr_find(p))
		return CUDA_ERROR_INVALID_VALUE;
	struct vmap *m = vm_find(p, NULL);
	if (!m || n > m->base + m->size - p)
		return fault(c);
	if (c && (!(m->access & (1u << c->dev)) || (write && !(m->write & (1u << c->dev)))))
		return fault(c);
	struct obj *h = obj_get(m->handle, K_MEMHANDLE);
	if (!h)
		return fault(c);
	if (!h->vhost && !(h->vhost = sim_mem_map(h->voff, h->vsize)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	h->vdirty |= write;
	*out = h->vhost + m->offset + (p - m->base);
	return CUDA_SUCCESS;
}

static CUresult dev_bytes(CUdeviceptr p, size_t n, int write, unsigned char **out)
{
	return dev_bytes_from(NULL, p, n, write, out);
}

enum copy_kind { HTOD, DTOH, DTOD };

/* Every copy happens at the call, the Async ones too (nothing runs on a
 * stream here). DST and SRC are device addresses or host pointers as KIND
 * says; S (NULL for the synchronous forms) names the stream, whose context
 * must be live; else the current context must be. */
static CUresult copy(enum copy_kind kind, uint64_t dst, uint64_t src, size_t n, const CUstream *s)
{
	CUresult r = ready();
	if (r)
		return r;
	if (n && ((kind == DTOH && !dst) || (kind == HTOD && !src)))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	unsigned char *d = (unsigned char *)(uintptr_t)dst, *from = (unsigned char *)(uintptr_t)src;
	struct obj *c = NULL, *so = NULL;
	uint64_t ch;
	if (s)
		r = stream_ctx(*s, &c, &ch, &so);
	else if (!(c = cur_ctx(NULL)))
		r = CUDA_ERROR_INVALID_CONTEXT;
	if (r == CUDA_SUCCESS && c->fault)
		r = c->fault;
	if (r == CUDA_SUCCESS && so && so->capture != CAPTURE_NONE) {
		/* Captured: checked against what the graph may touch, and no
		 * byte moves, now or when the graph runs. */
		if (so->capture == CAPTURE_INVALIDATED)
			r = SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		else if (n && ((kind != DTOH && !capture_range_ok(so, dst, n)) ||
			       (kind != HTOD && !capture_range_ok(so, src, n))))
			r = capture_fail(so, CUDA_ERROR_INVALID_VALUE);
		pthread_mutex_unlock(&C.mu);
		return r;
	}
	if (r == CUDA_SUCCESS && n && kind != DTOH)
		r = dev_bytes_from(c, dst, n, 1, &d);
	if (r == CUDA_SUCCESS && n && kind != HTOD)
		r = dev_bytes_from(c, src, n, 0, &from);
	if (r == CUDA_SUCCESS && n)
		memmove(d, from, n);
	pthread_mutex_unlock(&C.mu);
	return r;
}

#define HP(p) ((uint64_t)(uintptr_t)(p))

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	GATE();
	return copy(HTOD, dstDevice, HP(srcHost), ByteCount, NULL);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	GATE();
	return copy(HTOD, dstDevice, HP(srcHost), ByteCount, NULL);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	GATE();
	return copy(DTOH, HP(dstHost), srcDevice, ByteCount, NULL);
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	GATE();
	return copy(DTOH, HP(dstHost), srcDevice, ByteCount, NULL);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	GATE();
	return copy(DTOD, dstDevice, srcDevice, ByteCount, NULL);
}

CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	GATE();
	return copy(DTOD, dstDevice, srcDevice, ByteCount, NULL);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	GATE();
	FAIL_IF_ASKED("cuMemcpyHtoDAsync_v2");
	return copy(HTOD, dstDevice, HP(srcHost), ByteCount, &hStream);
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	GATE();
	return copy(HTOD, dstDevice, HP(srcHost), ByteCount, &hStream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	GATE();
	FAIL_IF_ASKED("cuMemcpyDtoHAsync_v2");
	return copy(DTOH, HP(dstHost), srcDevice, ByteCount, &hStream);
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	GATE();
	return copy(DTOH, HP(dstHost), srcDevice, ByteCount, &hStream);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	GATE();
	return copy(DTOD, dstDevice, srcDevice, ByteCount, &hStream);
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	GATE();
	return copy(DTOD, dstDevice, srcDevice, ByteCount, &hStream);
}

/* ---- sets ------------------------------------------------------------------ */

/* N bytes at DST set to V, at the call (the Async form too), as copies are;
 * S names the stream (NULL: the current context). Zeros over whole pages
 * give the backing file's blocks back instead of writing them. */
static CUresult memset8(CUdeviceptr dst, unsigned char v, size_t n, const CUstream *s)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *c = NULL, *so = NULL;
	uint64_t ch;
	unsigned char *d;
	if (s)
		r = stream_ctx(*s, &c, &ch, &so);
	else if (!(c = cur_ctx(NULL)))
		r = CUDA_ERROR_INVALID_CONTEXT;
	if (r == CUDA_SUCCESS && c->fault)
		r = c->fault;
	if (r == CUDA_SUCCESS && so && so->capture != CAPTURE_NONE)
		r = capture_fail(so, CUDA_ERROR_NOT_SUPPORTED); /* the sim captures no sets */
	else if (r == CUDA_SUCCESS && n && (r = dev_bytes_from(c, dst, n, 1, &d)) == CUDA_SUCCESS) {
		uintptr_t page = 4096, from = ((uintptr_t)d + page - 1) & ~(page - 1),
			  to = ((uintptr_t)d + n) & ~(page - 1);
		if (v == 0 && to > from && madvise((void *)from, to - from, MADV_REMOVE) == 0) {
			memset(d, 0, from - (uintptr_t)d);
			memset((void *)to, 0, (uintptr_t)d + n - to);
		} else {
			memset(d, v, n);
		}
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	GATE();
	return memset8(dstDevice, uc, N, NULL);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	GATE();
	return memset8(dstDevice, uc, N, &hStream);
}

/* ---- stream-ordered memory ---------------------------------------------- */

/* POOL 0: the current pool of the stream's device. The free happens at the
 * call, not when the stream reaches it. On a capturing stream both become
 * graph memory nodes (capture_alloc, capture_free). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, uint64_t poolh, CUstream s)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so, *p;
	uint64_t ch;
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (so && so->capture != CAPTURE_NONE) {
		r = capture_alloc(so, dptr, bytesize, poolh);
		goto out;
	}
	if (!poolh)
		poolh = current_pool(c->dev);
	p = obj_get(poolh, K_POOL);
	if (!p || p->dying) {
		r = poolh ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	CUdeviceptr base;
	uint64_t off;
	if (!al_reserve() || !(base = va_take(bytesize)) || sim_mem_reserve(bytesize, &off) < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if ((r = pool_take(p, bytesize)) != CUDA_SUCCESS) {
		sim_mem_release(off, bytesize, NULL, 0);
		goto out;
	}
	al_push(base, bytesize, 0, ch, poolh, p->dev, off);
	*dptr = base;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	GATE();
	return alloc_async(dptr, bytesize, 0, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	GATE();
	return alloc_async(dptr, bytesize, 0, hStream);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)
{
	if (!pool)
		return ready() ? ready() : CUDA_ERROR_INVALID_VALUE;
	return alloc_async(dptr, bytesize, H(pool), s);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	GATE();
	return alloc_from_pool(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	GATE();
	return alloc_from_pool(dptr, bytesize, pool, hStream);
}

/* Pool memory goes back to its pool (reserved stays); anything else is freed. */
static CUresult free_async(CUdeviceptr dptr, CUstream s)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	struct alloc *a;
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (so && so->capture != CAPTURE_NONE) {
		r = capture_free(so, dptr);
		goto out;
	}
	if (!dptr || !(a = al_find(dptr, 1))) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	alloc_release(a);
	al_compact();
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	GATE();
	return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	GATE();
	return free_async(dptr, hStream);
}

/* Only device pools: location.id is a CUDA ordinal; maxSize 0 = unbounded. */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	if (poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_NOT_SUPPORTED;
	int p = phys(poolProps->location.id);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	struct obj *o;
	uint64_t h = obj_new(K_POOL, &o);
	if (h) {
		o->dev = p;
		o->max_size = poolProps->maxSize;
		*pool = (CUmemoryPool)(uintptr_t)h;
	} else {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Outstanding allocations keep a destroyed pool's memory until freed. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	uint64_t h = H(pool);
	pthread_mutex_lock(&C.mu);
	struct obj *p = obj_get(h, K_POOL);
	if (!p || p->dying || p->is_default) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	if (C.cur_pool[p->dev] == h)
		C.cur_pool[p->dev] = 0;
	if (p->used) {
		p->dying = 1;
		pool_trim(p, 0);
	} else {
		sim_uncharge((unsigned)p->dev, p->reserved);
		obj_free(h);
	}
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *p = obj_get(H(pool), K_POOL);
	if (p && !p->dying)
		pool_trim(p, minBytesToKeep);
	else
		r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *p = obj_get(H(pool), K_POOL);
	uint64_t v = 0;
	if (!p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		*(int *)value = 1;
		goto out;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->threshold; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->reserved; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: v = p->reserved_high; break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->used; break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = p->used_high; break;
	default: r = CUDA_ERROR_INVALID_VALUE; goto out;
	}
	*(cuuint64_t *)value = v;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The *_HIGH marks can only be reset (to the current value) by writing 0. */
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if ((r = unsafe_call()) != CUDA_SUCCESS) /* capture-unsafe */
		return r;
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *p = obj_get(H(pool), K_POOL);
	if (!p) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)value; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		if (*(cuuint64_t *)value)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->reserved_high = p->reserved;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		if (*(cuuint64_t *)value)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->used_high = p->used;
		break;
	default: r = CUDA_ERROR_INVALID_VALUE; break;
	}
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pool_out)
		return CUDA_ERROR_INVALID_VALUE;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	uint64_t h = default_pool(p);
	if (h)
		*pool_out = (CUmemoryPool)(uintptr_t)h;
	pthread_mutex_unlock(&C.mu);
	return h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	uint64_t h = current_pool(p);
	if (h)
		*pool = (CUmemoryPool)(uintptr_t)h;
	pthread_mutex_unlock(&C.mu);
	return h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(dev);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(H(pool), K_POOL);
	if (!o || o->dying || o->dev != p)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		C.cur_pool[p] = H(pool);
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ---- virtual memory management ------------------------------------------ */

/*
 * As the driver documents them (CUDA 10.2+): cuMemAddressReserve hands out an
 * address range and nothing else; cuMemCreate makes physical memory (charged
 * to the device); cuMemMap puts a handle's bytes at an address of a reserved
 * range, which no device may touch until cuMemSetAccess grants it; cuMemUnmap
 * takes whole mappings out again; memory lives while a handle reference or a
 * mapping holds it (cuMemRelease of a mapped handle frees nothing yet).
 * Addresses, sizes and offsets go in multiples of the granularity (GRAN).
 */

/* Double *ARR's room (*CAP elements of ELEM bytes); -1, nothing changed, without memory. */
static int grow_array(void **arr, size_t *cap, size_t elem)
{
	size_t n = *cap ? *cap * 2 : 64;
	void *a = realloc(*arr, n * elem);
	if (!a)
		return -1;
	*arr = a;
	*cap = n;
	return 0;
}

static int gran_ok(uint64_t v)
{
	return v % GRAN == 0;
}

/* A handle the program may name: live, and not released by it. */
static struct obj *mh_get(uint64_t h)
{
	struct obj *o = obj_get(h, K_MEMHANDLE);
	return o && o->refs ? o : NULL;
}

/* Free handle H's memory once nothing holds it any more. C.mu held. */
static void mh_settle(uint64_t h)
{
	struct obj *o = obj_get(h, K_MEMHANDLE);
	if (!o || o->refs || o->maps)
		return;
	if (o->bytes)
		sim_uncharge((unsigned)o->dev, o->bytes);
	sim_mem_release(o->voff, o->vsize, o->vhost, o->vdirty);
	obj_free(h);
}

/* Whether [P, P + N) touches a live plain allocation or a reserved range. */
static int va_in_use(CUdeviceptr p, uint64_t n)
{
	for (size_t i = 0; i < C.nal; i++)
		if (C.al[i].live && C.al[i].base < p + n && p < C.al[i].base + round_up(C.al[i].size, GRAN))
			return 1;
	for (size_t i = 0; i < C.nvr; i++)
		if (C.vr[i].base < p + n && p < C.vr[i].base + C.vr[i].size)
			return 1;
	return 0;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && phys(prop->location.id) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*granularity = GRAN;
	return CUDA_SUCCESS;
}

/* Device locations take device memory; host locations take none. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	FAIL_IF_ASKED("cuMemCreate");
	if (!handle || !prop || !size || size % GRAN || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || flags)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = -1;
	switch (prop->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		if ((dev = phys(prop->location.id)) < 0)
			return CUDA_ERROR_INVALID_DEVICE;
		break;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&C.mu);
	struct obj *o;
	uint64_t off = 0, h = 0;
	if (sim_mem_reserve(size, &off) < 0 || !(h = obj_new(K_MEMHANDLE, &o))) {
		if (h == 0 && off)
			sim_mem_release(off, size, NULL, 0);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (dev >= 0 && (r = charge(dev, size)) != CUDA_SUCCESS) {
		sim_mem_release(off, size, NULL, 0);
		obj_free(h);
	} else {
		o->dev = dev;
		o->bytes = dev >= 0 ? size : 0;
		o->vsize = size;
		o->voff = off;
		o->refs = 1;
		o->prop = *prop;
		*handle = h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The program's reference goes; the memory with it unless a mapping still uses it. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	FAIL_IF_ASKED("cuMemRelease");
	pthread_mutex_lock(&C.mu);
	struct obj *o = mh_get(handle);
	if (o) {
		o->refs--;
		mh_settle(handle);
	} else {
		r = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ALIGNMENT 0: the granularity; ADDR: the start wanted, taken when it is free
 * (aligned, in the device address space, touching nothing), else ignored. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!ptr || !size || !gran_ok(size) || (alignment & (alignment - 1)) || flags)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t align = alignment > GRAN ? alignment : GRAN;
	pthread_mutex_lock(&C.mu);
	CUdeviceptr base = 0;
	if (addr && addr % align == 0 && addr >= VA_BASE && addr < VA_END && size <= VA_END - addr &&
	    !va_in_use(addr, size))
		base = addr;
	if (!base) {
		uint64_t start = round_up(C.next_va, align);
		if (start < VA_END && size <= VA_END - start && VA_END - start - size >= GRAN) {
			base = start;
			C.next_va = start + size + GRAN; /* a gap: an overrun is outside every range */
		}
	}
	if (!base || (C.nvr == C.cap_vr && grow_array((void **)&C.vr, &C.cap_vr, sizeof(*C.vr)) < 0)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		size_t at = 0;
		while (at < C.nvr && C.vr[at].base < base)
			at++;
		memmove(&C.vr[at + 1], &C.vr[at], (C.nvr - at) * sizeof(*C.vr));
		C.vr[at] = (struct vres){.base = base, .size = size};
		C.nvr++;
		*ptr = base;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The whole range as reserved, with nothing mapped in it any more (the sim's
 * choice: a range still holding mappings is refused). */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct vres *v = vr_find(ptr);
	size_t at;
	struct vmap *m = vm_find(ptr, &at);
	if (!v || v->base != ptr || v->size != size || m || (at < C.nvm && C.vm[at].base < ptr + size)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		size_t i = (size_t)(v - C.vr);
		memmove(&C.vr[i], &C.vr[i + 1], (C.nvr - i - 1) * sizeof(*C.vr));
		C.nvr--;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	FAIL_IF_ASKED("cuMemMap");
	if (!size || !gran_ok(ptr) || !gran_ok(size) || !gran_ok(offset) || flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *o = mh_get(handle);
	struct vres *v = vr_find(ptr);
	size_t at;
	struct vmap *m = vm_find(ptr, &at);
	if (!o || offset > o->vsize || size > o->vsize - offset || !v || size > v->base + v->size - ptr || m ||
	    (at < C.nvm && C.vm[at].base < ptr + size)) {
		r = CUDA_ERROR_INVALID_VALUE; /* not a handle, past its end, outside a range, or mapped already */
	} else if (C.nvm == C.cap_vm && grow_array((void **)&C.vm, &C.cap_vm, sizeof(*C.vm)) < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		memmove(&C.vm[at + 1], &C.vm[at], (C.nvm - at) * sizeof(*C.vm));
		C.vm[at] = (struct vmap){.base = ptr, .size = size, .handle = handle, .offset = offset};
		C.nvm++;
		o->maps++;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The mappings [*first, *last) that make up exactly [P, P + N), whole and
 * back to back; 0 when N cuts one or leaves a hole. C.mu held. */
static int vm_whole(CUdeviceptr p, uint64_t n, size_t *first, size_t *last)
{
	size_t at;
	struct vmap *m = vm_find(p, &at);
	if (!n || !m || m->base != p)
		return 0;
	size_t i = (size_t)(m - C.vm);
	CUdeviceptr end = p;
	*first = i;
	while (i < C.nvm && C.vm[i].base == end && end - p < n) {
		end += C.vm[i].size;
		i++;
	}
	*last = i;
	return end - p == n;
}

/* The latest end of this process's work queued on DEV (C.mu held). */
static uint64_t dev_work_end(int dev)
{
	uint64_t end = 0;
	for (uint32_t i = 0; i < C.nslots; i++) {
		struct obj *o = C.slots[i].o;
		if (o && o->kind == K_CTX && o->active && o->dev == dev && o->last_end > end)
			end = o->last_end;
	}
	return end;
}

/* Synchronous, as the driver says: it returns once the work this process
 * queued on the memory's device has ended. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	FAIL_IF_ASKED("cuMemUnmap");
	pthread_mutex_lock(&C.mu);
	size_t first, last;
	uint64_t end = 0;
	if (!vm_whole(ptr, size, &first, &last)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		for (size_t i = first; i < last; i++) {
			struct obj *o = obj_get(C.vm[i].handle, K_MEMHANDLE);
			if (o && o->dev >= 0 && dev_work_end(o->dev) > end)
				end = dev_work_end(o->dev);
		}
	}
	pthread_mutex_unlock(&C.mu);
	if (r)
		return r;
	sleep_until(end);
	pthread_mutex_lock(&C.mu);
	if (!vm_whole(ptr, size, &first, &last)) { /* another thread unmapped it meanwhile */
		pthread_mutex_unlock(&C.mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	uint64_t gone[64];
	size_t n = 0;
	for (size_t i = first; i < last; i++) {
		struct obj *o = obj_get(C.vm[i].handle, K_MEMHANDLE);
		if (o)
			o->maps--;
		if (n < 64)
			gone[n++] = C.vm[i].handle;
	}
	memmove(&C.vm[first], &C.vm[last], (C.nvm - last) * sizeof(*C.vm));
	C.nvm -= last - first;
	for (size_t i = 0; i < n; i++)
		mh_settle(gone[i]);
	pthread_mutex_unlock(&C.mu);
	return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	FAIL_IF_ASKED("cuMemSetAccess");
	if (!desc || !count)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return CUDA_ERROR_INVALID_VALUE;
		if (phys(desc[i].location.id) < 0)
			return CUDA_ERROR_INVALID_DEVICE;
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&C.mu);
	size_t first, last;
	if (!vm_whole(ptr, size, &first, &last)) {
		r = CUDA_ERROR_INVALID_VALUE; /* the range must be fully mapped */
	} else {
		for (size_t i = first; i < last; i++) {
			for (size_t k = 0; k < count; k++) {
				uint32_t bit = 1u << phys(desc[k].location.id);
				C.vm[i].access &= ~bit;
				C.vm[i].write &= ~bit;
				if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
					C.vm[i].access |= bit;
				if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
					C.vm[i].write |= bit;
			}
		}
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = phys(location->id);
	if (dev < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	struct vmap *m = vm_find(ptr, NULL);
	if (!m)
		r = CUDA_ERROR_INVALID_VALUE;
	else
		*flags = (m->write & (1u << dev)) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
			 : (m->access & (1u << dev)) ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_NONE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* A new reference to the handle mapped at ADDR (any address in the mapping). */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct vmap *m = vm_find((CUdeviceptr)(uintptr_t)addr, NULL);
	struct obj *o = m ? obj_get(m->handle, K_MEMHANDLE) : NULL;
	if (!o) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		o->refs++;
		*handle = m->handle;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *o = mh_get(handle);
	if (o)
		*prop = o->prop;
	else
		r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ---- pointers ------------------------------------------------------------- */

/*
 * What the driver tells about an address: a plain allocation is its own
 * range; in a reserved range, the range is the reservation (mapped there or
 * not), as the real driver answers, and MAPPED says whether the address is
 * backed now. Memory of neither kind: CUDA_ERROR_INVALID_VALUE. A mapped
 * range belongs to no context (the sim's choice: CONTEXT is NULL there). C.mu held.
 */
static CUresult pointer_attribute(void *data, int attr, CUdeviceptr p)
{
	struct alloc *a = al_find(p, 0);
	struct vres *v = a ? NULL : vr_find(p);
	struct vmap *m = v ? vm_find(p, NULL) : NULL;
	struct obj *h = m ? obj_get(m->handle, K_MEMHANDLE) : NULL;
	struct obj *c = cur_ctx(NULL);
	if (!a && !v)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = a ? a->dev : h ? h->dev : -1;
	uint64_t u = 0;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = a ? (CUcontext)(uintptr_t)a->ctx : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = (a || !h || dev >= 0) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		if (!c)
			return CUDA_ERROR_INVALID_CONTEXT;
		*(CUdeviceptr *)data = p;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		return CUDA_ERROR_INVALID_VALUE;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		u = a ? a->base : m ? m->base : v->base;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(int *)data = a && a->managed;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		if (dev < 0)
			return CUDA_ERROR_INVALID_VALUE;
		*(int *)data = ordinal_of(dev);
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = a && !a->managed && !a->pool && !a->graph;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = a ? a->base : v->base;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = a ? a->size : v->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = a || m;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		u = h ? (uint64_t)h->prop.requestedHandleTypes : 0;
		break;
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
		*(unsigned *)data = a ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
				  : !m || !c || !(m->access & (1u << c->dev)) ? CU_MEM_ACCESS_FLAGS_PROT_NONE
				  : (m->write & (1u << c->dev)) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
								: CU_MEM_ACCESS_FLAGS_PROT_READ;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		if (!a && !m)
			return CUDA_ERROR_INVALID_VALUE;
		*(size_t *)data = a ? a->size : m->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		if (!a && !m)
			return CUDA_ERROR_INVALID_VALUE;
		*(CUdeviceptr *)data = a ? a->base : m->base;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	*(unsigned long long *)data = u;
	return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	r = pointer_attribute(data, attribute, ptr);
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Unlike the single form, an address the driver does not know is no error:
 * its attributes read as zeros. */
CUresult cuPointerGetAttributes(unsigned int numAttributes, int *attributes, void **data, CUdeviceptr ptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	int known = al_find(ptr, 0) || vr_find(ptr);
	for (unsigned i = 0; i < numAttributes && r == CUDA_SUCCESS; i++) {
		if (!data[i])
			continue;
		unsigned char scratch[16] = {0};
		CUresult one = known ? pointer_attribute(scratch, attributes[i], ptr) : CUDA_SUCCESS;
		if (attributes[i] < CU_POINTER_ATTRIBUTE_CONTEXT || attributes[i] > CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (one == CUDA_ERROR_INVALID_CONTEXT)
			r = one;
		size_t width = attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE ||
				       attributes[i] == CU_POINTER_ATTRIBUTE_ACCESS_FLAGS ? sizeof(unsigned)
			       : attributes[i] == CU_POINTER_ATTRIBUTE_IS_MANAGED ||
				       attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ||
				       attributes[i] == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ||
				       attributes[i] == CU_POINTER_ATTRIBUTE_MAPPED ? sizeof(int) : 8;
		if (r == CUDA_SUCCESS)
			memcpy(data[i], one == CUDA_SUCCESS ? scratch : (unsigned char[16]){0}, width);
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ---- page-locked host memory --------------------------------------------------- */

/* Host memory a device copies from at full speed on a real GPU; here plain
 * host memory (no device bytes), made in the current context. */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pp || !bytesize || flags > 0x7)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c = cur_ctx(NULL);
	pthread_mutex_unlock(&C.mu);
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*pp = malloc(bytesize);
	return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	free(p);
	return CUDA_SUCCESS;
}

/* ---- peers and IPC ---------------------------------------------------------- */

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!canAccessPeer)
		return CUDA_ERROR_INVALID_VALUE;
	if (phys(dev) < 0 || phys(peerDev) < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*canAccessPeer = phys(dev) != phys(peerDev);
	return CUDA_SUCCESS;
}

/* The current context may reach the memory of PEER's device: plain
 * allocations at once; a mapped range still needs cuMemSetAccess for the
 * current context's device, as with the real driver. */
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c = cur_ctx(NULL), *p = obj_get(H(peer), K_CTX);
	if (!c)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (!p || !p->active)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (p->dev == c->dev)
		r = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	else if (c->peers & (1u << p->dev))
		r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	else
		c->peers |= 1u << p->dev;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *c = cur_ctx(NULL), *p = obj_get(H(peer), K_CTX);
	if (!c)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (!p || !(c->peers & (1u << p->dev)))
		r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
	else
		c->peers &= ~(1u << p->dev);
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Only a plain allocation's base exports (the real driver refuses memory of
 * reserved ranges, pools and managed memory alike). The handle names this
 * process and the address; nothing opens it here. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pHandle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct alloc *a = al_find(dptr, 1);
	if (!cur_ctx(NULL)) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (!a || a->managed || a->pool || a->graph) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		memset(pHandle, 0, sizeof(*pHandle));
		uint64_t words[2] = {(uint64_t)getpid(), dptr};
		memcpy(pHandle->reserved, "HAMISIPC", 8);
		memcpy(pHandle->reserved + 8, words, sizeof(words));
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* ---- arrays ------------------------------------------------------------- */

static uint64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT: return 4;
	}
	return 0;
}

/* Bytes of a W x H x D array (0 for H or D means 1), exactly, no padding. */
static CUresult array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch, uint64_t *out)
{
	uint64_t es = format_bytes(f), v;
	if (!es || (ch != 1 && ch != 2 && ch != 4) || !w)
		return CUDA_ERROR_INVALID_VALUE;
	if (__builtin_mul_overflow(w, h ? h : 1, &v) || __builtin_mul_overflow(v, d ? d : 1, &v) ||
	    __builtin_mul_overflow(v, es * ch, &v))
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = v;
	return CUDA_SUCCESS;
}

static CUresult array_new(enum kind k, uint64_t bytes, uint64_t *out)
{
	CUresult r;
	pthread_mutex_lock(&C.mu);
	uint64_t ch, h;
	struct obj *c = cur_ctx(&ch), *o;
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (!(h = obj_new(k, &o))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if ((r = charge(c->dev, bytes)) != CUDA_SUCCESS) {
		obj_free(h);
	} else {
		o->dev = c->dev;
		o->ctx = ch;
		o->bytes = bytes;
		*out = h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

static CUresult array_destroy(uint64_t h, enum kind k)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(h, k);
	if (o) {
		sim_uncharge((unsigned)o->dev, o->bytes);
		obj_free(h);
	} else {
		r = CUDA_ERROR_INVALID_HANDLE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pHandle || !pAllocateArray)
		return CUDA_ERROR_INVALID_VALUE;
	const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
	uint64_t bytes, h;
	if ((r = array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, &bytes)) != CUDA_SUCCESS)
		return r;
	if ((r = array_new(K_ARRAY, bytes, &h)) == CUDA_SUCCESS)
		*pHandle = (CUarray)(uintptr_t)h;
	return r;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pHandle || !pAllocateArray)
		return CUDA_ERROR_INVALID_VALUE;
	const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
	if ((d->Flags & CUDA_ARRAY3D_CUBEMAP) && d->Depth != 6 && !(d->Flags & CUDA_ARRAY3D_LAYERED))
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t bytes, h;
	if ((r = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, &bytes)) != CUDA_SUCCESS)
		return r;
	if ((r = array_new(K_ARRAY, bytes, &h)) == CUDA_SUCCESS)
		*pHandle = (CUarray)(uintptr_t)h;
	return r;
}

CUresult cuArrayDestroy(CUarray hArray)
{
	GATE();
	return array_destroy(H(hArray), K_ARRAY);
}

/* Sum of the levels; each halves width, height and depth (not layers), min 1. */
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
				unsigned int numMipmapLevels)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!pHandle || !pMipmappedArrayDesc || !numMipmapLevels || !pMipmappedArrayDesc->Width)
		return CUDA_ERROR_INVALID_VALUE;
	const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
	int layered = (d->Flags & CUDA_ARRAY3D_LAYERED) != 0;
	uint64_t big = d->Width;
	if (d->Height > big)
		big = d->Height;
	if (!layered && d->Depth > big)
		big = d->Depth;
	unsigned max_levels = 1;
	while (big >>= 1)
		max_levels++;
	if (numMipmapLevels > max_levels)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t total = 0, h;
	for (unsigned l = 0; l < numMipmapLevels; l++) {
		uint64_t w = d->Width >> l, hh = d->Height >> l, dd = layered ? d->Depth : d->Depth >> l, b;
		if ((r = array_bytes(w ? w : 1, hh ? hh : 1, dd ? dd : 1, d->Format, d->NumChannels, &b)) != CUDA_SUCCESS)
			return r;
		if (__builtin_add_overflow(total, b, &total))
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if ((r = array_new(K_MIPMAP, total, &h)) == CUDA_SUCCESS)
		*pHandle = (CUmipmappedArray)(uintptr_t)h;
	return r;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
	GATE();
	return array_destroy(H(hMipmappedArray), K_MIPMAP);
}

/* ---- streams ------------------------------------------------------------ */

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!phStream)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	uint64_t ch, h;
	struct obj *c = cur_ctx(&ch), *o;
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (device_busy(c->dev)) {
		r = CUDA_ERROR_DEVICE_UNAVAILABLE;
	} else if (!(h = obj_new(K_STREAM, &o))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		o->dev = c->dev;
		o->ctx = ch;
		o->flags = Flags;
		*phStream = (CUstream)(uintptr_t)h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *so = obj_get(H(hStream), K_STREAM);
	if (so) {
		capture_drop(so); /* a capture under way ends with no graph */
		held_drop(so);
		obj_free(H(hStream));
	} else {
		r = CUDA_ERROR_INVALID_HANDLE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The default streams wait for everything queued in their context. Waiting
 * for a capturing stream is illegal and ends its capture in failure, as with
 * the real driver. */
static CUresult stream_end(CUstream s, uint64_t *end, int *dev)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	if ((r = stream_ctx(s, &c, &ch, &so)) == CUDA_SUCCESS && c->fault)
		r = c->fault;
	if (r == CUDA_SUCCESS) {
		if (so && so->capture != CAPTURE_NONE) {
			so->capture = CAPTURE_INVALIDATED;
			r = SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
		} else {
			*end = !so ? c->last_end : so->nheld ? HELD_END : so->last_end;
			*dev = c->dev;
		}
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

static CUresult stream_sync(CUstream s)
{
	uint64_t end;
	int dev;
	CUresult r;
	while ((r = stream_end(s, &end, &dev)) == CUDA_SUCCESS && end == HELD_END)
		sleep_until(sim_now_ns() + HELD_POLL_NS);
	if (r == CUDA_SUCCESS)
		synchronize(end, dev);
	return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
	GATE();
	return stream_sync(hStream);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	GATE();
	return stream_sync(hStream);
}

static CUresult stream_query(CUstream s)
{
	uint64_t end;
	int dev;
	CUresult r = stream_end(s, &end, &dev);
	if (r == CUDA_SUCCESS && end > sim_now_ns())
		r = CUDA_ERROR_NOT_READY;
	return r;
}

CUresult cuStreamQuery(CUstream hStream)
{
	GATE();
	return stream_query(hStream);
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
	GATE();
	return stream_query(hStream);
}

/* ---- modules and launches ----------------------------------------------- */

/*
 * A module's code takes HAMI_SIM_MODULE_BYTES of device memory once it is
 * loaded, as the real driver's does: lazily (CUDA_MODULE_LOADING=LAZY, the
 * default since CUDA 12.2) at the first launch of one of its kernels, at
 * cuModuleLoadData with CUDA_MODULE_LOADING=EAGER. On a full device that load
 * fails with CUDA_ERROR_OUT_OF_MEMORY and nothing changes. C.mu held.
 */
static CUresult module_code(struct obj *mod)
{
	uint64_t bytes = S()->hdr.module_bytes;
	if (mod->code_loaded)
		return CUDA_SUCCESS;
	CUresult r = bytes ? charge(mod->dev, bytes) : CUDA_SUCCESS;
	if (r)
		return r;
	mod->bytes = bytes;
	mod->code_loaded = 1;
	own_add(mod->dev, (int64_t)bytes);
	return CUDA_SUCCESS;
}

/*
 * A kernel named "hami_sim_local_<size>" needs <size> of local memory (its
 * threads' stacks and spills): the driver grows the context's local memory to
 * the largest need met so far at the launch, and keeps it until the context
 * ends. A launch it cannot grow for fails with CUDA_ERROR_OUT_OF_MEMORY and
 * does not start. C.mu held.
 */
#define LOCAL_KERNEL "hami_sim_local_"

static CUresult local_memory(struct obj *c, const char *name)
{
	uint64_t need;
	size_t n = sizeof(LOCAL_KERNEL) - 1;
	if (!name || strncmp(name, LOCAL_KERNEL, n) != 0 || sim_parse_size(name + n, &need) < 0 ||
	    need <= c->local)
		return CUDA_SUCCESS;
	CUresult r = charge(c->dev, need - c->local);
	if (r)
		return r;
	own_add(c->dev, (int64_t)(need - c->local));
	c->local = need;
	return CUDA_SUCCESS;
}

/* Any image is accepted: there is no code to run. */
CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!module || !image)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	uint64_t ch, h;
	struct obj *c = cur_ctx(&ch), *o;
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (device_busy(c->dev)) {
		r = CUDA_ERROR_DEVICE_UNAVAILABLE;
	} else if (!(h = obj_new(K_MODULE, &o))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		o->dev = c->dev;
		o->ctx = ch;
		if (C.eager && (r = module_code(o)) != CUDA_SUCCESS)
			obj_free(h);
		else
			*module = (CUmodule)(uintptr_t)h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuModuleUnload(CUmodule hmod)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	uint64_t h = H(hmod);
	pthread_mutex_lock(&C.mu);
	struct obj *mod = obj_get(h, K_MODULE);
	if (mod) {
		for (uint32_t i = 0; i < C.nslots; i++) {
			struct obj *o = C.slots[i].o;
			if (o && o->kind == K_FUNC && o->parent == h)
				obj_free(slot_handle(i));
		}
		if (mod->bytes) {
			sim_uncharge((unsigned)mod->dev, mod->bytes);
			own_add(mod->dev, -(int64_t)mod->bytes);
		}
		obj_free(h);
	} else {
		r = CUDA_ERROR_INVALID_HANDLE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Any name exists; the same name gives the same handle. */
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t m = H(hmod);
	pthread_mutex_lock(&C.mu);
	struct obj *mod = obj_get(m, K_MODULE), *o;
	if (!mod) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	for (uint32_t i = 0; i < C.nslots; i++) {
		o = C.slots[i].o;
		if (o && o->kind == K_FUNC && o->parent == m && strcmp(o->name, name) == 0) {
			*hfunc = (CUfunction)(uintptr_t)slot_handle(i);
			goto out;
		}
	}
	char *copy = strdup(name);
	uint64_t h = copy ? obj_new(K_FUNC, &o) : 0;
	if (!h) {
		free(copy);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	o->name = copy;
	o->parent = m;
	o->ctx = mod->ctx;
	o->dev = mod->dev;
	*hfunc = (CUfunction)(uintptr_t)h;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

/* Put DUR ns on the device's timeline behind context C (stream SO, NULL for
 * the default streams); C.mu held. Returns when that work ends. */
static uint64_t run_work(struct obj *c, struct obj *so, uint64_t dur)
{
	uint64_t end = sim_launch((unsigned)c->dev, dur);
	if (so && end > so->last_end)
		so->last_end = end;
	if (end > c->last_end)
		c->last_end = end;
	return end;
}

/* ---- work held back: stream memory operations ---------------------------- */

/* Room for one more held item on SO; C.mu held. */
static int held_room(struct obj *so)
{
	if (so->nheld < so->cap_held)
		return 1;
	size_t cap = so->cap_held ? so->cap_held * 2 : 16;
	struct held *h = realloc(so->held, cap * sizeof(*h));
	if (!h)
		return 0;
	so->held = h;
	so->cap_held = cap;
	return 1;
}

/* Hold ITEM back on SO, after what it holds already (held_room first). */
static void held_push(struct obj *so, struct held item)
{
	if (!so->nheld) {
		struct obj *c = obj_get(so->ctx, K_CTX);
		if (c)
			c->held_streams++;
	}
	so->held[so->nheld++] = item;
}

/* A stream destroyed while it holds work back drops that work. */
static void held_drop(struct obj *so)
{
	struct obj *c = obj_get(so->ctx, K_CTX);
	if (so->nheld && c && c->held_streams)
		c->held_streams--;
	so->nheld = 0;
}

static int wait_met(uint32_t word, uint32_t value, unsigned flags)
{
	switch (flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) {
	case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(word - value) >= 0;
	case CU_STREAM_WAIT_VALUE_EQ: return word == value;
	case CU_STREAM_WAIT_VALUE_AND: return (word & value) != 0;
	default: return ~(word | value) != 0; /* NOR */
	}
}

/* Run what SO holds back up to its first wait still unmet; 1 if anything
 * ran. A wait whose memory is gone counts as met. C.mu held. */
static int held_run(struct obj *so)
{
	struct obj *c = obj_get(so->ctx, K_CTX);
	size_t n = 0;
	if (!c)
		return 0;
	for (; n < so->nheld; n++) {
		const struct held *h = &so->held[n];
		unsigned char *p;
		if (h->kind == H_WAIT) {
			uint32_t word;
			if (dev_bytes(h->addr, sizeof(word), 0, &p) != CUDA_SUCCESS)
				continue;
			memcpy(&word, p, sizeof(word));
			if (!wait_met(word, h->value, h->flags))
				break;
		} else if (h->kind == H_WRITE) {
			if (dev_bytes(h->addr, sizeof(h->value), 1, &p) == CUDA_SUCCESS)
				memcpy(p, &h->value, sizeof(h->value));
		} else if (h->kind == H_KERNEL) {
			uint64_t end = run_work(c, so, h->ns);
			struct obj *x = h->obj ? obj_get(h->obj, K_GEXEC) : NULL;
			if (x)
				x->last_end = end;
		} else {
			struct obj *ev = obj_get(h->obj, K_EVENT);
			uint64_t now = sim_now_ns();
			if (ev && ev->seq == h->seq) /* not recorded again since */
				ev->last_end = so->last_end > now ? so->last_end : now;
		}
	}
	if (n == 0)
		return 0;
	memmove(so->held, so->held + n, (so->nheld - n) * sizeof(*so->held));
	so->nheld -= n;
	if (!so->nheld && c->held_streams)
		c->held_streams--;
	return 1;
}

/* After a write: every stream whose wait is met now runs on; what it writes
 * may meet other waits, so look again until nothing moves. C.mu held. */
static void held_release(void)
{
	for (int moved = 1; moved;) {
		moved = 0;
		for (uint32_t i = 0; i < C.nslots; i++) {
			struct obj *so = C.slots[i].o;
			if (so && so->kind == K_STREAM && so->nheld && held_run(so))
				moved = 1;
		}
	}
}

/* Queue DUR ns of kernels (of graph executable EXEC, 0: none) on stream SO
 * (NULL: the default streams) of context C; C.mu held. Returns when that
 * work ends, HELD_END while SO holds work back (held_room first). */
static uint64_t queue_work(struct obj *c, struct obj *so, uint64_t dur, uint64_t exec)
{
	if (so && so->nheld) {
		held_push(so, (struct held){.kind = H_KERNEL, .ns = dur, .obj = exec});
		return HELD_END;
	}
	return run_work(c, so, dur);
}

/* Work launched on a capturing stream does not run: it joins the graph the
 * capture fills. Into a capture some illegal call invalidated, nothing more
 * goes. */
static CUresult capture_add(struct obj *so, uint64_t kernels, uint64_t ns)
{
	if (so->capture == CAPTURE_INVALIDATED)
		return SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	struct obj *g = obj_get(so->cap_graph, K_GRAPH);
	if (g) {
		g->kernels = add_sat(g->kernels, kernels);
		g->ns = add_sat(g->ns, ns);
	}
	return CUDA_SUCCESS;
}

/* A "hami_sim_touch" kernel adds 1 to each of the *(uint64_t *)params[1]
 * bytes at *(CUdeviceptr *)params[0], at the launch (as copies move bytes at
 * the call): memory a kernel reads and writes. Memory it may not reach is a
 * fault, reported by the launch itself (the real driver reports it at the
 * next synchronize) and sticky on the context. C.mu held. */
static CUresult touch(struct obj *c, void **params)
{
	CUdeviceptr p;
	uint64_t n;
	unsigned char *bytes;
	if (!params || !params[0] || !params[1])
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&p, params[0], sizeof(p));
	memcpy(&n, params[1], sizeof(n));
	CUresult r = n ? dev_bytes_from(c, p, n, 1, &bytes) : CUDA_SUCCESS;
	for (uint64_t i = 0; r == CUDA_SUCCESS && i < n; i++)
		bytes[i]++;
	return r;
}

/* Queue the kernel's simulated time on the device and return at once (on a
 * capturing stream: add it to the capture). "hami_sim_busy*" kernels take
 * *(uint64_t *)kernelParams[0] ns; others one HAMI_SIM_NS_PER_WAVE per wave of
 * sm_count blocks. Every launch entry point (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel and their _ptsz forms) comes here. */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		       unsigned bz, CUstream s, void **params)
{
	CUresult r = ready();
	if (r)
		return r;
	sim_launch_cpu();
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *fo = obj_get(H(f), K_FUNC), *c, *so, *mod;
	uint64_t ch, dur;
	if (!fo || !(mod = obj_get(fo->parent, K_MODULE))) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (c->fault) {
		r = c->fault;
		goto out;
	}
	if ((r = module_code(mod)) != CUDA_SUCCESS || (r = local_memory(c, fo->name)) != CUDA_SUCCESS)
		goto out;
	if (strncmp(fo->name, "hami_sim_touch", 14) == 0 && !(so && so->capture != CAPTURE_NONE) &&
	    (r = touch(c, params)) != CUDA_SUCCESS)
		goto out;
	if (strncmp(fo->name, "hami_sim_busy", 13) == 0) {
		if (!params || !params[0]) {
			r = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		memcpy(&dur, params[0], sizeof(dur));
	} else {
		const struct sim_state *st = S();
		unsigned __int128 blocks = (unsigned __int128)gx * gy * gz;
		unsigned sm = st->dev[c->dev].sm_count;
		unsigned __int128 t = (blocks + sm - 1) / sm * st->hdr.ns_per_wave;
		dur = t > UINT64_MAX ? UINT64_MAX : (uint64_t)t;
	}
	if (so && so->capture != CAPTURE_NONE)
		r = capture_add(so, 1, dur);
	else if (so && so->nheld && !held_room(so))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else
		queue_work(c, so, dur, 0);
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	GATE();
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	GATE();
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams)
{
	if (!config)
		return ready() ? ready() : CUDA_ERROR_INVALID_VALUE;
	return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
		      config->blockDimZ, config->hStream, kernelParams);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	GATE();
	return launch_ex(config, f, kernelParams);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	GATE();
	return launch_ex(config, f, kernelParams);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
				   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
				   void **kernelParams)
{
	GATE();
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
					unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
					unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
					void **kernelParams)
{
	GATE();
	return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams);
}

/* ---- stream memory operations ------------------------------------------- */

/* A 32-bit word of device memory a stream waits on or writes: 4-aligned, in
 * a live allocation of ours. C.mu held. */
static CUresult memop_word(CUdeviceptr addr, int write, unsigned char **p)
{
	if (addr & 3)
		return CUDA_ERROR_INVALID_VALUE;
	return dev_bytes(addr, sizeof(uint32_t), write, p);
}

/* Work queued on S after the wait does not start until the word meets the
 * condition (it is looked at when a write happens). Only created streams
 * hold work back: on a default stream an unmet wait is CUDA_ERROR_NOT_SUPPORTED. */
static CUresult wait_value(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned flags)
{
	CUresult r = ready();
	if (r)
		return r;
	if ((flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > CU_STREAM_WAIT_VALUE_NOR)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	unsigned char *p;
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (so && so->capture != CAPTURE_NONE) {
		r = capture_add(so, 0, 0); /* a node that takes no time */
		goto out;
	}
	if ((r = memop_word(addr, 0, &p)) != CUDA_SUCCESS)
		goto out;
	struct held item = {.kind = H_WAIT, .flags = flags, .addr = addr, .value = value};
	uint32_t word;
	memcpy(&word, p, sizeof(word));
	if ((!so || !so->nheld) && wait_met(word, value, flags))
		goto out;
	if (!so)
		r = CUDA_ERROR_NOT_SUPPORTED;
	else if (!held_room(so))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	else
		held_push(so, item);
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The word is written when S gets there: at once, unless S holds work back;
 * then every wait it meets lets its stream go on. */
static CUresult write_value(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned flags)
{
	CUresult r = ready();
	if (r)
		return r;
	if (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	unsigned char *p;
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (so && so->capture != CAPTURE_NONE) {
		r = capture_add(so, 0, 0);
		goto out;
	}
	if ((r = memop_word(addr, 1, &p)) != CUDA_SUCCESS)
		goto out;
	if (so && so->nheld) {
		if (!held_room(so))
			r = CUDA_ERROR_OUT_OF_MEMORY;
		else
			held_push(so, (struct held){.kind = H_WRITE, .addr = addr, .value = value});
		goto out;
	}
	memcpy(p, &value, sizeof(value));
	held_release();
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The first exports (CUDA 8.0) and the _v2 ones (11.7) take the same
 * arguments, with or without the per-thread default stream; the sim makes no
 * difference between them: one function each, under every name. */
CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	GATE();
	return wait_value(stream, addr, value, flags);
}

CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
	GATE();
	return write_value(stream, addr, value, flags);
}

#define SAME_AS(name) __attribute__((alias(#name)))
CUresult cuStreamWaitValue32_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWaitValue32);
CUresult cuStreamWaitValue32_v2(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWaitValue32);
CUresult cuStreamWaitValue32_v2_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWaitValue32);
CUresult cuStreamWriteValue32_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWriteValue32);
CUresult cuStreamWriteValue32_v2(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWriteValue32);
CUresult cuStreamWriteValue32_v2_ptsz(CUstream, CUdeviceptr, cuuint32_t, unsigned int) SAME_AS(cuStreamWriteValue32);

/* ---- events ------------------------------------------------------------- */

#define EVENT_FLAGS (SIM_CU_EVENT_BLOCKING_SYNC | SIM_CU_EVENT_DISABLE_TIMING | SIM_CU_EVENT_INTERPROCESS)

/* An event belongs to the context current at its creation, and dies with it. */
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	/* Interprocess events must not time, as the real driver insists. */
	if (!phEvent || (Flags & ~EVENT_FLAGS) ||
	    ((Flags & SIM_CU_EVENT_INTERPROCESS) && !(Flags & SIM_CU_EVENT_DISABLE_TIMING)))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	uint64_t ch, h;
	struct obj *c = cur_ctx(&ch), *o;
	if (!c) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (device_busy(c->dev)) {
		r = CUDA_ERROR_DEVICE_UNAVAILABLE;
	} else if (!(h = obj_new(K_EVENT, &o))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		o->dev = c->dev;
		o->ctx = ch;
		o->flags = Flags;
		*phEvent = (CUevent)(uintptr_t)h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	if (obj_get(H(hEvent), K_EVENT))
		obj_free(H(hEvent));
	else
		r = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The event completes when everything queued on the stream so far has run
 * (default streams: everything queued in the context), or now if that is
 * already done: an event on an idle stream is stamped at its record. On a
 * capturing stream a record is only a dependency inside the capture; the
 * event itself does not change. */
static CUresult event_record(CUevent e, CUstream s, unsigned flags)
{
	CUresult r = ready();
	if (r)
		return r;
	if (flags & ~(unsigned)SIM_CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *ev = obj_get(H(e), K_EVENT), *c, *so;
	uint64_t ch;
	if (!ev) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (ch != ev->ctx) {
		r = CUDA_ERROR_INVALID_HANDLE; /* event and stream of different contexts */
		goto out;
	}
	if (so && so->capture != CAPTURE_NONE) {
		r = capture_add(so, 0, 0);
		goto out;
	}
	if (so && so->nheld) { /* completes when the stream gets there */
		if (!held_room(so)) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		ev->seq++;
		ev->last_end = HELD_END;
		ev->recorded = 1;
		held_push(so, (struct held){.kind = H_EVENT, .obj = H(e), .seq = ev->seq});
		goto out;
	}
	uint64_t end = so ? so->last_end : c->last_end, now = sim_now_ns();
	ev->seq++;
	ev->last_end = end > now ? end : now;
	ev->recorded = 1;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	GATE();
	return event_record(hEvent, hStream, 0);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	GATE();
	return event_record(hEvent, hStream, 0);
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	GATE();
	return event_record(hEvent, hStream, flags);
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	GATE();
	return event_record(hEvent, hStream, flags);
}

/* When event E completes (0: never recorded, which counts as complete). */
static CUresult event_end(CUevent e, uint64_t *end, int *dev)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *ev = obj_get(H(e), K_EVENT);
	if (ev) {
		*end = ev->recorded ? ev->last_end : 0;
		*dev = ev->dev;
	} else {
		r = CUDA_ERROR_INVALID_HANDLE;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuEventQuery(CUevent hEvent)
{
	GATE();
	uint64_t end;
	int dev;
	CUresult r = event_end(hEvent, &end, &dev);
	if (r == CUDA_SUCCESS && end > sim_now_ns())
		r = CUDA_ERROR_NOT_READY;
	return r;
}

/* Sleeps until the event completes; pools settle as after any synchronize. */
CUresult cuEventSynchronize(CUevent hEvent)
{
	GATE();
	uint64_t end;
	int dev;
	CUresult r;
	while ((r = event_end(hEvent, &end, &dev)) == CUDA_SUCCESS && end == HELD_END)
		sleep_until(sim_now_ns() + HELD_POLL_NS);
	if (r == CUDA_SUCCESS)
		synchronize(end, dev);
	return r;
}

/* Milliseconds between the completions of two recorded timing events. */
static CUresult elapsed(float *ms, CUevent start, CUevent end)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *a = obj_get(H(start), K_EVENT), *b = obj_get(H(end), K_EVENT);
	uint64_t now = sim_now_ns();
	if (!a || !b || !a->recorded || !b->recorded || ((a->flags | b->flags) & SIM_CU_EVENT_DISABLE_TIMING))
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (a->last_end > now || b->last_end > now)
		r = CUDA_ERROR_NOT_READY;
	else
		*ms = (float)((double)(int64_t)(b->last_end - a->last_end) / 1e6);
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	GATE();
	return elapsed(pMilliseconds, hStart, hEnd);
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	GATE();
	return elapsed(pMilliseconds, hStart, hEnd);
}

/* ---- stream capture and graphs ------------------------------------------ */

/* A graph is what its kernels add up to (a count and a total duration; a
 * launch runs them back to back) and its memory nodes. Graphs belong to no
 * context (they outlive the one they were captured in); executables to the
 * context current when they were instantiated. A capture fills a graph object
 * from its beginning (cuStreamGetCaptureInfo_v2 can name it), handed out by
 * cuStreamEndCapture. */

/* The stream object a capture call works on: only created streams capture
 * here (the legacy stream cannot on the real driver either). */
static CUresult capture_stream(CUstream s, struct obj **so)
{
	struct obj *c;
	uint64_t ch;
	CUresult r = stream_ctx(s, &c, &ch, so);
	if (r == CUDA_SUCCESS && !*so)
		r = SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	return r;
}

/* MODE: CUstreamCaptureMode, which decides which capture-unsafe calls
 * invalidate this capture (capture_unsafe). The calling thread owns it: a
 * capture not begun RELAXED must end on it. */
static CUresult begin_capture(CUstream s, int mode)
{
	CUresult r = ready();
	if (r)
		return r;
	if (mode < SIM_CU_STREAM_CAPTURE_MODE_GLOBAL || mode > SIM_CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *so, *g;
	uint64_t gh;
	if ((r = capture_stream(s, &so)) == CUDA_SUCCESS) {
		if (so->capture != CAPTURE_NONE) {
			r = SIM_CUDA_ERROR_ILLEGAL_STATE;
		} else if (!(gh = obj_new(K_GRAPH, &g))) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			g->dev = g->mdev = so->dev;
			g->capturing = 1;
			so->capture = CAPTURE_ACTIVE;
			so->cap_mode = mode;
			so->cap_thread = thread_id();
			so->cap_graph = gh;
			so->cap_id = ++C.capture_ids;
			C.ncaptures++;
		}
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* CUDA 10.0's form had no mode: global, the default. */
CUresult cuStreamBeginCapture(CUstream hStream)
{
	GATE();
	return begin_capture(hStream, SIM_CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
	GATE();
	return begin_capture(hStream, SIM_CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode)
{
	GATE();
	return begin_capture(hStream, mode);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode)
{
	GATE();
	return begin_capture(hStream, mode);
}

/* Ends the capture either way; an invalidated one gives no graph. From a
 * thread other than the one that began it (unless it began RELAXED):
 * CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, and the capture goes on. */
static CUresult end_capture(CUstream s, CUgraph *phGraph)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *so, *g;
	if ((r = capture_stream(s, &so)) != CUDA_SUCCESS)
		goto out;
	if (so->capture == CAPTURE_NONE) {
		r = SIM_CUDA_ERROR_ILLEGAL_STATE;
		goto out;
	}
	if (so->cap_mode != SIM_CU_STREAM_CAPTURE_MODE_RELAXED && so->cap_thread != thread_id()) {
		r = SIM_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
		goto out;
	}
	*phGraph = NULL;
	if (so->capture == CAPTURE_INVALIDATED || !(g = obj_get(so->cap_graph, K_GRAPH))) {
		capture_drop(so);
		r = SIM_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		goto out;
	}
	g->capturing = 0;
	*phGraph = (CUgraph)(uintptr_t)so->cap_graph;
	so->capture = CAPTURE_NONE;
	so->cap_graph = 0;
	C.ncaptures--;
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	GATE();
	return end_capture(hStream, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	GATE();
	return end_capture(hStream, phGraph);
}

/* STATUS: CUstreamCaptureStatus. The default streams never capture here.
 * Capture-safe: it never invalidates anything. */
static CUresult is_capturing(CUstream s, int *status)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	if ((r = stream_ctx(s, &c, &ch, &so)) == CUDA_SUCCESS)
		*status = so ? so->capture : CAPTURE_NONE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuStreamIsCapturing(CUstream hStream, int *captureStatus)
{
	GATE();
	return is_capturing(hStream, captureStatus);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, int *captureStatus)
{
	GATE();
	return is_capturing(hStream, captureStatus);
}

/* cuStreamGetCaptureInfo, _v2 and _v3 (capture-safe). The status always;
 * the rest only while the capture is active, as documented: the sequence's
 * id (unique in the process), the graph it fills, and no dependencies (the
 * sim keeps no node edges). Output pointers may be NULL but the status's. */
static CUresult capture_info(CUstream s, int *status, cuuint64_t *id, CUgraph *graph, const CUgraphNode **deps,
			     const CUgraphEdgeData **edges, size_t *ndeps)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!status || (edges && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *c, *so;
	uint64_t ch;
	if ((r = stream_ctx(s, &c, &ch, &so)) == CUDA_SUCCESS) {
		*status = so ? so->capture : CAPTURE_NONE;
		if (so && so->capture == CAPTURE_ACTIVE) {
			if (id)
				*id = so->cap_id;
			if (graph)
				*graph = (CUgraph)(uintptr_t)so->cap_graph;
			if (deps)
				*deps = NULL;
			if (edges)
				*edges = NULL;
			if (ndeps)
				*ndeps = 0;
		}
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuStreamGetCaptureInfo(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
				   const CUgraphNode **dependencies_out, size_t *numDependencies_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
			    numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out,
					CUgraph *graph_out, const CUgraphNode **dependencies_out,
					size_t *numDependencies_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
			    numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
				   const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,
				   size_t *numDependencies_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			    numDependencies_out);
}

CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, int *captureStatus_out, cuuint64_t *id_out,
					CUgraph *graph_out, const CUgraphNode **dependencies_out,
					const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
	GATE();
	return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
			    numDependencies_out);
}

/* The calling thread's interaction mode: *MODE in, the previous one out. */
CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!mode || *mode < SIM_CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > SIM_CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	int old = t_capmode;
	t_capmode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* An executable copies its graph's memory nodes and works out what one run
 * needs of the graph pool: the peak, in node order, of the allocations live
 * at once (each rounded up to GRAN). A graph with memory nodes has at most
 * one executable at a time (CUDA_ERROR_INVALID_VALUE), as documented; a
 * graph a capture still fills cannot be instantiated (the sim's choice). */
static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!phGraphExec || (flags & ~SIM_CUDA_GRAPH_INSTANTIATE_FLAGS))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *g = obj_get(H(hGraph), K_GRAPH), *c, *x;
	struct gnode *nodes = NULL;
	uint64_t ch, h;
	if (!g || g->capturing || (g->nnodes && g->execs)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (!(c = cur_ctx(&ch))) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (g->nnodes && !(nodes = malloc(g->nnodes * sizeof(*nodes)))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (!(h = obj_new(K_GEXEC, &x))) {
		free(nodes);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		x->dev = c->dev;
		x->ctx = ch;
		x->kernels = g->kernels;
		x->ns = g->ns;
		x->flags = (unsigned)flags;
		x->mdev = g->mdev;
		x->graph = H(hGraph);
		if (g->nnodes) {
			memcpy(nodes, g->nodes, g->nnodes * sizeof(*nodes));
			x->nodes = nodes;
			x->nnodes = x->cap_nodes = g->nnodes;
			g->execs++;
		}
		uint64_t run = 0;
		for (size_t i = 0; i < x->nnodes; i++) {
			uint64_t fp = round_up(x->nodes[i].size, GRAN);
			if (x->nodes[i].kind == GN_ALLOC && (run = add_sat(run, fp)) > x->need)
				x->need = run;
			else if (x->nodes[i].kind == GN_FREE)
				sub_to_zero(&run, fp);
		}
		*phGraphExec = (CUgraphExec)(uintptr_t)h;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	GATE();
	return instantiate(phGraphExec, hGraph, flags);
}

/* The CUDA 11 form: no error node, an empty log. */
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
			       char *logBuffer, size_t bufferSize)
{
	GATE();
	if (phErrorNode)
		*phErrorNode = NULL;
	if (logBuffer && bufferSize)
		logBuffer[0] = 0;
	return instantiate(phGraphExec, hGraph, 0);
}

/* Free the allocations executable H's last run left live. */
static void exec_free_live(uint64_t h)
{
	for (size_t i = 0; i < C.nal; i++)
		if (C.al[i].live && C.al[i].graph && C.al[i].gexec == h)
			alloc_release(&C.al[i]);
}

/*
 * One run of executable X (handle H) on stream SO of context C, not capturing.
 * Refused with CUDA_ERROR_INVALID_VALUE, before anything happens, while
 * allocations of its last run are live (unless it was instantiated with
 * AUTO_FREE_ON_LAUNCH: they are freed first) or when a free node's
 * allocation made before the capture is gone. Then its memory is mapped
 * (CUDA_ERROR_OUT_OF_MEMORY), its kernels queued, the allocations it does
 * not free become live at their addresses, holding bytes like any other, and
 * the allocations its free nodes name are freed.
 */
static CUresult exec_run(uint64_t h, struct obj *x, struct obj *c, struct obj *so)
{
	size_t keep = 0, made = 0;
	uint64_t *offs = NULL;
	CUresult r = CUDA_SUCCESS;
	if (x->live && !(x->flags & SIM_CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < x->nnodes; i++) {
		const struct gnode *k = &x->nodes[i];
		if (k->kind == GN_FREE_EXT && !al_find(k->addr, 1))
			return CUDA_ERROR_INVALID_VALUE;
		if (k->kind == GN_ALLOC && !k->freed)
			keep++;
	}
	if (keep && (!(offs = malloc(keep * sizeof(*offs))) || !al_room(keep))) {
		free(offs);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (size_t i = 0; i < x->nnodes && made < keep; i++) {
		const struct gnode *k = &x->nodes[i];
		if (k->kind == GN_ALLOC && !k->freed && sim_mem_reserve(k->size, &offs[made++]) < 0) {
			made--;
			r = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
	}
	if (r == CUDA_SUCCESS)
		r = exec_map(x);
	if (r != CUDA_SUCCESS) {
		size_t n = 0;
		for (size_t i = 0; i < x->nnodes && n < made; i++) {
			const struct gnode *k = &x->nodes[i];
			if (k->kind == GN_ALLOC && !k->freed)
				sim_mem_release(offs[n++], k->size, NULL, 0);
		}
		free(offs);
		return r;
	}
	if (x->live)
		exec_free_live(h); /* AUTO_FREE_ON_LAUNCH */
	x->last_end = x->kernels ? queue_work(c, so, x->ns, h) : sim_now_ns();
	made = 0;
	for (size_t i = 0; i < x->nnodes; i++) {
		const struct gnode *k = &x->nodes[i];
		if (k->kind == GN_ALLOC && !k->freed) {
			struct alloc *a = al_insert(k->addr, k->size, x->ctx, x->mdev, offs[made++]);
			a->graph = 1;
			a->gexec = h;
			a->footprint = round_up(k->size, GRAN);
			x->live++;
			x->live_bytes += a->footprint;
		}
	}
	free(offs);
	for (size_t i = 0; i < x->nnodes; i++) {
		struct alloc *a;
		if (x->nodes[i].kind == GN_FREE_EXT && (a = al_find(x->nodes[i].addr, 1)) != NULL)
			alloc_release(a);
	}
	al_compact();
	return CUDA_SUCCESS;
}

/* On a capturing stream the graph's kernels join the capture (as a child
 * graph would); one with memory nodes cannot (CUDA_ERROR_NOT_SUPPORTED, and
 * the capture is invalidated: child graphs may not hold memory nodes). */
static CUresult graph_launch(CUgraphExec e, CUstream s)
{
	CUresult r = ready();
	if (r)
		return r;
	sim_launch_cpu();
	pthread_mutex_lock(&C.mu);
	struct obj *x = obj_get(H(e), K_GEXEC), *c, *so;
	uint64_t ch;
	if (!x) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		goto out;
	if (ch != x->ctx) {
		r = CUDA_ERROR_INVALID_CONTEXT; /* instantiated in another context */
		goto out;
	}
	if (c->fault) {
		r = c->fault;
		goto out;
	}
	if (so && so->capture != CAPTURE_NONE) {
		if (x->nnodes && so->capture == CAPTURE_ACTIVE)
			r = capture_fail(so, CUDA_ERROR_NOT_SUPPORTED);
		else
			r = capture_add(so, x->kernels, x->ns);
	} else if (so && so->nheld && !held_room(so)) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		r = exec_run(H(e), x, c, so);
	}
out:
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	GATE();
	return graph_launch(hGraphExec, hStream);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	GATE();
	return graph_launch(hGraphExec, hStream);
}

/* Maps the executable's graph memory now (CUDA_ERROR_OUT_OF_MEMORY), so
 * that its launches need not; runs nothing. Into a capture: unsupported. */
static CUresult graph_upload(CUgraphExec e, CUstream s)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *x = obj_get(H(e), K_GEXEC), *c, *so;
	uint64_t ch;
	if (!x)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if ((r = stream_ctx(s, &c, &ch, &so)) != CUDA_SUCCESS)
		;
	else if (ch != x->ctx)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else if (so && so->capture != CAPTURE_NONE)
		r = capture_fail(so, SIM_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	else
		r = exec_map(x);
	pthread_mutex_unlock(&C.mu);
	return r;
}

static CUresult graph_free(uint64_t h, enum kind k);

/* CUDA 12: flags in a struct; UPLOAD maps the memory now, on hUploadStream. */
static CUresult instantiate_with_params(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = instantiate(phGraphExec, hGraph, p->flags & ~(cuuint64_t)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
	if (r == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) &&
	    (r = graph_upload(*phGraphExec, p->hUploadStream)) != CUDA_SUCCESS) {
		graph_free(H(*phGraphExec), K_GEXEC);
		*phGraphExec = NULL;
	}
	p->hErrNode_out = NULL;
	p->result_out = r == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
	return r;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	GATE();
	return instantiate_with_params(phGraphExec, hGraph, p);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
					   CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	GATE();
	return instantiate_with_params(phGraphExec, hGraph, p);
}

CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)
{
	GATE();
	return graph_upload(hGraphExec, hStream);
}

CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	GATE();
	return graph_upload(hGraphExec, hStream);
}

/* Bad graph handles are INVALID_VALUE here, as the real driver documents them
 * for these calls (and for instantiation); a launch says INVALID_HANDLE.
 * Destroying an executable leaves its graph memory reserved (spare) and the
 * allocations its runs left live; destroying a graph a capture still fills
 * is refused (the sim's choice). */
static CUresult graph_free(uint64_t h, enum kind k)
{
	CUresult r = ready();
	if (r)
		return r;
	pthread_mutex_lock(&C.mu);
	struct obj *o = obj_get(h, k);
	if (!o || (k == K_GRAPH && o->capturing))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (k == K_GEXEC)
		exec_destroy(h, o);
	else
		obj_free(h);
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	GATE();
	return graph_free(H(hGraphExec), K_GEXEC);
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
	GATE();
	return graph_free(H(hGraph), K_GRAPH);
}

/* ---- reading a graph ---------------------------------------------------- */

/*
 * A graph shows its memory nodes, in capture order, one after another (a
 * capture on one stream is a chain); its kernels are only counted, so they
 * are no nodes here. A node's handle names its graph's slot and its index.
 */
static CUgraphNode graph_node_handle(uint64_t graph, size_t i)
{
	uint64_t slot = (graph >> 8) & 0xffffff;
	return (CUgraphNode)(uintptr_t)(slot << 40 | (uint64_t)(i + 1) << 8 | K_GNODE);
}

/* The node behind handle N (C.mu held), or NULL. */
static struct gnode *graph_node(CUgraphNode n)
{
	uint64_t h = H(n), slot = h >> 40, i = (h >> 8) & 0xffffffff;
	if ((h & 0xff) != K_GNODE || !slot || slot > C.nslots || !i)
		return NULL;
	struct obj *g = C.slots[slot - 1].o;
	if (!g || g->kind != K_GRAPH || i > g->nnodes)
		return NULL;
	return &g->nodes[i - 1];
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
	GATE();
	if (!numNodes)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *g = obj_get(H(hGraph), K_GRAPH);
	CUresult r = g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	if (g && nodes) {
		size_t n = *numNodes < g->nnodes ? *numNodes : g->nnodes;
		for (size_t i = 0; i < n; i++)
			nodes[i] = graph_node_handle(H(hGraph), i);
		for (size_t i = n; i < *numNodes; i++)
			nodes[i] = NULL;
		*numNodes = n;
	} else if (g) {
		*numNodes = g->nnodes;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* The chain: node i, then node i + 1. The CUDA 10 form, without edge data. */
CUresult cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, size_t *numEdges)
{
	GATE();
	if (!numEdges || (!from) != (!to))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct obj *g = obj_get(H(hGraph), K_GRAPH);
	CUresult r = g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	size_t edges = g && g->nnodes ? g->nnodes - 1 : 0;
	if (g && from) {
		size_t n = *numEdges < edges ? *numEdges : edges;
		for (size_t i = 0; i < n; i++) {
			from[i] = graph_node_handle(H(hGraph), i);
			to[i] = graph_node_handle(H(hGraph), i + 1);
		}
		*numEdges = n;
	} else if (g) {
		*numEdges = edges;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, int *type)
{
	GATE();
	if (!type)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct gnode *k = graph_node(hNode);
	if (k)
		*type = k->kind == GN_ALLOC ? CU_GRAPH_NODE_TYPE_MEM_ALLOC : CU_GRAPH_NODE_TYPE_MEM_FREE;
	pthread_mutex_unlock(&C.mu);
	return k ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
	GATE();
	if (!params)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct gnode *k = graph_node(hNode);
	int ok = k && k->kind == GN_ALLOC;
	if (ok) {
		memset(params, 0, sizeof(*params));
		params->poolProps.allocType = 1; /* pinned */
		params->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		params->poolProps.location.id = k->ordinal;
		params->bytesize = k->size;
		params->dptr = k->addr;
	}
	pthread_mutex_unlock(&C.mu);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr)
{
	GATE();
	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct gnode *k = graph_node(hNode);
	int ok = k && k->kind != GN_ALLOC;
	if (ok)
		*dptr = k->addr;
	pthread_mutex_unlock(&C.mu);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- graph memory ------------------------------------------------------- */

/* CUgraphMem_attribute of DEV's graph pool (this process's), cuuint64_t. */
CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(device);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	const struct gpool *g = &C.gp[p];
	switch (attr) {
	case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = g->used; break;
	case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = g->used_high; break;
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = g->reserved; break;
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = g->reserved_high; break;
	default: r = CUDA_ERROR_INVALID_VALUE; break;
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* Only the high watermarks, and only reset: writing 0 brings them down to
 * the current figure (as the pools' attributes do). */
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(device);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!value || *(cuuint64_t *)value != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	struct gpool *g = &C.gp[p];
	if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
		g->used_high = g->used;
	else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
		g->reserved_high = g->reserved;
	else
		r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&C.mu);
	return r;
}

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(device);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	gpool_trim(p);
	pthread_mutex_unlock(&C.mu);
	return CUDA_SUCCESS;
}

/* ---- sim-only knobs ------------------------------------------------------- */

/* Memory the driver takes by itself (modules, local memory, workspaces):
 * charged to the device and to our entry like any other, so NVML's
 * per-process figure and the device's used show it, and a reclaim returns it. */
int hamiSimDriverInternal(int device, unsigned long long bytes)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	int p = phys(device);
	if (p < 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&C.mu);
	uint64_t old = C.internal[p];
	if (bytes > old)
		r = charge(p, bytes - old);
	else if (bytes < old)
		sim_uncharge((unsigned)p, old - bytes);
	if (r == CUDA_SUCCESS) {
		C.internal[p] = bytes;
		sim_note_internal((unsigned)p, bytes + C.own[p]);
	}
	pthread_mutex_unlock(&C.mu);
	return r;
}

/* How many events this process holds (made, not destroyed, their context
 * alive): what a leak of events shows in. */
int hamiSimEvents(unsigned long long *count)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&C.mu);
	unsigned long long n = 0;
	for (uint32_t i = 0; i < C.nslots; i++)
		if (C.slots[i].o && C.slots[i].o->kind == K_EVENT)
			n++;
	*count = n;
	pthread_mutex_unlock(&C.mu);
	return CUDA_SUCCESS;
}

int hamiSimGraphicsProcess(int graphics)
{
	GATE();
	CUresult r = ready();
	if (r)
		return r;
	return sim_set_graphics(graphics) == SIM_OK ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

/* ---- process checkpoints ------------------------------------------------ */

/* Another process's GPU state to host memory and back (sim_mem.c does the
 * work). A pid that names no live CUDA process of this simulated GPU is
 * CUDA_ERROR_INVALID_VALUE; a call in the wrong state CUDA_ERROR_ILLEGAL_STATE,
 * and changes nothing. A caller that is neither root nor the target's own
 * user is refused with CUDA_ERROR_OPERATING_SYSTEM, as the real driver
 * answered a checkpoint run without root's rights (docs/parking.md). The
 * argument structs may be NULL; only the lock's timeoutMs is read. */
static CUresult ckpt_result(int r)
{
	switch (r) {
	case SIM_OK: return CUDA_SUCCESS;
	case SIM_ENOENT: return CUDA_ERROR_INVALID_VALUE;
	case SIM_EPERM: return CUDA_ERROR_OPERATING_SYSTEM;
	case SIM_ESTATE: return CUDA_ERROR_ILLEGAL_STATE;
	case SIM_ETIMEDOUT: return CUDA_ERROR_TIMEOUT;
	case SIM_ENOMEM: return CUDA_ERROR_OUT_OF_MEMORY;
	default: return CUDA_ERROR_OPERATING_SYSTEM;
	}
}

/* Calls of the target already running finish first; 0 or no args: no
 * timeout, else CUDA_ERROR_TIMEOUT and the target runs on. */
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	CUresult r = ready();
	return r ? r : ckpt_result(sim_ckpt_lock(pid, args ? args->timeoutMs : 0));
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	CUresult r = ready();
	return r ? r : ckpt_result(sim_ckpt_checkpoint(pid));
}

/* CUDA_ERROR_OUT_OF_MEMORY when a device lacks room for what the process
 * held there; it stays checkpointed. */
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	CUresult r = ready();
	return r ? r : ckpt_result(sim_ckpt_restore(pid));
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	CUresult r = ready();
	return r ? r : ckpt_result(sim_ckpt_unlock(pid));
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	CUresult r = ready();
	if (r)
		return r;
	if (!state)
		return CUDA_ERROR_INVALID_VALUE;
	unsigned st;
	if ((r = ckpt_result(sim_ckpt_state(pid, &st))) == CUDA_SUCCESS)
		*state = (CUprocessState)st;
	return r;
}

/* ---- entry points by name ----------------------------------------------- */

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	if (ppExportTable)
		*ppExportTable = NULL;
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus);

/* Our own definitions, whatever a preloaded library interposes: taking the
 * address of an exported function would go through the GOT and could give
 * someone else's. These hidden aliases are the addresses dlsym(handle, name)
 * returns for this library. */
#define LOCAL(f) extern __typeof__(f) local_##f __attribute__((alias(#f), visibility("hidden")))
LOCAL(cuInit);
LOCAL(cuDriverGetVersion);
LOCAL(cuGetErrorString);
LOCAL(cuGetErrorName);
LOCAL(cuGetProcAddress);
LOCAL(cuGetProcAddress_v2);
LOCAL(cuGetExportTable);
LOCAL(cuDeviceGet);
LOCAL(cuDeviceGetCount);
LOCAL(cuDeviceGetName);
LOCAL(cuDeviceGetUuid);
LOCAL(cuDeviceGetUuid_v2);
LOCAL(cuDeviceTotalMem_v2);
LOCAL(cuDeviceGetAttribute);
LOCAL(cuDeviceGetPCIBusId);
LOCAL(cuDevicePrimaryCtxRetain);
LOCAL(cuDevicePrimaryCtxRelease_v2);
LOCAL(cuDevicePrimaryCtxRelease);
LOCAL(cuDevicePrimaryCtxReset_v2);
LOCAL(cuDevicePrimaryCtxGetState);
LOCAL(cuDevicePrimaryCtxSetFlags_v2);
LOCAL(cuCtxCreate_v2);
LOCAL(cuCtxCreate_v3);
LOCAL(cuCtxCreate_v4);
LOCAL(cuCtxDestroy_v2);
LOCAL(cuCtxSetCurrent);
LOCAL(cuCtxGetCurrent);
LOCAL(cuCtxGetDevice);
LOCAL(cuCtxGetId);
LOCAL(cuCtxPushCurrent_v2);
LOCAL(cuCtxPopCurrent_v2);
LOCAL(cuCtxSynchronize);
LOCAL(cuMemAlloc_v2);
LOCAL(cuMemAllocPitch_v2);
LOCAL(cuMemAllocManaged);
LOCAL(cuMemFree_v2);
LOCAL(cuMemGetInfo_v2);
LOCAL(cuMemGetAddressRange_v2);
LOCAL(cuMemcpyHtoD_v2);
LOCAL(cuMemcpyHtoD_v2_ptds);
LOCAL(cuMemcpyDtoH_v2);
LOCAL(cuMemcpyDtoH_v2_ptds);
LOCAL(cuMemcpyDtoD_v2);
LOCAL(cuMemcpyDtoD_v2_ptds);
LOCAL(cuMemcpyHtoDAsync_v2);
LOCAL(cuMemcpyHtoDAsync_v2_ptsz);
LOCAL(cuMemcpyDtoHAsync_v2);
LOCAL(cuMemcpyDtoHAsync_v2_ptsz);
LOCAL(cuMemcpyDtoDAsync_v2);
LOCAL(cuMemcpyDtoDAsync_v2_ptsz);
LOCAL(cuMemsetD8_v2);
LOCAL(cuMemsetD8Async);
LOCAL(cuMemAllocAsync);
LOCAL(cuMemAllocAsync_ptsz);
LOCAL(cuMemAllocFromPoolAsync);
LOCAL(cuMemAllocFromPoolAsync_ptsz);
LOCAL(cuMemFreeAsync);
LOCAL(cuMemFreeAsync_ptsz);
LOCAL(cuMemPoolCreate);
LOCAL(cuMemPoolDestroy);
LOCAL(cuMemPoolTrimTo);
LOCAL(cuMemPoolGetAttribute);
LOCAL(cuMemPoolSetAttribute);
LOCAL(cuDeviceGetDefaultMemPool);
LOCAL(cuDeviceGetMemPool);
LOCAL(cuDeviceSetMemPool);
LOCAL(cuMemGetAllocationGranularity);
LOCAL(cuMemCreate);
LOCAL(cuMemRelease);
LOCAL(cuMemAddressReserve);
LOCAL(cuMemAddressFree);
LOCAL(cuMemMap);
LOCAL(cuMemUnmap);
LOCAL(cuMemSetAccess);
LOCAL(cuMemGetAccess);
LOCAL(cuMemRetainAllocationHandle);
LOCAL(cuMemGetAllocationPropertiesFromHandle);
LOCAL(cuPointerGetAttribute);
LOCAL(cuPointerGetAttributes);
LOCAL(cuDeviceCanAccessPeer);
LOCAL(cuCtxEnablePeerAccess);
LOCAL(cuCtxDisablePeerAccess);
LOCAL(cuIpcGetMemHandle);
LOCAL(cuMemHostAlloc);
LOCAL(cuMemFreeHost);
LOCAL(cuArrayCreate_v2);
LOCAL(cuArray3DCreate_v2);
LOCAL(cuArrayDestroy);
LOCAL(cuMipmappedArrayCreate);
LOCAL(cuMipmappedArrayDestroy);
LOCAL(cuStreamCreate);
LOCAL(cuStreamDestroy_v2);
LOCAL(cuStreamSynchronize);
LOCAL(cuStreamSynchronize_ptsz);
LOCAL(cuStreamQuery);
LOCAL(cuStreamQuery_ptsz);
LOCAL(cuStreamWaitValue32);
LOCAL(cuStreamWaitValue32_ptsz);
LOCAL(cuStreamWaitValue32_v2);
LOCAL(cuStreamWaitValue32_v2_ptsz);
LOCAL(cuStreamWriteValue32);
LOCAL(cuStreamWriteValue32_ptsz);
LOCAL(cuStreamWriteValue32_v2);
LOCAL(cuStreamWriteValue32_v2_ptsz);
LOCAL(cuModuleLoadData);
LOCAL(cuModuleUnload);
LOCAL(cuModuleGetFunction);
LOCAL(cuLaunchKernel);
LOCAL(cuLaunchKernel_ptsz);
LOCAL(cuLaunchKernelEx);
LOCAL(cuLaunchKernelEx_ptsz);
LOCAL(cuLaunchCooperativeKernel);
LOCAL(cuLaunchCooperativeKernel_ptsz);
LOCAL(cuEventCreate);
LOCAL(cuEventDestroy_v2);
LOCAL(cuEventRecord);
LOCAL(cuEventRecord_ptsz);
LOCAL(cuEventRecordWithFlags);
LOCAL(cuEventRecordWithFlags_ptsz);
LOCAL(cuEventQuery);
LOCAL(cuEventSynchronize);
LOCAL(cuEventElapsedTime);
LOCAL(cuEventElapsedTime_v2);
LOCAL(cuStreamBeginCapture);
LOCAL(cuStreamBeginCapture_ptsz);
LOCAL(cuStreamBeginCapture_v2);
LOCAL(cuStreamBeginCapture_v2_ptsz);
LOCAL(cuStreamEndCapture);
LOCAL(cuStreamEndCapture_ptsz);
LOCAL(cuStreamIsCapturing);
LOCAL(cuStreamIsCapturing_ptsz);
LOCAL(cuStreamGetCaptureInfo);
LOCAL(cuStreamGetCaptureInfo_ptsz);
LOCAL(cuStreamGetCaptureInfo_v2);
LOCAL(cuStreamGetCaptureInfo_v2_ptsz);
LOCAL(cuStreamGetCaptureInfo_v3);
LOCAL(cuStreamGetCaptureInfo_v3_ptsz);
LOCAL(cuThreadExchangeStreamCaptureMode);
LOCAL(cuGraphInstantiate_v2);
LOCAL(cuGraphInstantiateWithFlags);
LOCAL(cuGraphInstantiateWithParams);
LOCAL(cuGraphInstantiateWithParams_ptsz);
LOCAL(cuGraphGetNodes);
LOCAL(cuGraphGetEdges);
LOCAL(cuGraphNodeGetType);
LOCAL(cuGraphMemAllocNodeGetParams);
LOCAL(cuGraphMemFreeNodeGetParams);
LOCAL(cuGraphLaunch);
LOCAL(cuGraphLaunch_ptsz);
LOCAL(cuGraphExecDestroy);
LOCAL(cuGraphDestroy);
LOCAL(cuGraphUpload);
LOCAL(cuGraphUpload_ptsz);
LOCAL(cuDeviceGetGraphMemAttribute);
LOCAL(cuDeviceSetGraphMemAttribute);
LOCAL(cuDeviceGraphMemTrim);
LOCAL(cuCheckpointProcessLock);
LOCAL(cuCheckpointProcessCheckpoint);
LOCAL(cuCheckpointProcessRestore);
LOCAL(cuCheckpointProcessUnlock);
LOCAL(cuCheckpointProcessGetState);

/* Base name -> the exported function for CUDA versions >= since; rows of one
 * name in rising order. ptsz: the per-thread-default-stream variant. */
static const struct {
	const char *base;
	int since;
	void *fn;
	void *ptsz;
} procs[] = {
	{"cuInit", 2000, local_cuInit, NULL},
	{"cuDriverGetVersion", 2020, local_cuDriverGetVersion, NULL},
	{"cuGetErrorString", 6000, local_cuGetErrorString, NULL},
	{"cuGetErrorName", 6000, local_cuGetErrorName, NULL},
	{"cuGetProcAddress", 11030, local_cuGetProcAddress, NULL},
	{"cuGetProcAddress", 12000, local_cuGetProcAddress_v2, NULL},
	{"cuGetExportTable", 3000, local_cuGetExportTable, NULL},
	{"cuDeviceGet", 2000, local_cuDeviceGet, NULL},
	{"cuDeviceGetCount", 2000, local_cuDeviceGetCount, NULL},
	{"cuDeviceGetName", 2000, local_cuDeviceGetName, NULL},
	{"cuDeviceGetUuid", 9020, local_cuDeviceGetUuid, NULL},
	{"cuDeviceGetUuid", 11040, local_cuDeviceGetUuid_v2, NULL},
	{"cuDeviceTotalMem", 3020, local_cuDeviceTotalMem_v2, NULL},
	{"cuDeviceGetAttribute", 2000, local_cuDeviceGetAttribute, NULL},
	{"cuDeviceGetPCIBusId", 4010, local_cuDeviceGetPCIBusId, NULL},
	{"cuDevicePrimaryCtxRetain", 7000, local_cuDevicePrimaryCtxRetain, NULL},
	{"cuDevicePrimaryCtxRelease", 7000, local_cuDevicePrimaryCtxRelease, NULL},
	{"cuDevicePrimaryCtxRelease", 11000, local_cuDevicePrimaryCtxRelease_v2, NULL},
	{"cuDevicePrimaryCtxReset", 11000, local_cuDevicePrimaryCtxReset_v2, NULL},
	{"cuDevicePrimaryCtxGetState", 7000, local_cuDevicePrimaryCtxGetState, NULL},
	{"cuDevicePrimaryCtxSetFlags", 11000, local_cuDevicePrimaryCtxSetFlags_v2, NULL},
	{"cuCtxCreate", 3020, local_cuCtxCreate_v2, NULL},
	{"cuCtxCreate", 11040, local_cuCtxCreate_v3, NULL},
	{"cuCtxCreate", 12050, local_cuCtxCreate_v4, NULL},
	{"cuCtxDestroy", 4000, local_cuCtxDestroy_v2, NULL},
	{"cuCtxSetCurrent", 4000, local_cuCtxSetCurrent, NULL},
	{"cuCtxGetCurrent", 4000, local_cuCtxGetCurrent, NULL},
	{"cuCtxGetDevice", 2000, local_cuCtxGetDevice, NULL},
	{"cuCtxGetId", 12000, local_cuCtxGetId, NULL},
	{"cuCtxPushCurrent", 4000, local_cuCtxPushCurrent_v2, NULL},
	{"cuCtxPopCurrent", 4000, local_cuCtxPopCurrent_v2, NULL},
	{"cuCtxSynchronize", 2000, local_cuCtxSynchronize, NULL},
	{"cuMemAlloc", 3020, local_cuMemAlloc_v2, NULL},
	{"cuMemAllocPitch", 3020, local_cuMemAllocPitch_v2, NULL},
	{"cuMemAllocManaged", 6000, local_cuMemAllocManaged, NULL},
	{"cuMemFree", 3020, local_cuMemFree_v2, NULL},
	{"cuMemGetInfo", 3020, local_cuMemGetInfo_v2, NULL},
	{"cuMemGetAddressRange", 3020, local_cuMemGetAddressRange_v2, NULL},
	{"cuMemcpyHtoD", 3020, local_cuMemcpyHtoD_v2, local_cuMemcpyHtoD_v2_ptds},
	{"cuMemcpyDtoH", 3020, local_cuMemcpyDtoH_v2, local_cuMemcpyDtoH_v2_ptds},
	{"cuMemcpyDtoD", 3020, local_cuMemcpyDtoD_v2, local_cuMemcpyDtoD_v2_ptds},
	{"cuMemcpyHtoDAsync", 3020, local_cuMemcpyHtoDAsync_v2, local_cuMemcpyHtoDAsync_v2_ptsz},
	{"cuMemcpyDtoHAsync", 3020, local_cuMemcpyDtoHAsync_v2, local_cuMemcpyDtoHAsync_v2_ptsz},
	{"cuMemcpyDtoDAsync", 3020, local_cuMemcpyDtoDAsync_v2, local_cuMemcpyDtoDAsync_v2_ptsz},
	{"cuMemsetD8", 3020, local_cuMemsetD8_v2, NULL},
	{"cuMemsetD8Async", 3020, local_cuMemsetD8Async, NULL},
	{"cuMemAllocAsync", 11020, local_cuMemAllocAsync, local_cuMemAllocAsync_ptsz},
	{"cuMemAllocFromPoolAsync", 11020, local_cuMemAllocFromPoolAsync, local_cuMemAllocFromPoolAsync_ptsz},
	{"cuMemFreeAsync", 11020, local_cuMemFreeAsync, local_cuMemFreeAsync_ptsz},
	{"cuMemPoolCreate", 11020, local_cuMemPoolCreate, NULL},
	{"cuMemPoolDestroy", 11020, local_cuMemPoolDestroy, NULL},
	{"cuMemPoolTrimTo", 11020, local_cuMemPoolTrimTo, NULL},
	{"cuMemPoolGetAttribute", 11020, local_cuMemPoolGetAttribute, NULL},
	{"cuMemPoolSetAttribute", 11020, local_cuMemPoolSetAttribute, NULL},
	{"cuDeviceGetDefaultMemPool", 11020, local_cuDeviceGetDefaultMemPool, NULL},
	{"cuDeviceGetMemPool", 11020, local_cuDeviceGetMemPool, NULL},
	{"cuDeviceSetMemPool", 11020, local_cuDeviceSetMemPool, NULL},
	{"cuMemGetAllocationGranularity", 10020, local_cuMemGetAllocationGranularity, NULL},
	{"cuMemCreate", 10020, local_cuMemCreate, NULL},
	{"cuMemRelease", 10020, local_cuMemRelease, NULL},
	{"cuMemAddressReserve", 10020, local_cuMemAddressReserve, NULL},
	{"cuMemAddressFree", 10020, local_cuMemAddressFree, NULL},
	{"cuMemMap", 10020, local_cuMemMap, NULL},
	{"cuMemUnmap", 10020, local_cuMemUnmap, NULL},
	{"cuMemSetAccess", 10020, local_cuMemSetAccess, NULL},
	{"cuMemGetAccess", 10020, local_cuMemGetAccess, NULL},
	{"cuMemRetainAllocationHandle", 11000, local_cuMemRetainAllocationHandle, NULL},
	{"cuMemGetAllocationPropertiesFromHandle", 10020, local_cuMemGetAllocationPropertiesFromHandle, NULL},
	{"cuPointerGetAttribute", 4000, local_cuPointerGetAttribute, NULL},
	{"cuPointerGetAttributes", 7000, local_cuPointerGetAttributes, NULL},
	{"cuDeviceCanAccessPeer", 4000, local_cuDeviceCanAccessPeer, NULL},
	{"cuCtxEnablePeerAccess", 4000, local_cuCtxEnablePeerAccess, NULL},
	{"cuCtxDisablePeerAccess", 4000, local_cuCtxDisablePeerAccess, NULL},
	{"cuIpcGetMemHandle", 4010, local_cuIpcGetMemHandle, NULL},
	{"cuMemHostAlloc", 2020, local_cuMemHostAlloc, NULL},
	{"cuMemFreeHost", 2000, local_cuMemFreeHost, NULL},
	{"cuArrayCreate", 3020, local_cuArrayCreate_v2, NULL},
	{"cuArray3DCreate", 3020, local_cuArray3DCreate_v2, NULL},
	{"cuArrayDestroy", 2000, local_cuArrayDestroy, NULL},
	{"cuMipmappedArrayCreate", 5000, local_cuMipmappedArrayCreate, NULL},
	{"cuMipmappedArrayDestroy", 5000, local_cuMipmappedArrayDestroy, NULL},
	{"cuStreamCreate", 2000, local_cuStreamCreate, NULL},
	{"cuStreamDestroy", 4000, local_cuStreamDestroy_v2, NULL},
	{"cuStreamSynchronize", 2000, local_cuStreamSynchronize, local_cuStreamSynchronize_ptsz},
	{"cuStreamQuery", 2000, local_cuStreamQuery, local_cuStreamQuery_ptsz},
	{"cuStreamWaitValue32", 8000, local_cuStreamWaitValue32, local_cuStreamWaitValue32_ptsz},
	{"cuStreamWaitValue32", 11070, local_cuStreamWaitValue32_v2, local_cuStreamWaitValue32_v2_ptsz},
	{"cuStreamWriteValue32", 8000, local_cuStreamWriteValue32, local_cuStreamWriteValue32_ptsz},
	{"cuStreamWriteValue32", 11070, local_cuStreamWriteValue32_v2, local_cuStreamWriteValue32_v2_ptsz},
	{"cuModuleLoadData", 2000, local_cuModuleLoadData, NULL},
	{"cuModuleUnload", 2000, local_cuModuleUnload, NULL},
	{"cuModuleGetFunction", 2000, local_cuModuleGetFunction, NULL},
	{"cuLaunchKernel", 4000, local_cuLaunchKernel, local_cuLaunchKernel_ptsz},
	{"cuLaunchKernelEx", 11060, local_cuLaunchKernelEx, local_cuLaunchKernelEx_ptsz},
	{"cuLaunchCooperativeKernel", 9000, local_cuLaunchCooperativeKernel, local_cuLaunchCooperativeKernel_ptsz},
	{"cuEventCreate", 2000, local_cuEventCreate, NULL},
	{"cuEventDestroy", 4000, local_cuEventDestroy_v2, NULL},
	{"cuEventRecord", 2000, local_cuEventRecord, local_cuEventRecord_ptsz},
	{"cuEventRecordWithFlags", 11010, local_cuEventRecordWithFlags, local_cuEventRecordWithFlags_ptsz},
	{"cuEventQuery", 2000, local_cuEventQuery, NULL},
	{"cuEventSynchronize", 2000, local_cuEventSynchronize, NULL},
	{"cuEventElapsedTime", 2000, local_cuEventElapsedTime, NULL},
	{"cuEventElapsedTime", 12080, local_cuEventElapsedTime_v2, NULL},
	{"cuStreamBeginCapture", 10000, local_cuStreamBeginCapture, local_cuStreamBeginCapture_ptsz},
	{"cuStreamBeginCapture", 10010, local_cuStreamBeginCapture_v2, local_cuStreamBeginCapture_v2_ptsz},
	{"cuStreamEndCapture", 10000, local_cuStreamEndCapture, local_cuStreamEndCapture_ptsz},
	{"cuStreamIsCapturing", 10000, local_cuStreamIsCapturing, local_cuStreamIsCapturing_ptsz},
	{"cuStreamGetCaptureInfo", 10010, local_cuStreamGetCaptureInfo, local_cuStreamGetCaptureInfo_ptsz},
	{"cuStreamGetCaptureInfo", 11030, local_cuStreamGetCaptureInfo_v2, local_cuStreamGetCaptureInfo_v2_ptsz},
	{"cuStreamGetCaptureInfo", 12030, local_cuStreamGetCaptureInfo_v3, local_cuStreamGetCaptureInfo_v3_ptsz},
	{"cuThreadExchangeStreamCaptureMode", 10010, local_cuThreadExchangeStreamCaptureMode, NULL},
	{"cuGraphInstantiate", 11000, local_cuGraphInstantiate_v2, NULL},
	{"cuGraphInstantiate", 12000, local_cuGraphInstantiateWithFlags, NULL},
	{"cuGraphInstantiateWithFlags", 11040, local_cuGraphInstantiateWithFlags, NULL},
	{"cuGraphInstantiateWithParams", 12000, local_cuGraphInstantiateWithParams,
	 local_cuGraphInstantiateWithParams_ptsz},
	{"cuGraphGetNodes", 10000, local_cuGraphGetNodes, NULL},
	{"cuGraphGetEdges", 10000, local_cuGraphGetEdges, NULL},
	{"cuGraphNodeGetType", 10000, local_cuGraphNodeGetType, NULL},
	{"cuGraphMemAllocNodeGetParams", 11040, local_cuGraphMemAllocNodeGetParams, NULL},
	{"cuGraphMemFreeNodeGetParams", 11040, local_cuGraphMemFreeNodeGetParams, NULL},
	{"cuGraphLaunch", 10000, local_cuGraphLaunch, local_cuGraphLaunch_ptsz},
	{"cuGraphExecDestroy", 10000, local_cuGraphExecDestroy, NULL},
	{"cuGraphDestroy", 10000, local_cuGraphDestroy, NULL},
	{"cuGraphUpload", 11010, local_cuGraphUpload, local_cuGraphUpload_ptsz},
	{"cuDeviceGetGraphMemAttribute", 11040, local_cuDeviceGetGraphMemAttribute, NULL},
	{"cuDeviceSetGraphMemAttribute", 11040, local_cuDeviceSetGraphMemAttribute, NULL},
	{"cuDeviceGraphMemTrim", 11040, local_cuDeviceGraphMemTrim, NULL},
	{"cuCheckpointProcessLock", 12080, local_cuCheckpointProcessLock, NULL},
	{"cuCheckpointProcessCheckpoint", 12080, local_cuCheckpointProcessCheckpoint, NULL},
	{"cuCheckpointProcessRestore", 12080, local_cuCheckpointProcessRestore, NULL},
	{"cuCheckpointProcessUnlock", 12080, local_cuCheckpointProcessUnlock, NULL},
	{"cuCheckpointProcessGetState", 12080, local_cuCheckpointProcessGetState, NULL},
};

/* A driver may hand out addresses that are none of its exported symbols.
 * HAMI_SIM_INTERNAL_PROCS=1 makes cuGetProcAddress("cuMemAlloc") do so, for
 * the preload library's test that such a pointer is never passed on unhooked. */
static CUresult internal_mem_alloc(CUdeviceptr *dptr, size_t bytes)
{
	return local_cuMemAlloc_v2(dptr, bytes);
}

static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
			 CUdriverProcAddressQueryResult *status)
{
	const char *internal = getenv("HAMI_SIM_INTERNAL_PROCS");
	if (internal && strcmp(internal, "1") == 0 && symbol && pfn && strcmp(symbol, "cuMemAlloc") == 0 &&
	    version >= 3020) {
		*pfn = (void *)internal_mem_alloc;
		if (status)
			*status = CU_GET_PROC_ADDRESS_SUCCESS;
		return CUDA_SUCCESS;
	}
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	CUresult r = CUDA_ERROR_NOT_FOUND;

	if (!symbol || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].base, symbol) != 0)
			continue;
		if (procs[i].since > version) {
			if (st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
				st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
			continue;
		}
		int pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && procs[i].ptsz;
		*pfn = pt ? procs[i].ptsz : procs[i].fn;
		st = CU_GET_PROC_ADDRESS_SUCCESS;
		r = CUDA_SUCCESS;
	}
	if (status)
		*status = st;
	return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	return get_proc(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	return get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}
