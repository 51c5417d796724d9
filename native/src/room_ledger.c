/*
 * The room ledger, this process's side (slice_file.h, "The room ledger";
 * docs/broker.md, "Room kept for its requester"). The node agent parks idle
 * kernels to make room for a waiting process; NVML's free figure is
 * everyone's, so that room would go to whoever asks the driver first (on an
 * H200 one request waited 89 s while other sessions' resumes took the room
 * of ten parks). The agent publishes, per GPU, what it keeps free and what
 * it has granted to whom; before this process takes GPU memory on a GPU the
 * agent calls tight, it looks there:
 *
 *  - room granted to this process (its ticket, from the agent's OK) is its own;
 *  - beyond its slice's guarantee it takes its turn: while anyone waits for
 *    room on that GPU, it asks the agent too, and is served in order;
 *  - in every case the reserve and others' grants stay untaken: NVML's free
 *    bytes, less those, must cover the take, or it asks the agent.
 *
 * A GPU the agent did not find tight is taken from without a look of our own
 * while the agent's free figure, less what this process took since, covers
 * the take; past that, NVML is asked. A take refused here goes the way of one
 * the driver refused for memory: a wait for room (room.c). The ledger is mapped read-only, once; a ledger
 * gone stale (its agent stopped) is not believed, and looked for anew.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

#define REOPEN_NS 1000000000ull /* a missing or stale ledger is looked for again this often */
#define LOOSE_SLACK (64ull << 20) /* what the agent's figure may be off by besides our own takes */

static const struct hami_room_ledger *ledger; /* mapped, or NULL */
/* What this process took on each slice device since the agent's look that the
 * ledger's free figure is from: a process that takes GiBs in the half second
 * between two looks must not take the reserve because the figure is old. */
static struct {
	uint64_t looked_unix_ns;
	uint64_t bytes;
} taken[HAMI_SLICE_MAX_DEVICES];
static uint64_t last_open_ns;                 /* monotonic; written under open_lock, read without */
pthread_mutex_t hami_ledger_open_lock = PTHREAD_MUTEX_INITIALIZER;
#define open_lock hami_ledger_open_lock
static int told_refused;

