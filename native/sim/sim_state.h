/*
 * Shared bookkeeping of the simulated GPU: one mmap'd file that every process
 * using the same HAMI_SIM_STATE path sees, like processes share a real GPU.
 *
 * Rules:
 *  - Fixed-size structures, nothing moves. Shared fields are C11 atomics;
 *    there is no process-shared mutex anywhere.
 *  - A process entry is owned by whoever holds an OFD write lock on its first
 *    byte. The kernel drops the lock when the owner dies, so an entry whose
 *    lock can be taken belongs to a dead process: the taker returns the
 *    entry's memory to the devices (exactly once: only under that lock).
 *  - device.used is charged with compare-and-swap against device.total, then
 *    added to the entry; peak_used is the atomic maximum of used. It is the
 *    independent witness tests read: no slice cap can be exceeded on the GPU
 *    without peak_used showing it.
 *  - The file is created complete (temp file + link), so nobody ever maps a
 *    half-initialised one. Its device configuration is decided by the first
 *    creator; later processes' HAMI_SIM_DEVICES etc. do not change it.
 *
 * libcuda.so.1, libnvidia-ml.so.1, libnvcuvid.so.1 and hami-simctl each
 * compile their own copy of sim_state.c; the libraries of one process share
 * its entry (the later ones find the first's by pid, start time and pid
 * namespace).
 */
#ifndef HAMI_SIM_STATE_H
#define HAMI_SIM_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_MAGIC "HAMISIM1" /* 8 bytes, no terminator */
#define SIM_VERSION 6u /* 2: NVDEC decoder counts and frame counters; 3: checkpoints;
                         * 4: graph memory, driver-internal bytes, graphics processes;
                         * 5: a checkpoint needs free device memory;
                         * 6: the count of checkpoint locks a process met */
#define SIM_MAX_DEVICES 16
#define SIM_MAX_PROCS 128
#define SIM_UUID_LEN 48 /* "GPU-" + 36 + NUL fits */
#define SIM_NAME_LEN 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */

/* Utilization history: a ring of time slots, each holding (slot number << 32 |
 * busy ns in that slot). Queries sum the last SIM_UTIL_WINDOW complete slots
 * (1 s). Launches are recorded when queued, so the ring must also reach into
 * the future: work queued more than ~11 s ahead is not counted. */
#define SIM_UTIL_SLOT_NS 50000000ull /* 50 ms */
#define SIM_UTIL_SLOTS 256
#define SIM_UTIL_WINDOW 20

/* NVML's sample period: the real driver (580, H200) makes one per-process
 * sample every ~200 ms. Periods are aligned on CLOCK_MONOTONIC, so every
 * process sees the same period boundaries. A whole number of slots. */
#define SIM_SAMPLE_NS 200000000ull

/* Defaults (environment variables override them when the file is created). */
#define SIM_DEFAULT_DEVICES 2
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_DEFAULT_NAME "HAMi Simulated GPU"
#define SIM_DEFAULT_SM_COUNT 132
#define SIM_DEFAULT_CONTEXT_BYTES (64ull << 20)
#define SIM_DEFAULT_NS_PER_WAVE 10000
#define SIM_DEFAULT_MODULE_BYTES (2ull << 20)
/* An H200 (driver 580) failed a checkpoint with out of memory at 4 MiB free, and
 * made it at 16 MiB: the checkpoint needs some device memory of its own. */
#define SIM_DEFAULT_CKPT_FREE (8ull << 20)

#define SIM_PROC_FREE 0u
#define SIM_PROC_LIVE 1u

/* A process entry's checkpoint state (sim_proc.ckpt). The first four are
 * CUprocessState's values; the others mark a checkpoint call at work on the
 * entry (cuCheckpointProcessGetState reports the state it started from). */
