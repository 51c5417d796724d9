/*
 * The slice file, layout version 1: the one contract between every process of
 * a slice (the preload library in each kernel), the Jupyter side (magic, CLI,
 * server extension) and whoever sets the limits (hub, admin).
 *
 * This header is the source of truth. hami_jupyter/slice/layout.py mirrors it
 * and tests/test_slice_layout.py fails if any offset or size disagrees.
 * docs/slice-file.md explains the rules; in short:
 *
 *  - Every field is naturally aligned and accessed with atomic loads/stores
 *    (or compare-and-swap); no process-shared mutex exists anywhere.
 *  - A live slot is owned by the process holding an OFD write lock
 *    (fcntl F_OFD_SETLK) on the slot's first byte. The kernel drops that lock
 *    when the process dies, whatever its PID namespace, so "lock free" means
 *    "owner gone" and PID reuse cannot fool it.
 *  - The slice's memory charge per device (hami_slice_device.memory_used) is
 *    reserved with compare-and-swap against the limit before the driver call,
 *    and rolled back if the call fails: concurrent processes never pass it.
 *    A slot's txn counts its owner's threads between updating that counter
 *    and the slot's memory_used; when every txn is 0, the device counter
 *    must equal the sum of the slots', and a sweeping process restores that
 *    equality after a process died half-way.
 *  - Limits are double-buffered: writers (serialized by an OFD lock on the
 *    limits block) fill the copy not in use, then bump the generation. Readers
 *    never wait; a writer that dies half-way never published its copy.
 *
 * Sizes are fixed: nothing is ever moved or compacted.
 */
#ifndef HAMI_SLICE_FILE_H
#define HAMI_SLICE_FILE_H

#include <stdint.h>

#define HAMI_SLICE_MAGIC "HAMISLCE" /* 8 bytes, no terminator */
#define HAMI_SLICE_VERSION_MAJOR 1u
#define HAMI_SLICE_VERSION_MINOR 8u

#define HAMI_LIMITS_MAGIC "HAMILIMT" /* the companion limits file, 8 bytes */
#define HAMI_LIMITS_VERSION_MAJOR 1u
#define HAMI_LIMITS_VERSION_MINOR 0u

#define HAMI_SLICE_MAX_DEVICES 16
#define HAMI_SLICE_MAX_SLOTS 256
#define HAMI_SLICE_NAME_LEN 64
#define HAMI_SLICE_UUID_LEN 48
#define HAMI_SLICE_KERNEL_ID_LEN 48
#define HAMI_SLICE_COMM_LEN 16

/*
 * Where a slice named without a path (HAMI_SLICE=alice) lives: the first of
 * $HAMI_SLICE_ROOT; HAMI_HUB_SLICE_ROOT when it is a directory (the hub
 * manages the slices of this host); $XDG_RUNTIME_DIR/HAMI_SLICE_ROOT_SUBDIR;
 * HAMI_SLICE_ROOT_TMP_PREFIX<uid>. There the slice is <name>HAMI_SLICE_SUFFIX
 * and its limits file, when a hub owns the limits, <name>HAMI_LIMITS_SUFFIX.
 */
#define HAMI_HUB_SLICE_ROOT "/run/hami-jupyter"
#define HAMI_SLICE_ROOT_SUBDIR "hami-jupyter"
#define HAMI_SLICE_ROOT_TMP_PREFIX "/tmp/hami-jupyter-"
#define HAMI_SLICE_SUFFIX ".slice"
#define HAMI_LIMITS_SUFFIX ".limits"

/* hami_slice_header.flags */
#define HAMI_SLICE_FLAG_PRIVATE 0x1u /* anonymous slice of one process tree */

/* hami_device_limit.mode */
#define HAMI_MODE_HARD 0u
#define HAMI_MODE_ELASTIC 1u

/* hami_device_limit.flags */
#define HAMI_LIMIT_SET 0x1u /* this entry is in force (else: the fallback) */