/* "<folder of the broker's socket>/room.ledger" */
static int ledger_path(char *out, size_t cap)
{
	const char *socket = hami_config()->broker_socket;
	const char *slash = socket ? strrchr(socket, '/') : NULL;
	if (!slash)
		return -1;
	int n = snprintf(out, cap, "%.*s/%s", (int)(slash - socket), socket, HAMI_LEDGER_NAME);
	return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* Only root (or this user, for a broker of its own) may have written it. */
static int trusted(const char *path, const struct stat *st)
{
	const char *why = !S_ISREG(st->st_mode) ? "not a regular file"
			  : st->st_uid != 0 && st->st_uid != geteuid() ? "not owned by root"
			  : st->st_mode & (S_IWGRP | S_IWOTH) ? "writable by others"
			  : (size_t)st->st_size < sizeof(struct hami_room_ledger) ? "too short"
			  : NULL;
	if (why && !__atomic_exchange_n(&told_refused, 1, __ATOMIC_RELAXED))
		hami_log(HAMI_LOG_WARN, "the room ledger %s is %s: not believed (only the node agent, as "
			 "root, writes it)", path, why);
	return why == NULL;
}

static const struct hami_room_ledger *map_ledger(void)
{
	char path[PATH_MAX];
	if (ledger_path(path, sizeof(path)) < 0)
		return NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return NULL; /* no agent keeps a ledger here: takes are the driver's to judge */
	struct stat st;
	const struct hami_room_ledger *l = NULL;
	if (fstat(fd, &st) == 0 && trusted(path, &st)) {
		void *m = mmap(NULL, sizeof(*l), PROT_READ, MAP_SHARED, fd, 0);
		if (m != MAP_FAILED)
			l = m;
	}
	close(fd);
	if (l && (memcmp(l->magic, HAMI_LEDGER_MAGIC, 8) != 0 || l->version_major != HAMI_LEDGER_VERSION_MAJOR)) {
		munmap((void *)l, sizeof(*l));
		l = NULL;
	}
	return l;
}

static int fresh(const struct hami_room_ledger *l)
{
	uint64_t written = __atomic_load_n(&l->written_unix_ns, __ATOMIC_ACQUIRE);
	uint64_t now = hami_now_ns();
	return written && (now < written || now - written < HAMI_LEDGER_STALE_NS);
}

/* The ledger, when one is believed now. A stale mapping (an agent that
 * stopped; a new one writes a new file) is dropped and looked for again, at
 * most once a REOPEN_NS, or at once when *now_or_never*: a resume, which
 * takes GiBs at a time, must not miss an agent that started a moment ago. */
static const struct hami_room_ledger *look_up(int now_or_never)
{
	const struct hami_room_ledger *l = __atomic_load_n(&ledger, __ATOMIC_ACQUIRE);
	if (l && fresh(l))
		return l;
	uint64_t now = hami_monotonic_ns();
	if (!now_or_never && now - __atomic_load_n(&last_open_ns, __ATOMIC_RELAXED) < REOPEN_NS)
		return NULL;
	pthread_mutex_lock(&open_lock);
	if (now_or_never || now - __atomic_load_n(&last_open_ns, __ATOMIC_RELAXED) >= REOPEN_NS) {
		__atomic_store_n(&last_open_ns, now, __ATOMIC_RELAXED);
		const struct hami_room_ledger *next = map_ledger();
		/* The old mapping is left in place: another thread may be reading it. */
		if (next && next != l)
			__atomic_store_n(&ledger, next, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&open_lock);
	l = __atomic_load_n(&ledger, __ATOMIC_ACQUIRE);
	return l && fresh(l) ? l : NULL;
}

static const struct hami_room_ledger *current(void)
{
	return look_up(0);
}

/* A consistent copy of GPU uuid's entry (the agent writes it as a seqlock). */
static int copy_gpu(const struct hami_ledger_gpu *src, struct hami_ledger_gpu *out)
{
	for (int tries = 0; tries < 64; tries++) {
		uint64_t seq = __atomic_load_n(&src->seq, __ATOMIC_ACQUIRE);
		if (seq & 1)
			continue;
		memcpy(out, (const void *)src, sizeof(*out));
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&src->seq, __ATOMIC_RELAXED) == seq)
			return 0;
	}
	return -1; /* a writer that keeps writing: not believed this time */
}

/* GPU uuid's entry of ledger l (NULL: none believed): 0, or -1. */
static int ledger_gpu(const struct hami_room_ledger *l, const char *uuid, struct hami_ledger_gpu *out)
{
	if (!l || !uuid || !uuid[0])
		return -1;
	for (int i = 0; i < HAMI_LEDGER_MAX_GPUS; i++) {
		if (strncmp(l->gpu[i].uuid, uuid, HAMI_SLICE_UUID_LEN) != 0)
			continue;
		if (copy_gpu(&l->gpu[i], out) < 0 || strncmp(out->uuid, uuid, HAMI_SLICE_UUID_LEN) != 0)
			return -1;
		return 0;
	}
	return -1;
}

int hami_ledger_gpu(const char *uuid, struct hami_ledger_gpu *out)
{
	return ledger_gpu(current(), uuid, out);
}

int hami_ledger_gpu_now(const char *uuid, struct hami_ledger_gpu *out)
{
	return ledger_gpu(look_up(1), uuid, out);
}


/* The slice's use on sdev is within its guarantee (the limit when none is set). */
int hami_within_guarantee(int sdev)
{
	struct hami_device_limit l;
	if (hami_slice_limit(sdev, &l) < 0)
		return 0;
	uint64_t guaranteed = l.memory_guarantee ? l.memory_guarantee : l.memory_limit;
	return guaranteed && hami_device_used(sdev) <= guaranteed;
}

