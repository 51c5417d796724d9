/*
 * Internal interfaces of the preload library (libvgpu.so). Nothing here is
 * exported: the library is built with -fvisibility=hidden and only functions
 * marked HAMI_EXPORT (the hooks) leave it.
 */
#ifndef HAMI_INTERNAL_H
#define HAMI_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/stat.h>

#include "hami/cuda_types.h"
#include "hami/slice_file.h"

#define HAMI_EXPORT __attribute__((visibility("default")))
#define HAMI_MIB (1024ull * 1024ull)
/* CUDA devices a process sees; per-GPU limit variables and slice devices stop at HAMI_SLICE_MAX_DEVICES (16) */
#define HAMI_MAX_CUDA_DEVICES 64
/* The stack of a thread of ours that calls the driver or NVML: how deep the
 * real driver's calls run is not documented, so a normal thread's stack
 * (reserved address space; only what is used is touched). */
#define HAMI_DRIVER_THREAD_STACK (8u << 20)

/* log.c */
enum { HAMI_LOG_ERROR = 0, HAMI_LOG_WARN, HAMI_LOG_INFO, HAMI_LOG_DEBUG, HAMI_LOG_TRACE };
void hami_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int hami_log_enabled(int level);
const char *hami_human(uint64_t bytes, char buf[32]);
uint64_t hami_now_ns(void);      /* CLOCK_REALTIME, for times shown to people */
uint64_t hami_monotonic_ns(void);
/* Whether a line rate-limited through *last may be said now: at most one per
 * interval_ns, whichever thread asks (set when it says yes). */
int hami_report_due(uint64_t *last, uint64_t interval_ns);

#include "size.h"

/* Checked size arithmetic: 0, or -1 when the result does not fit in 64 bits.
 * The hooks treat an overflow as a refusal, never as a small number. */