/* hami_slice_device.state and hami_slot.state */
#define HAMI_DEVICE_EMPTY 0u
#define HAMI_DEVICE_CLAIMING 1u
#define HAMI_DEVICE_READY 2u

#define HAMI_SLOT_FREE 0u
#define HAMI_SLOT_LIVE 1u

/* hami_slot.park_state (1.4): where the process's GPU state is, see docs/parking.md */
#define HAMI_PARK_RUNNING 0u  /* on the GPU */
#define HAMI_PARK_PARKING 1u  /* a parker is moving it to host memory */
#define HAMI_PARK_PARKED 2u   /* in host memory; the slot's memory_used is in parked[] */
#define HAMI_PARK_RESUMING 3u /* the process is bringing it back */

/* hami_slot.park_wait: why a wanted resume has not happened yet */
#define HAMI_PARK_WAIT_NONE 0u
#define HAMI_PARK_WAIT_SLICE 1u /* the slice's cap has no room for it now */
#define HAMI_PARK_WAIT_GPU 2u   /* the GPU has not that much free memory now */

/* hami_slot.park_reason (1.7): why the process was parked, see docs/parking.md */
#define HAMI_PARK_REASON_NONE 0u  /* not parked, or parked by a parker that gave no reason */
#define HAMI_PARK_REASON_IDLE 1u  /* the Jupyter server's idle policy */
#define HAMI_PARK_REASON_ASKED 2u /* a user or administrator asked (REST, CLI, panel) */
#define HAMI_PARK_REASON_ROOM 3u  /* the memory broker: to make room for another user's work */
#define HAMI_PARK_REASON_GUARD 4u /* the guard: over the cap by the driver's figures */

/* hami-park's own refusals, in its answer "error <code> <why>": what a slot
 * says stands in the way, apart from the driver's CUresults (all below 1000) */
#define HAMI_PARK_REFUSED_STATE 1001  /* the slot says the process is not running on the GPU */
#define HAMI_PARK_REFUSED_PARKER 1002 /* another parker holds the slot */
#define HAMI_PARK_REFUSED_HOST 1003   /* host memory too low for the slot's charge */

/*
 * hami_slot.park_fast (1.8): the fast park, a park the process does itself
 * (docs/parking.md). The parker (hami-park, holding park_state PARKING) asks;
 * the process answers. Until COPYING the parker may withdraw and checkpoint
 * instead; from COPYING on it waits for DONE or FAILED.
 */
#define HAMI_FAST_NONE 0u
#define HAMI_FAST_ASKED 1u     /* a parker asks the process to park itself */
#define HAMI_FAST_TAKEN 2u     /* the process works at it: its threads out of the driver, GPU work done */
#define HAMI_FAST_COPYING 3u   /* it moves its memory to host memory; no withdrawal any more */
#define HAMI_FAST_DONE 4u      /* parked by itself: the charge of what it moved is in parked[] */
#define HAMI_FAST_REFUSED 5u   /* it cannot (memory it cannot move, or no fast park here): checkpoint it */
#define HAMI_FAST_FAILED 6u    /* a step failed; nothing lost, it runs on unparked */
#define HAMI_FAST_WITHDRAWN 7u /* the parker stopped waiting before COPYING (it checkpoints instead) */

struct hami_slice_header {
	char magic[8];
	uint32_t version_major;
	uint32_t version_minor;
	uint64_t file_size;      /* bytes; readers refuse a shorter file */
	uint32_t header_size;    /* sizeof(struct hami_slice_header) */
	uint32_t flags;          /* HAMI_SLICE_FLAG_* */
	uint32_t max_devices;    /* HAMI_SLICE_MAX_DEVICES */
	uint32_t max_slots;      /* HAMI_SLICE_MAX_SLOTS */
	uint32_t device_size;    /* sizeof(struct hami_slice_device) */
	uint32_t slot_size;      /* sizeof(struct hami_slot) */
	uint64_t limits_offset;  /* struct hami_slice_limits */
	uint64_t devices_offset; /* struct hami_slice_device[max_devices] */
	uint64_t slots_offset;   /* struct hami_slot[max_slots] */
	uint64_t created_unix_ns;
	char name[HAMI_SLICE_NAME_LEN]; /* slice name, NUL-terminated */
	uint8_t reserved[112];
};