static int free_bytes(int sdev, uint64_t *free)
{
	nvmlMemory_t m;
	if (hami_nvml_memory(sdev, &m) < 0)
		return -1;
	*free = m.free;
	return 0;
}

const char *hami_ledger_refusal(const struct hami_ledger_gpu *g, uint64_t ticket, int within, uint64_t free,
				uint64_t bytes)
{
	uint64_t mine = hami_ledger_granted(g, ticket);
	if (mine)
		return NULL;
	if (!within && g->waiting)
		return "others wait for room on it first";
	uint64_t keep = g->reserve_bytes + g->granted_bytes;
	if (free < keep || free - keep < bytes)
		return "what is free is kept for parks or for others";
	return NULL;
}

uint64_t hami_ledger_granted(const struct hami_ledger_gpu *g, uint64_t ticket)
{
	uint64_t now = hami_now_ns();
	for (int i = 0; ticket && i < HAMI_LEDGER_MAX_GRANTS; i++)
		if (g->grant[i].ticket == ticket && g->grant[i].expires_unix_ns > now)
			return g->grant[i].bytes ? g->grant[i].bytes : 1;
	return 0;
}

/*
 * Whether the ledger's GPU is loose enough for this take without a look of our
 * own: not tight at the agent's latest look, and its free figure then, less
 * what this process took since, leaves the take and the reserve with room to
 * spare. Counted as taken at once (a take that fails leaves the count high:
 * the next take looks for itself a little sooner).
 */
static int loose(int sdev, const struct hami_ledger_gpu *g, uint64_t bytes)
{
	if (g->turns)
		return 0;
	uint64_t looked = __atomic_load_n(&taken[sdev].looked_unix_ns, __ATOMIC_RELAXED);
	if (looked != g->looked_unix_ns) { /* a newer look: what we took before it is in its figure */
		__atomic_store_n(&taken[sdev].bytes, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&taken[sdev].looked_unix_ns, g->looked_unix_ns, __ATOMIC_RELAXED);
	}
	uint64_t mine = __atomic_add_fetch(&taken[sdev].bytes, bytes, __ATOMIC_RELAXED);
	uint64_t keep = g->reserve_bytes + g->granted_bytes + LOOSE_SLACK;
	return g->free_bytes > keep && g->free_bytes - keep >= mine;
}

static CUresult room_turn(struct hami_room *w, int sdev, uint64_t bytes, int look_now)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_ledger_gpu g;
	if (!bytes || !f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES ||
	    (look_now ? hami_ledger_gpu_now : hami_ledger_gpu)(f->device[sdev].uuid, &g) < 0 ||
	    loose(sdev, &g, bytes))
		return CUDA_SUCCESS;
	int within = hami_within_guarantee(sdev);
	uint64_t free = UINT64_MAX;
	/* Only the waiters' order needs no figure; otherwise NVML's, and a GPU
	 * NVML cannot read is the driver's to judge. */
	if ((within || !g.waiting || hami_ledger_granted(&g, w->ticket)) && free_bytes(sdev, &free) < 0)
		return CUDA_SUCCESS;
	const char *why = hami_ledger_refusal(&g, w->ticket, within, free, bytes);
	if (!why)
		return CUDA_SUCCESS;
	/* Waiting behind others is said as such; room that is short is said as
	 * the driver's refusal would be (the broker's answer says what is kept). */
	if (!within && g.waiting && !hami_ledger_granted(&g, w->ticket))
		snprintf(w->turn, sizeof(w->turn), "%s", why);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

/* An allocation's or a context's turn: the ledger as last looked for (at
 * most once a second when there is none: these calls are many). */
CUresult hami_room_turn(struct hami_room *w, int sdev, uint64_t bytes)
{
	return room_turn(w, sdev, bytes, 0);
}

/* A resume's turn (one every second at most, and GiBs at a time): an agent
 * that started a moment ago is looked for at once. */
CUresult hami_room_turn_now(struct hami_room *w, int sdev, uint64_t bytes)
{
	return room_turn(w, sdev, bytes, 1);
}