enum {
	SIM_CKPT_RUNNING = 0,
	SIM_CKPT_LOCKED = 1,
	SIM_CKPT_CHECKPOINTED = 2,
	SIM_CKPT_FAILED = 3,
	SIM_CKPT_CHECKPOINTING = 4, /* LOCKED -> CHECKPOINTED */
	SIM_CKPT_RESTORING = 5,     /* CHECKPOINTED -> LOCKED */
	SIM_CKPT_LOCKING = 6        /* RUNNING -> LOCKED: waiting for calls in flight */
};

struct sim_header {
	char magic[8];
	uint32_t version;
	uint32_t ndev;
	uint64_t file_size;
	uint32_t max_devices; /* SIM_MAX_DEVICES */
	uint32_t max_procs;   /* SIM_MAX_PROCS */
	uint64_t context_bytes;
	uint64_t ns_per_wave;
	uint64_t created_unix_ns;
	uint64_t module_bytes; /* device memory a module's code takes once loaded */
	uint64_t ckpt_min_free; /* a checkpoint fails (out of memory) with less free on a device it frees */
	uint8_t reserved[48];
};

struct sim_device {
	char uuid[SIM_UUID_LEN];
	char name[SIM_NAME_LEN];
	uint64_t total;
	uint32_t sm_count;
	_Atomic uint32_t decoders;      /* live simulated NVDEC decoders, all processes */
	_Atomic uint64_t used;          /* bytes taken by all live processes */
	_Atomic uint64_t peak_used;     /* maximum used ever reached */
	_Atomic uint64_t busy_until_ns; /* CLOCK_MONOTONIC end of queued work */
	_Atomic uint64_t busy_total_ns;
	_Atomic uint64_t frames_decoded; /* successful cuvidDecodePicture calls, ever */
	_Atomic uint64_t frames_mapped;  /* successful cuvidMapVideoFrame(64) calls, ever */
	_Atomic uint64_t util[SIM_UTIL_SLOTS];
};

struct sim_proc {
	_Atomic uint32_t state; /* SIM_PROC_*; the lock byte is this field's first */
	_Atomic int32_t pid;
	_Atomic uint64_t start_ticks; /* /proc/self/stat starttime */
	_Atomic uint64_t pidns;       /* inode of /proc/self/ns/pid */
	_Atomic uint64_t used[SIM_MAX_DEVICES];
	_Atomic uint32_t contexts[SIM_MAX_DEVICES];
	_Atomic uint32_t decoders[SIM_MAX_DEVICES]; /* its live decoders (returned with its memory) */
	/* Checkpoints. The entry's second byte is its checkpoint lock: a
	 * checkpoint call holds it shared while it works on the entry, a reclaim
	 * exclusively, so that neither meets the other's half-done work. */
	_Atomic uint32_t cuda;     /* libcuda was initialised in it: checkpoint calls may name it */
	_Atomic uint32_t ckpt;     /* SIM_CKPT_*; a futex its blocked calls sleep on */
	_Atomic uint32_t inflight; /* its calls inside gated driver entry points; a futex */
	_Atomic uint64_t parked[SIM_MAX_DEVICES]; /* device bytes a checkpoint moved to host memory */
	/* Parts of its footprint (counted in used, or in parked while
	 * checkpointed) that no allocation call returned, shown by hami-simctl:
	 * its graph memory pool's reserved bytes, and what its driver holds by
	 * itself (hamiSimDriverInternal). */
	_Atomic uint64_t graph[SIM_MAX_DEVICES];
	_Atomic uint64_t internal[SIM_MAX_DEVICES];
	_Atomic uint32_t graphics; /* NVML lists it as a graphics process, not a compute one */
	_Atomic uint32_t locks;    /* checkpoint locks that took it, ever: a witness of which way it was parked */
	_Atomic uint64_t busy_ns[SIM_MAX_DEVICES];
	_Atomic uint64_t util[SIM_MAX_DEVICES][SIM_UTIL_SLOTS];
};

struct sim_state {
	struct sim_header hdr;
	struct sim_device dev[SIM_MAX_DEVICES];
	struct sim_proc proc[SIM_MAX_PROCS];
};