/*
 * Limits of one device. An entry without HAMI_LIMIT_SET defers to the
 * set's fallback. Within an entry in force, zero means "no limit".
 */
struct hami_device_limit {
	uint64_t memory_limit; /* bytes */
	uint32_t sm_share;     /* percent of the GPU's time, 1..100 */
	uint32_t mode;         /* HAMI_MODE_* */
	uint32_t max_decoders; /* concurrent NVDEC decoders */
	uint32_t flags;        /* HAMI_LIMIT_* */
	/* (1.7) bytes the slice is guaranteed on the GPU; 0: the limit is the
	 * guarantee (nothing oversubscribed). Never above a nonzero limit. */
	uint64_t memory_guarantee;
};

/* One complete, consistent set of limits. */
struct hami_limit_set {
	struct hami_device_limit device[HAMI_SLICE_MAX_DEVICES]; /* by slice device index */
	struct hami_device_limit fallback; /* for a GPU not yet in device[] */
};

struct hami_slice_limits {
	uint64_t generation;      /* the copy in force is copy[generation & 1] */
	uint64_t changed_unix_ns; /* when the generation last changed */
	struct hami_limit_set copy[2];
};

/* One GPU the slice has met, keyed by UUID. */
struct hami_slice_device {
	uint32_t state;    /* HAMI_DEVICE_*: claimed with compare-and-swap */
	uint32_t sm_count; /* multiprocessors of the physical GPU */
	char uuid[HAMI_SLICE_UUID_LEN]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
	uint64_t memory_total; /* physical bytes */
	uint64_t memory_used;  /* the slice's charge: every process, reservations included */
	uint64_t memory_peak;  /* highest memory_used seen */
	uint32_t sm_util;      /* percent, whole slice, refreshed by its processes */
	uint32_t decoders;     /* live NVDEC decoders, whole slice */
	/* SM share control (1.1), see docs/sm-share.md */
	uint64_t sm_sample_us;   /* newest NVML utilization sample the controller used */
	uint32_t sm_open_ppm;    /* part of each launch period the slice may launch in, ppm */
	uint32_t sm_tuned_for;   /* the share (percent) sm_open_ppm was tuned for */
	uint32_t sm_others_util; /* percent of the GPU used by processes outside the slice */
	uint32_t sm_waits;       /* launches held for the open window (wraps): demand seen */
	uint32_t sm_waits_steered; /* sm_waits when the controller last steered */
	uint32_t reserved0;
	/* (1.8) CLOCK_MONOTONIC ns when sm_open_ppm was last started afresh (a new
	 * share, or the share binding again): samples read soon after cover the
	 * time before it and steer nothing */
	uint64_t sm_restart_ns;
};

