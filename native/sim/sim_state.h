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
#define SIM_VERSION 2u /* 2: NVDEC decoder counts and frame counters */
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

#define SIM_PROC_FREE 0u
#define SIM_PROC_LIVE 1u

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
	uint8_t reserved[64];
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
	SIM_EFULL = -4    /* no free process entry (already printed) */
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
/* Queue DUR ns of work on DEV's timeline; returns its end (CLOCK_MONOTONIC). */
SIM_HIDDEN uint64_t sim_launch(unsigned dev, uint64_t dur);
/* Return dead processes' memory. */
SIM_HIDDEN void sim_sweep(void);
SIM_HIDDEN int sim_proc_alive(unsigned i);
/* Percent of the last second RING (a util ring) shows busy. */
SIM_HIDDEN unsigned sim_util_pct(_Atomic uint64_t *ring);
/* End of the last complete sample period at NOW (a multiple of SIM_SAMPLE_NS). */
SIM_HIDDEN uint64_t sim_sample_end(uint64_t now);
/* Busy ns RING shows in the sample period [END - SIM_SAMPLE_NS, END). */
SIM_HIDDEN uint64_t sim_sample_busy(_Atomic uint64_t *ring, uint64_t end);
/* The same as a percent of the period, rounded, 0..100. */
SIM_HIDDEN unsigned sim_sample_pct(_Atomic uint64_t *ring, uint64_t end);
SIM_HIDDEN uint64_t sim_now_ns(void);

#endif