struct sim_config {
	unsigned ndev;
	uint64_t memory;
	unsigned sm_count;
	uint64_t context_bytes;
	uint64_t ns_per_wave;
	uint64_t module_bytes;
	uint64_t ckpt_min_free;
	uint64_t launch_ns; /* this process's, never stored in the state */
	char name[SIM_NAME_LEN];
	char uuid[SIM_MAX_DEVICES][SIM_UUID_LEN];
};

/* Both sim libraries carry a copy of sim_state.c: keep its functions out of
 * the dynamic symbol tables, or one library's calls could bind to the other's
 * copy (and its separate process-local state). */
#define SIM_HIDDEN __attribute__((visibility("hidden")))

/* Results of the sim_* calls below. */
enum {
	SIM_OK = 0,
	SIM_ECONFIG = -1, /* malformed environment (already printed) */
	SIM_EIO = -2,     /* state file unusable (already printed) */
	SIM_ENOMEM = -3,  /* device full */
	SIM_EFULL = -4,   /* no free process entry (already printed) */
	SIM_ENOENT = -5,  /* no such CUDA process */
	SIM_ESTATE = -6,  /* the process is not in the state the call needs */
	SIM_ETIMEDOUT = -7,
	SIM_EPERM = -8    /* the caller may not act on that process */
};

SIM_HIDDEN int sim_parse_size(const char *s, uint64_t *out);
SIM_HIDDEN int sim_config_from_env(struct sim_config *cfg);
SIM_HIDDEN int sim_default_path(char *buf, size_t len);

/* Map the state at PATH (NULL: HAMI_SIM_STATE or the default), creating it
 * from the environment if absent. Idempotent once it succeeded. */
SIM_HIDDEN int sim_open(const char *path);
/* Unmap and forget (hami-simctl reset). */
SIM_HIDDEN void sim_close(void);
SIM_HIDDEN struct sim_state *sim_st(void);
SIM_HIDDEN const char *sim_path(void);

/* Call before registering pthread_atfork handlers that hold locks taken
 * around sim_* calls, so fork takes the locks in the right order. */
SIM_HIDDEN void sim_atfork_init(void);

/* This process's entry, claimed on first use; index or SIM_EFULL/SIM_EIO. */
SIM_HIDDEN int sim_self(void);
SIM_HIDDEN int sim_charge(unsigned dev, uint64_t bytes); /* SIM_OK or SIM_ENOMEM/... */
SIM_HIDDEN void sim_uncharge(unsigned dev, uint64_t bytes);
SIM_HIDDEN void sim_ctx_count(unsigned dev, int delta);
/* One more (DELTA 1) or one fewer (-1) live decoder of this process on DEV:
 * the device's count and our entry's, which a dead process's reclaim returns. */
SIM_HIDDEN void sim_decoder_count(unsigned dev, int delta);
/* Record what our entry's graph memory pool reserves on DEV, and what its
 * driver holds by itself there (both already charged with sim_charge: these
 * only say which part of the footprint they are). */
SIM_HIDDEN void sim_note_graph(unsigned dev, uint64_t bytes);
SIM_HIDDEN void sim_note_internal(unsigned dev, uint64_t bytes);
/* Mark our entry a graphics process (1) or a compute one (0). */
SIM_HIDDEN int sim_set_graphics(int on);
/* Queue DUR ns of work on DEV's timeline; returns its end (CLOCK_MONOTONIC). */
SIM_HIDDEN uint64_t sim_launch(unsigned dev, uint64_t dur);
/* The CPU time a launch call takes in its thread (HAMI_SIM_LAUNCH_NS), spent
 * here; call outside any lock. */