/* One process of the slice. */
struct hami_slot {
	uint32_t state; /* HAMI_SLOT_*; owned while its OFD lock is held */
	int32_t pid;    /* in the owner's PID namespace */
	uint64_t pid_ns;          /* inode of the owner's /proc/self/ns/pid */
	uint32_t uid;
	uint32_t txn;   /* owner's threads now between the two steps of a charge */
	uint64_t started_unix_ns;
	uint64_t active_unix_ns;  /* last charge, credit or heartbeat (the parking thread's) */
	char kernel_id[HAMI_SLICE_KERNEL_ID_LEN]; /* Jupyter kernel id, if any */
	char comm[HAMI_SLICE_COMM_LEN];           /* process name */
	uint64_t memory_used[HAMI_SLICE_MAX_DEVICES]; /* by slice device index */
	uint32_t sm_util[HAMI_SLICE_MAX_DEVICES];     /* percent */
	/* NVDEC (1.3), see docs/nvdec.md */
	uint8_t decoders[HAMI_SLICE_MAX_DEVICES];      /* live decoders, by slice device index */
	uint64_t frames_decoded; /* cuvidDecodePicture calls that succeeded */
	uint64_t frames_mapped;  /* cuvidMapVideoFrame(64) calls that succeeded */
	uint64_t decode_ns;      /* time spent in cuvidDecodePicture */
	/* parking (1.4), see docs/parking.md. A parker (hami-park) holds an OFD
	 * lock on park_state's first byte while it moves the process's state. */
	uint32_t park_state;     /* HAMI_PARK_* */
	uint32_t park_wanted;    /* nonzero: someone needs the state back on the GPU */
	uint32_t park_wait;      /* HAMI_PARK_WAIT_*: why a wanted resume waits */
	int32_t park_error;      /* CUresult of the last park or resume step that failed, 0 none */
	uint64_t park_unix_ns;   /* when the last park or resume finished */
	uint64_t gpu_active_unix_ns; /* last time a thread of the process called the driver */
	uint64_t parked[HAMI_SLICE_MAX_DEVICES]; /* bytes in host memory, by slice device index */
	/* the true-up (1.5): part of memory_used that is the driver's own memory
	 * for the process (NVML's figure minus what the hooks charged) */
	uint64_t driver_bytes[HAMI_SLICE_MAX_DEVICES];
	/* (1.6) charges, credits and reclaims of this slot ever finished: a
	 * recount that saw it unchanged knows none ran while it summed */
	uint64_t changes;
	/* (1.7) the memory broker, see docs/parking.md */
	uint32_t park_reason;    /* HAMI_PARK_REASON_*: set by the parker before PARKED, 0 on resume */
	uint32_t room_wait_device; /* slice device index a thread of the process waits for room on */
	uint64_t room_wait_since_unix_ns; /* nonzero while it waits for GPU room: when the wait began */
	uint64_t room_wait_bytes;  /* the bytes it waits for */
	/* (1.8) the fast park: the process moves its own memory (docs/parking.md) */
	uint32_t park_fast;      /* HAMI_FAST_*: a parker's request and the process's answer */
	uint32_t park_fast_able; /* nonzero: the process parks itself when asked (HAMI_FAST_PARK=1) */
	uint8_t reserved[360];
};

/* The whole file, in order. */
struct hami_slice_file {
	struct hami_slice_header header;
	struct hami_slice_limits limits;
	struct hami_slice_device device[HAMI_SLICE_MAX_DEVICES];
	struct hami_slot slot[HAMI_SLICE_MAX_SLOTS];
};

/*
 * Limits held apart from usage (1.2): "<name>.limits" beside "<name>.slice".
 * A hub or administrator owns it and the slice's processes may only read it,
 * while they must write the slice file itself. When it exists it is the
 * authority and the slice file's own limits block is not used. Same
 * double-buffer and writer lock (on the first byte of .limits) as in-file.
 */
struct hami_limits_file {
	char magic[8];          /* HAMI_LIMITS_MAGIC */
	uint32_t version_major; /* HAMI_LIMITS_VERSION_MAJOR: a reader refuses any other */
	uint32_t version_minor;
	uint64_t file_size;     /* sizeof(struct hami_limits_file) */
	uint8_t reserved[40];
	struct hami_slice_limits limits;
};