static inline int hami_add(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

static inline int hami_mul(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

static inline int hami_round_up(uint64_t v, uint64_t to, uint64_t *out)
{
	uint64_t rest = v % to;
	if (!rest) {
		*out = v;
		return 0;
	}
	return hami_add(v, to - rest, out);
}

/* config.c: the process's settings, parsed once from the environment. */
struct hami_config {
	int error;                 /* nonzero: a setting is malformed, fail closed */
	int has_memory_default;
	uint64_t memory_default;   /* CUDA_DEVICE_MEMORY_LIMIT */
	uint8_t has_memory_ordinal[HAMI_SLICE_MAX_DEVICES];
	uint64_t memory_ordinal[HAMI_SLICE_MAX_DEVICES]; /* CUDA_DEVICE_MEMORY_LIMIT_<n> */
	int has_sm_default;
	uint32_t sm_default;       /* CUDA_DEVICE_SM_LIMIT, percent */
	uint8_t has_sm_ordinal[HAMI_SLICE_MAX_DEVICES];
	uint32_t sm_ordinal[HAMI_SLICE_MAX_DEVICES]; /* CUDA_DEVICE_SM_LIMIT_<n> */
	uint32_t sm_mode;          /* HAMI_SM_MODE: HAMI_MODE_HARD or HAMI_MODE_ELASTIC */
	int has_decoders_default;
	uint32_t decoders_default; /* HAMI_MAX_DECODERS: concurrent NVDEC decoders per GPU */
	uint8_t has_decoders_ordinal[HAMI_SLICE_MAX_DEVICES];
	uint32_t decoders_ordinal[HAMI_SLICE_MAX_DEVICES]; /* HAMI_MAX_DECODERS_<n> */
	int has_context_overhead;
	uint64_t context_overhead; /* HAMI_CONTEXT_OVERHEAD */
	int has_process_limit;
	uint64_t process_limit;    /* HAMI_PROCESS_MEMORY_LIMIT: this process's own cap per GPU, inside the slice's */
	uint32_t room_wait_s;      /* HAMI_ROOM_WAIT: seconds to wait for GPU room (room.c); 0: never */
	const char *broker_socket; /* HAMI_BROKER_SOCKET, else <hub slice root>/broker.sock */
	int fast_park;             /* HAMI_FAST_PARK: allocations backed so that the process parks itself */
	uint64_t fast_park_keep;   /* HAMI_FAST_PARK_KEEP: allocations it cannot move that a fast park leaves on the GPU */
	int fast_park_copiers;     /* HAMI_FAST_PARK_COPIERS: CPU threads that help copy, 0-4; -1: by the CPU count */
	const char *slice_path;    /* HAMI_SLICE or CUDA_DEVICE_MEMORY_SHARED_CACHE; NULL: private */
	char slice_name[HAMI_SLICE_NAME_LEN];
	char kernel_id[HAMI_SLICE_KERNEL_ID_LEN];
};
const struct hami_config *hami_config(void);
int hami_config_memory_limit(int ordinal, uint64_t *limit);
int hami_config_sm_share(int ordinal, uint32_t *percent);
int hami_config_limit(int ordinal, struct hami_device_limit *out);
int hami_config_ordinal_of(const char *uuid, int nvml_index);

/* driver.c: the real libcuda.so.1 and libnvidia-ml.so.1 */
void *hami_real_dlsym(void *handle, const char *name);
void *hami_cuda_sym(const char *name);
void *hami_nvml_sym(const char *name);
void *hami_cuvid_sym(const char *name);
void *hami_cached_sym(void **cache, const char *name);
/* The real entry point *name* as a *type*, looked up once per call site; NULL
 * when the library has no such symbol (callers handle it). */
#define HAMI_REAL(type, name) ({ static void *cache_; (type)hami_cached_sym(&cache_, name); })
nvmlDevice_t hami_nvml_device(int sdev);
int hami_nvml_memory(int sdev, nvmlMemory_t *out); /* the physical GPU's figures; -1: NVML cannot say */

/* hooks.c: name <-> hook tables for dlsym and cuGetProcAddress */
struct hami_hook {
	const char *name;
	void *hook;
};
extern const struct hami_hook hami_gate_hooks[]; /* park_gate_hooks.c: gate only, charge nothing */
extern const size_t hami_gate_hook_count;
extern const struct hami_hook hami_driver_memory_hooks[]; /* driver_memory_hooks.c: wait for room only */
extern const size_t hami_driver_memory_hook_count;
extern const struct hami_hook hami_vm_hooks[]; /* vm_hooks.c: questions about backed memory */
extern const size_t hami_vm_hook_count;
void *hami_gate_thunk(const char *name, void *real); /* park_gate_thunks.c */
int hami_gate_thunks_available(void); /* 1: every driver entry point handed out passes the gate */
void *hami_hook_by_name(const char *name);
void *hami_hook_for_real(void *real_fn);
int hami_hooked_base(const char *symbol);

/* setup.c: one-time set-up after the real cuInit */
int hami_setup(void); /* CUDA_SUCCESS, an error to return, or -1: driver not initialised yet */
int hami_ordinal_device(int ordinal);   /* slice device index, -1 if none */
int hami_current_device(int *ordinal); /* slice device index of the current context, -1 if none */
int hami_device_ordinal(int sdev);     /* the CUDA ordinal of slice device sdev, -1 if none */
int hami_ordinal_count(void);
void hami_gpu_name(int sdev, char *out, size_t cap); /* "GPU 0", else "GPU <uuid>" */

/* slice.c: the mapped slice file */
struct hami_device_info {
	char uuid[HAMI_SLICE_UUID_LEN];
	uint64_t memory_total;
	uint32_t sm_count;
};
int hami_slice_attach(const struct hami_device_info *dev, int count);
int hami_slice_open_existing(void);
struct hami_slice_file *hami_slice(void);
const char *hami_slice_name(void);
int hami_slice_device(const char *uuid, const struct hami_device_info *info);
int hami_slice_limit(int sdev, struct hami_device_limit *out);
int hami_slot(void);
void hami_slice_sweep(void);
int hami_slot_byte_locked(int slot, size_t field); /* 1: some open file description holds it */
uint64_t hami_slice_live_used(int sdev);

/* trust.c: whether a slice folder or file may be used (docs/slice-file.md, "Who owns what") */
const char *hami_file_kind(mode_t mode);
int hami_check_folder(const char *file_path, struct stat *folder); /* 0, -ENOENT, or -1 (reported) */
/* owner_only: this user or root must own it, wherever it lies (limits files) */
int hami_check_file(const char *path, const struct stat *st, const struct stat *folder, int owner_only);
int hami_stat_missing(const char *path, const char *what); /* -1, reported: a dangling symbolic link */

/* limits_file.c: the hub-owned companion limits file, when there is one */
int hami_limits_file_map(const char *slice_path);
const struct hami_slice_limits *hami_limits_block(const struct hami_slice_file *f);
int hami_limits_file_in_force(void);
int hami_limits_set_by_admin(void); /* 1: an administrator's limits are in force (hub) */

/* charge.c: reserve-then-allocate against the slice */
int hami_charge(int sdev, uint64_t bytes, const char *what);
void hami_charge_force(int sdev, uint64_t bytes);
void hami_credit(int sdev, uint64_t bytes);
void hami_credit_device(int sdev, uint64_t bytes);
uint64_t hami_device_used(int sdev);
uint64_t hami_device_limit_bytes(int sdev);
/* The least and the most this process's slot has held on sdev since the watch began, up to
 * this call (true_up.c) */
void hami_slot_watch_start(int sdev);
void hami_slot_watched(int sdev, uint64_t *low, uint64_t *high);

/* process_cap.c: this process's own cap inside the slice (HAMI_PROCESS_MEMORY_LIMIT) */
uint64_t hami_process_limit(void);
uint64_t hami_process_held(int sdev);
int hami_process_take(int sdev, uint64_t bytes, uint64_t *now);
void hami_process_force(int sdev, uint64_t bytes);
void hami_process_give(int sdev, uint64_t bytes);
void hami_process_after_fork(void);

/* gpu_busy.c: a call the driver refused as "busy or unavailable" while another
 * process's GPU state moves to or from host memory (a park, a resume). */
struct hami_busy {
	uint64_t since; /* monotonic ns of the first refusal; 0: none yet */
	int told;
};
/* 1: call the driver again (it waited a moment); 0: pass the error on (said why
 * where it matters). ordinal -1: the current context's device. */
int hami_busy_wait(struct hami_busy *b, int sdev, int ordinal, const char *what);

/*
 * room.c: when the slice had room for an allocation but the GPU had not (the
 * driver said out of memory, or the room ledger says what is free is others'),
 * the memory broker is asked to make room (broker_client.c) and the driver call
 * is tried again; docs/preload.md. A struct hami_room lives for one wait, on
 * the waiting thread's stack (or across a parked process's resume attempts).
 * After the broker's OK the connection stays open until the wait ends: the
 * room the broker made is this process's while it is (its grant, by ticket).
 */
struct hami_room {
	uint64_t since_ns;  /* CLOCK_REALTIME: when the wait began (kept across re-asks); 0: none */
	uint64_t deadline;  /* monotonic; 0: set at the next ask */
	int entry;          /* this wait's entry in the process's table (the slot shows the oldest), -1 */
	int fd;             /* the broker's connection while its grant is held, -1 */
	uint64_t ticket;    /* the grant's ticket (the broker's OK), 0 */
	int connected;      /* a broker took a connection during this wait */
	int answered;       /* ... and answered a line */
	int told_start, told_end;
	int told_no;        /* "can make no room yet" was said */
	int interrupted;    /* Jupyter's interrupt (SIGINT) ended it */
	char why[160];      /* the broker's last NO */
	char turn[64];      /* why the room ledger sent this take to the broker, "" */
	struct hami_busy busy;
};
#define HAMI_ROOM_INIT { .entry = -1, .fd = -1 }
/* 1: try the driver again; 0: give up (said why, unless go_on() stopped it). go_on may be NULL. */
int hami_room_wait(struct hami_room *w, int sdev, uint64_t bytes, const char *what, int (*go_on)(void));
/* After a driver call that takes *bytes* on sdev returned rc: 1 when it is to be
 * made again (room was made, a busy GPU is free again), 0 when rc stands. */
int hami_room_again(struct hami_room *w, CUresult rc, int sdev, uint64_t bytes, const char *what);
void hami_room_end(struct hami_room *w);
void hami_room_after_fork(void);
/* Sleep ns (not past the monotonic deadline; 0: none) unless Jupyter's
 * interrupt comes: -1 then. Other signals wait for the sleep's end. */
int hami_pause_ns(uint64_t ns, uint64_t deadline);
/* The signal mask a wait sleeps under: all blocked but SIGINT (unless the program blocks it). */
void hami_wait_mask(sigset_t *mask);

/*
 * Make CALL, a driver call that takes *bytes* of device memory on slice device
 * sdev (-1 or 0 bytes: not governed), in its turn (the room ledger), and again
 * for as long as the memory broker makes room or a busy GPU frees up; rc gets
 * its result. One statement, as a loop cannot be a function over any call.
 */
#define HAMI_TAKE(rc, sdev, bytes, what, call)                                                         \
	do {                                                                                            \
		struct hami_room take_room_ = HAMI_ROOM_INIT;                                           \
		do                                                                                      \
			if (((rc) = hami_room_turn(&take_room_, (sdev), (bytes))) == CUDA_SUCCESS)       \
				(rc) = (call);                                                          \
		while ((sdev) >= 0 && (bytes) && hami_room_again(&take_room_, (rc), (sdev), (bytes), (what))); \
		hami_room_end(&take_room_);                                                             \
	} while (0)

/* room_ledger.c: the node agent's room ledger (slice_file.h). CUDA_SUCCESS when
 * this process may take *bytes* on sdev now; CUDA_ERROR_OUT_OF_MEMORY when it
 * must ask the broker first (w->turn says why). */
CUresult hami_room_turn(struct hami_room *w, int sdev, uint64_t bytes);
CUresult hami_room_turn_now(struct hami_room *w, int sdev, uint64_t bytes); /* a resume: the ledger looked for at once */
int hami_ledger_gpu(const char *uuid, struct hami_ledger_gpu *out); /* 0, or -1: none believed */
int hami_ledger_gpu_now(const char *uuid, struct hami_ledger_gpu *out); /* the same, a new agent looked for at once */
uint64_t hami_ledger_granted(const struct hami_ledger_gpu *g, uint64_t ticket); /* its bytes, 0 */
/* NULL when a take of *bytes* with *free* on the GPU keeps the ledger's rule; else why not. */
const char *hami_ledger_refusal(const struct hami_ledger_gpu *g, uint64_t ticket, int within, uint64_t free,
				uint64_t bytes);
int hami_within_guarantee(int sdev);

/* driver_room.c: a call refused for memory the driver takes by itself (module
 * code, local memory, pools, a first context), which no hook reserved: ask the
 * broker for room anyway, within what the slice's limit leaves, growing the ask
 * each time the room made was not enough. 1: call the driver again; 0: pass
 * the error on (said why). sdev -1: the current context's device; first_ask 0:
 * the default guess. hami_driver_room_end() closes the wait either way. */
struct hami_driver_room {
	struct hami_room room;
	int sdev;
	uint64_t ask; /* the last ask; 0 before the first */
};
#define HAMI_DRIVER_ROOM_INIT { .room = HAMI_ROOM_INIT, .sdev = -1 }
int hami_driver_room_wait(struct hami_driver_room *d, int sdev, uint64_t first_ask, const char *what);
/* After such a call returned rc: 1 to make it again (room, or a busy GPU free again). */
int hami_driver_room_again(struct hami_driver_room *d, CUresult rc, int sdev, uint64_t first_ask, const char *what);
void hami_driver_room_end(struct hami_driver_room *d);
extern pthread_mutex_t hami_room_lock;

/* broker_client.c: one request to the broker (protocol in that file) */
enum hami_broker_answer {
	HAMI_BROKER_OK,      /* room was made (or was there): try again */
	HAMI_BROKER_NO,      /* nothing can be parked now: *why* says why */
	HAMI_BROKER_LOST,    /* the connection closed before a final answer (a restart?) */
	HAMI_BROKER_LATE,    /* the deadline came first */
	HAMI_BROKER_STOPPED, /* go_on() said to stop */
	HAMI_BROKER_INTERRUPTED /* Jupyter's interrupt (SIGINT) came while waiting */
};
int hami_broker_connect(const char *path, uint64_t timeout_ns); /* a socket, or -1: no broker there */
/* *ticket*: the grant an OK names (0 when it names none) */
int hami_broker_request(int fd, const char *uuid, uint64_t bytes, uint64_t since_ns, uint64_t deadline,
			int (*go_on)(void), int *answered, uint64_t *ticket, char *why, size_t cap);

/* sm_share.c: the SM-share gate (launch path) and controller (housekeeper) */
extern int hami_sm_watch;
void hami_sm_before_launch(CUstream stream, int per_thread);
void hami_sm_after_launch(CUresult rc);
void hami_sm_gate_decode(void);
void hami_sm_tick(void);
void hami_sm_refresh(void);

/* sm_work.c: the work a busy second buys, from the GPU's power (x1000) */
uint32_t hami_sm_work_update(int sdev, nvmlDevice_t dev, uint32_t busy_pct);
uint32_t hami_sm_work_last(int sdev);
int hami_sm_share_of_time(void);

/* gpu_schedule.c: the slices' windows side by side on each GPU */
void hami_schedule_tick(int sdev, uint32_t open_ppm, int launched);
void hami_schedule_leave(int sdev);
uint64_t hami_schedule_offset_ppm(int sdev);
int hami_schedule_neighbours(int sdev);
int hami_schedule_busy_neighbours(int sdev);
void hami_schedule_after_fork(void);

/* context_hooks.c */
void hami_contexts_after_fork(void);

/* capture.c: stream capture, as the hooks respect it */
int hami_stream_capturing(CUstream stream, int per_thread);
int hami_capture_relaxed_begin(void); /* returns the mode hami_capture_relaxed_end restores */
void hami_capture_relaxed_end(int previous);

/* graph_need.c: need[ordinal] += what one run of a graph can map on each device (0, or -1: unreadable) */
int hami_graph_need(CUgraph g, uint64_t need[HAMI_MAX_CUDA_DEVICES]);

/* graph_memory.c: a graph's memory, reserved before an upload or launch maps it,
 * charged as the driver really maps it after */
struct hami_exec_need;
struct hami_graph_hold {
	struct hami_exec_need *need; /* set while the call may map it */
	uint64_t held[HAMI_MAX_CUDA_DEVICES];
};
void hami_graph_memory_seen(void);
CUresult hami_graph_hold(CUgraphExec exec, struct hami_graph_hold *h); /* CUDA_ERROR_OUT_OF_MEMORY: no room */
void hami_graph_release(struct hami_graph_hold *h, CUresult rc);

/* true_up.c: the charge follows what NVML says the process really holds */
int hami_nvml_process_used(int sdev, uint64_t *used);
void hami_true_up_tick(void);
void hami_true_up_after_fork(void);

/*
 * park.c: parking (docs/parking.md). Every hook that calls the driver brackets
 * the call with hami_call_begin/hami_call_end: a parked process's call waits
 * for its GPU state to come back, and the housekeeper sees a thread that is
 * inside the driver (blocked there by the parker's lock) and asks for it.
 */
struct hami_call_mark {
	uint32_t in_call; /* hooks of this thread now inside a driver call (they nest) */
	uint32_t used;    /* the mark belongs to a live thread */
	uint64_t calls;   /* driver calls this thread made: activity, for the parking policy */
};
extern struct hami_slot *hami_parkable_slot; /* this process's slot once claimed */
extern __thread struct hami_call_mark *hami_thread_mark;
void hami_park_wait(struct hami_slot *s);
struct hami_call_mark *hami_call_mark_new(void);
void hami_park_tick(void);
void hami_park_start(void); /* the parking thread, once the process has a slot */
void hami_park_after_fork(void);
int hami_threads_in_driver(uint64_t *calls); /* 1: a thread is inside a hooked call; *calls: calls so far */

/* fast_park.c: a park the process does itself (parking thread only). */
const char *hami_fast_park_refusal(void); /* why this process cannot park itself now, or NULL */
int hami_fast_park(struct hami_slot *s, CUresult *error); /* HAMI_FAST_DONE, _REFUSED, _FAILED (*error), _WITHDRAWN */
CUresult hami_fast_resume(void);
uint64_t hami_fast_parked_bytes(int sdev);  /* GPU memory the parked blocks of sdev need back */
int hami_fast_free_memory(int sdev, uint64_t *free_bytes); /* the driver's free memory on sdev: 0, or -1 */

static inline struct hami_call_mark *hami_call_begin(void)
{
	struct hami_slot *s = __atomic_load_n(&hami_parkable_slot, __ATOMIC_ACQUIRE);
	if (s && __atomic_load_n(&s->park_state, __ATOMIC_ACQUIRE) != HAMI_PARK_RUNNING)
		hami_park_wait(s);
	struct hami_call_mark *m = hami_thread_mark ? hami_thread_mark : hami_call_mark_new();
	if (m) { /* only this thread writes its mark: plain stores, the housekeeper only reads */
		__atomic_store_n(&m->in_call, __atomic_load_n(&m->in_call, __ATOMIC_RELAXED) + 1,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&m->calls, __atomic_load_n(&m->calls, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	}
	return m;
}

static inline void hami_call_end(struct hami_call_mark *m)
{
	if (m)
		__atomic_store_n(&m->in_call, __atomic_load_n(&m->in_call, __ATOMIC_RELAXED) - 1,
				 __ATOMIC_RELAXED);
}

static inline void hami_call_cleanup(struct hami_call_mark **m)
{
	hami_call_end(*m);
}

/* The first line of a hook that calls the driver: the parking gate, then this
 * thread counts as inside the driver until the hook returns, whichever return. */
#define HAMI_IN_DRIVER() \
	struct hami_call_mark *hami_in_driver_ __attribute__((cleanup(hami_call_cleanup))) = hami_call_begin()

/*
 * vm_backing.c: allocations backed by a reserved address range with physical
 * memory mapped in (HAMI_FAST_PARK=1), so that the process can park itself
 * (fast_park.c). A block is one allocation the program got; while parked its
 * physical memory is gone (handle 0) and host holds its bytes.
 */
struct hami_vm_block {
	CUdeviceptr base;  /* what the program got: the reservation's start */
	uint64_t size;     /* as asked */
	uint64_t span;     /* reserved and mapped: size rounded up to the granularity */
	CUmemGenericAllocationHandle handle; /* 0 while parked */
	CUcontext ctx;     /* current when it was made */
	int ordinal;       /* CUDA device */
	int sdev;          /* slice device, -1 if none */
	uint64_t extra;    /* span - size, charged by vm_backing.c beside the hook's charge (0 if none) */
	void *host;        /* its bytes while parked (fast_park.c) */
	uint8_t *zero;     /* ... and which of their runs were all zeros */
};
extern pthread_mutex_t hami_vm_lock;
int hami_vm_enabled(void);
void hami_vm_disable(void); /* later allocations the old way */
CUresult hami_vm_alloc(CUdeviceptr *dptr, size_t bytes, CUresult (*driver)(CUdeviceptr *, size_t));
CUresult hami_vm_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem,
			     CUresult (*driver)(CUdeviceptr *, size_t *, size_t, size_t, unsigned));
CUresult hami_vm_free(CUdeviceptr p, CUresult (*driver)(CUdeviceptr));
CUresult hami_vm_free_async(CUdeviceptr p, CUstream stream, int per_thread,
			    CUresult (*driver)(CUdeviceptr, CUstream));
int hami_vm_find(CUdeviceptr p, struct hami_vm_block *out); /* the block holding p: 0, or -1 */
size_t hami_vm_snapshot(struct hami_vm_block **out);        /* a malloc'd copy of the table */
void hami_vm_update(const struct hami_vm_block *b);         /* write a block back (same base) */
CUresult hami_vm_map(struct hami_vm_block *b);   /* new physical memory at b->base, access set */
CUresult hami_vm_unmap(struct hami_vm_block *b); /* b's physical memory unmapped and released */
void hami_vm_peer_added(int ordinal, int peer);  /* peer may reach ordinal's memory */
void hami_vm_after_fork(void);

/* records.c: what this process was charged for, by handle */
enum hami_kind {
	HAMI_KIND_MEMORY = 1, /* cuMemAlloc, pitch, managed: credited by cuMemFree */
	HAMI_KIND_POOLED,     /* from a stream-ordered pool: the pool is charged */
	HAMI_KIND_ARRAY,
	HAMI_KIND_MIPMAP,
	HAMI_KIND_HANDLE,     /* cuMemCreate */
	HAMI_KIND_CONTEXT,    /* cuCtxCreate */
	HAMI_KIND_POOL,       /* a memory pool: bytes = reserved bytes charged */
	HAMI_KIND_DECODER,    /* an NVDEC decoder: pool = its shape (cuvid_hooks.c) */
	HAMI_KIND_GRAPH_POOL, /* a device's graph memory pool: key = ordinal (graph_memory.c) */
	HAMI_KIND_GRAPH_EXEC  /* a graph executable's need: pool = its struct hami_exec_need */
};
struct hami_record {
	uint64_t key;
	uint64_t bytes;
	uint64_t pool;  /* HAMI_KIND_POOLED: the pool it came from */
	int32_t sdev;
	uint32_t kind;
};
int hami_record_put(const struct hami_record *r);
int hami_record_take(uint32_t kind, uint64_t key, struct hami_record *out);
int hami_record_get(uint32_t kind, uint64_t key, struct hami_record *out);
/* Bytes charged by the records of the kinds in mask (1u << kind), per slice device. */
void hami_record_sums(uint32_t mask, uint64_t out[HAMI_SLICE_MAX_DEVICES]);
void hami_settle_free(int known, const struct hami_record *r, CUresult rc);
void hami_records_reset(void);

/*
 * fork.c: every mutex of the library, known to its fork handlers. The first
 * three are held across driver calls: a child makes them anew; the others
 * never are: the forking thread takes them (outermost first). A new mutex
 * joins this list and one of fork.c's two tables.
 */
extern pthread_mutex_t hami_setup_lock;   /* setup.c: the one-time set-up */
extern pthread_mutex_t hami_context_lock; /* context_hooks.c: primary context retains */
extern pthread_mutex_t hami_pool_lock;    /* memory_hooks.c: pool charges */
extern pthread_mutex_t hami_graph_lock;   /* graph_memory.c: graph pool charges */
extern pthread_mutex_t hami_open_lock;    /* slice.c: read-only attach for NVML */
extern pthread_mutex_t hami_ledger_open_lock; /* room_ledger.c: mapping the room ledger */
extern pthread_mutex_t hami_thunks_lock;  /* park_gate_thunks.c: the thunk table */
extern pthread_mutex_t hami_claim_lock;   /* slice.c: GPU entry claims */
extern pthread_mutex_t hami_slot_lock;    /* slice.c: slot locks, sweeps */
extern pthread_mutex_t hami_records_mutex; /* records.c: the handle table */
/* vm_backing.c's hami_vm_lock: the table of backed allocations (declared with its interface) */
/* room.c's hami_room_lock: the table of waits for GPU room (declared with room.c's interface) */
void hami_slice_after_fork(void);

#endif