SIM_HIDDEN void sim_launch_cpu(void);
/* Return dead processes' memory. */
SIM_HIDDEN void sim_sweep(void);
SIM_HIDDEN int sim_proc_alive(unsigned i);
SIM_HIDDEN int sim_entry_owner_gone(unsigned i);
/* Percent of the last second RING (a util ring) shows busy. */
SIM_HIDDEN unsigned sim_util_pct(_Atomic uint64_t *ring);
/* End of the last complete sample period at NOW (a multiple of SIM_SAMPLE_NS). */
SIM_HIDDEN uint64_t sim_sample_end(uint64_t now);
/* Busy ns RING shows in the sample period [END - SIM_SAMPLE_NS, END). */
SIM_HIDDEN uint64_t sim_sample_busy(_Atomic uint64_t *ring, uint64_t end);
/* The same as a percent of the period, rounded, 0..100. */
SIM_HIDDEN unsigned sim_sample_pct(_Atomic uint64_t *ring, uint64_t end);
/* Busy ns RING shows in slot SLOT ([SLOT, SLOT + 1) * SIM_UTIL_SLOT_NS); 0 for a
 * slot the ring no longer holds. */
SIM_HIDDEN uint64_t sim_slot_busy(_Atomic uint64_t *ring, uint64_t slot);
SIM_HIDDEN uint64_t sim_now_ns(void);

/* ---- device memory contents and checkpoints (see sim_mem.c) ------------- */

/* "<state file>.KIND/<entry>": the files beside the state that hold a
 * process's device memory ("mem") and its checkpoint's host copy ("ckpt").
 * Named by entry, not pid: a reclaim removes them before the entry is reused. */
SIM_HIDDEN int sim_side_path(const char *kind, unsigned entry, char *buf, size_t len);
/* Remove every side file of the state file STATE (hami-simctl reset, when
 * no process is left). */
SIM_HIDDEN void sim_side_clear(const char *state);
/* The folder of side files DIR (<state>.mem, <state>.ckpt), made if missing:
 * one state serves every user's processes, so it is world-writable with the
 * sticky bit (1777), whatever the umask. 0, or -1 with errno. */
SIM_HIDDEN int sim_side_mkdir(const char *dir);
/* Open side file PATH read-write, created 0666 (every user's processes and the
 * root checkpointer meet in it) and emptied when TRUNC. Falls back to opening
 * an existing file without O_CREAT: fs.protected_regular refuses O_CREAT on
 * another user's file in a sticky folder. An fd, or -1 with errno. */
SIM_HIDDEN int sim_side_open(const char *path, int trunc);

/* Mark our entry as a CUDA process (cuInit). */
SIM_HIDDEN void sim_mark_cuda(void);

/* Gated driver entry points call these around their work: enter waits while
 * a checkpoint call holds our process (holding no lock of ours), then counts
 * the call in flight. Enter returns what leave takes (-1: nothing to count). */
SIM_HIDDEN int sim_gate_enter(void);
SIM_HIDDEN void sim_gate_leave(int entry);

/* Sleep until *W may have changed from VAL (at most NS), or wake its sleepers.
 * W lies in the shared file: sleepers of every process wake. */
SIM_HIDDEN void sim_shared_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns);
SIM_HIDDEN void sim_shared_wake(_Atomic uint32_t *w);

/* A checkpoint call's hold on a process's entry: while open, the entry is
 * not reclaimed (nor reused), even if its process dies. */
struct sim_target {
	unsigned entry;
	int32_t pid;
	uint64_t start_ticks;
	int fd; /* our own description of the state file: holds the checkpoint lock */
};

/* Hold the entry of the live CUDA process PID (of our pid namespace):
 * SIM_OK, SIM_ENOENT or SIM_EIO. */
SIM_HIDDEN int sim_target_open(int32_t pid, struct sim_target *t);
SIM_HIDDEN void sim_target_close(struct sim_target *t);
/* 0 once the target died. */
SIM_HIDDEN int sim_target_alive(const struct sim_target *t);
/* 1 when another checkpoint call holds the target too: a step state nobody
 * holds was left by a call that died. */
SIM_HIDDEN int sim_target_busy(const struct sim_target *t);
/* Move ENTRY's device bytes off the devices into its parked counts; and back,
 * on every device or on none (SIM_ENOMEM). */
SIM_HIDDEN void sim_park(unsigned entry);
SIM_HIDDEN int sim_unpark(unsigned entry);

#endif