/*
 * The room ledger (layout 1.0): what the node agent has made room for, and
 * keeps free, on each GPU; docs/broker.md, "Room kept for its requester".
 * NVML's free figure is everyone's, so room parked free for one waiting
 * process is taken by whoever asks the driver first unless every taker
 * looks here before: the agent (root) publishes it in "<the broker
 * socket's folder>/HAMI_LEDGER_NAME", mode 0644, and every preload library
 * and hami-park map it read-only. A ledger not owned by root (or by the
 * reader's own user), writable by others, or not written for
 * HAMI_LEDGER_STALE_NS (its agent is gone) is not believed.
 *
 * Each GPU entry is a seqlock: the agent makes seq odd, writes, makes it
 * even; a reader copies the entry and copies again while seq was odd or
 * moved. A take of GPU memory beyond its slice's guarantee, while turns is
 * set, waits its turn through the agent when anyone waits there (waiting),
 * and leaves reserve_bytes and others' grants untaken in any case.
 */
#define HAMI_LEDGER_MAGIC "HAMIROOM" /* 8 bytes, no terminator */
#define HAMI_LEDGER_VERSION_MAJOR 1u
#define HAMI_LEDGER_VERSION_MINOR 0u
#define HAMI_LEDGER_NAME "room.ledger"
#define HAMI_LEDGER_MAX_GPUS 16
#define HAMI_LEDGER_MAX_GRANTS 16
#define HAMI_LEDGER_STALE_NS 5000000000ull /* the agent writes every 0.5 s */

/* Room made for one request: its until the requester's connection closes. */
struct hami_room_grant {
	uint64_t ticket;          /* nonzero while granted; the agent's "OK <made> <ticket>" names it */
	uint64_t bytes;           /* free bytes kept for it */
	uint64_t expires_unix_ns; /* it lapses then, whatever happens */
	int32_t pid;              /* the requester, as the agent's PID namespace numbers it */
	uint32_t reserved;
};

struct hami_ledger_gpu {
	uint64_t seq;                 /* odd while the agent writes the entry */
	char uuid[HAMI_SLICE_UUID_LEN]; /* empty: an unused entry */
	uint64_t reserve_bytes;       /* kept free for parks: nothing through the library takes it */
	uint64_t granted_bytes;       /* the sum of the live grants' bytes */
	uint64_t free_bytes;          /* NVML's free figure at the agent's latest look */
	uint64_t looked_unix_ns;      /* ... taken then */
	uint64_t moving_until_unix_ns; /* a process's GPU state is moving to or from host memory */
	uint32_t turns;               /* nonzero: the GPU is tight, takes beyond a guarantee look here */
	uint32_t waiting;             /* requests for room queued or served now */
	uint64_t reserved[4];
	struct hami_room_grant grant[HAMI_LEDGER_MAX_GRANTS];
};

struct hami_room_ledger {
	char magic[8];          /* HAMI_LEDGER_MAGIC */
	uint32_t version_major; /* HAMI_LEDGER_VERSION_MAJOR: a reader refuses any other */
	uint32_t version_minor;
	uint64_t file_size;     /* sizeof(struct hami_room_ledger) */
	uint64_t written_unix_ns; /* the agent's heartbeat */
	int32_t agent_pid;
	uint32_t reserved0;
	uint8_t reserved[24];
	struct hami_ledger_gpu gpu[HAMI_LEDGER_MAX_GPUS];
};

_Static_assert(sizeof(struct hami_room_grant) == 32, "room grant size");
_Static_assert(sizeof(struct hami_ledger_gpu) == 648, "ledger gpu size");
_Static_assert(sizeof(struct hami_room_ledger) == 64 + 16 * 648, "ledger size");
_Static_assert(sizeof(struct hami_slice_header) == 256, "header size");
_Static_assert(sizeof(struct hami_limits_file) == 1168, "limits file size");
_Static_assert(sizeof(struct hami_device_limit) == 32, "device limit size");
_Static_assert(sizeof(struct hami_limit_set) == 544, "limit set size");
_Static_assert(sizeof(struct hami_slice_limits) == 1104, "limits size");
_Static_assert(sizeof(struct hami_slice_device) == 128, "device size");
_Static_assert(sizeof(struct hami_slot) == 1024, "slot size");

#endif
