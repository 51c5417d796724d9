/*
 * Parking, this process's side (docs/parking.md). A parker (hami-park, run by
 * the Jupyter server or hami-jupyter park) locks this process with the
 * driver's checkpoint API and moves its GPU state to host memory; here, in a
 * parking thread of its own:
 *
 *  - it moves the process's charge to the slot's parked[] once it is parked,
 *    so the slice sees host memory, not GPU memory;
 *  - a driver call made while parked asks for the state back (park_wanted)
 *    and waits, as the driver would block it anyway; the thread also asks
 *    when it sees a thread inside a hooked call while parked (a call that
 *    slipped in just before the parker's lock and now waits there);
 *  - a wanted resume first finds room under the slice's cap (the charge comes
 *    back with the same compare-and-swap as an allocation), then takes its
 *    turn on a GPU the node agent calls tight, as an allocation does (the room
 *    ledger: while others wait there it asks the broker first, beyond its
 *    slice's guarantee), then runs "hami-park restore" on this pid, which
 *    checks the GPUs' free memory less what the ledger keeps for parks and
 *    for others, restores and unlocks; a GPU without that much free memory is
 *    a wait for the memory broker to make room (room.c), then the restore is
 *    tried again;
 *  - a parker that died half-way (PARKING, and nobody holds its lock) is
 *    undone by "hami-park recover";
 *  - the fast park: a parker that asks (park_fast ASKED) gets this process
 *    to move the memory it backed itself (fast_park.c) while its other
 *    threads wait at the gate, or a refusal when it cannot (the parker then
 *    checkpoints it); such a process resumes itself the same way.
 *
 * Nothing here calls the CUDA driver or NVML while the driver may hold the
 * process (a checkpoint park): in a locked process both block. The fast park
 * calls the driver only while nobody locks the process: before its copy
 * begins the parker may still withdraw, and from then on it waits.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

#define MAX_MARKS 1024               /* threads whose driver calls are seen; more go unseen */
#define WAIT_POLL_NS (2 * 1000000L)  /* a waiting call looks again this often */
#define RETRY_NS (1000ull * 1000000) /* a resume that failed waits this long before the next try */
#define RESTORE_TIMEOUT_MS 600000    /* restoring 100+ GiB takes tens of seconds */
#define TICK_NS (20 * 1000000L)      /* the parking thread looks this often */

struct hami_slot *hami_parkable_slot;
__thread struct hami_call_mark *hami_thread_mark;

static struct hami_call_mark marks[MAX_MARKS];
static pthread_key_t mark_key;
static pthread_once_t mark_once = PTHREAD_ONCE_INIT;
static int moved;                 /* the charge is in parked[] (parking thread only) */
static uint64_t calls_seen;       /* parking thread only */
static uint64_t next_try_ns;      /* parking thread only */
static uint32_t last_wait_logged; /* parking thread only */
static struct hami_room room = HAMI_ROOM_INIT; /* a resume's wait for GPU room (parking thread only) */
static int thread_started;
static int fast_parked;           /* this process parked itself (parking thread only) */

/* ---- which threads are inside the driver --------------------------------- */

static void mark_free(void *p)
{
	struct hami_call_mark *m = p;
	__atomic_store_n(&m->in_call, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&m->used, 0, __ATOMIC_RELEASE);
}

static void make_key(void)
{
	pthread_key_create(&mark_key, mark_free);
}

/* This thread's mark, taken on its first driver call; NULL when all are taken. */
struct hami_call_mark *hami_call_mark_new(void)
{
	pthread_once(&mark_once, make_key);
	for (int i = 0; i < MAX_MARKS; i++) {
		uint32_t free_ = 0;
		if (__atomic_load_n(&marks[i].used, __ATOMIC_RELAXED) ||
		    !__atomic_compare_exchange_n(&marks[i].used, &free_, 1, 0, __ATOMIC_ACQ_REL,
						 __ATOMIC_RELAXED))
			continue;
		hami_thread_mark = &marks[i];
		pthread_setspecific(mark_key, &marks[i]); /* frees the mark when the thread ends */
		return &marks[i];
	}
	return NULL;
}

/* Whether any thread is inside the driver now; *calls: every call made so far. */
int hami_threads_in_driver(uint64_t *calls)
{
	int inside = 0;
	uint64_t sum = 0;
	for (int i = 0; i < MAX_MARKS; i++) {
		if (!__atomic_load_n(&marks[i].used, __ATOMIC_ACQUIRE))
			continue;
		inside |= __atomic_load_n(&marks[i].in_call, __ATOMIC_RELAXED) != 0;
		sum += __atomic_load_n(&marks[i].calls, __ATOMIC_RELAXED);
	}
	*calls = sum;
	return inside;
}

/* ---- a call into a parked process ----------------------------------------- */

void hami_park_wait(struct hami_slot *s)
{
	static int told;
	if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
		hami_log(HAMI_LOG_INFO, "this process's GPU state is parked in host memory: a CUDA call "
			 "asks for it back and waits");
	while (__atomic_load_n(&s->park_state, __ATOMIC_ACQUIRE) != HAMI_PARK_RUNNING) {
		__atomic_store_n(&s->park_wanted, 1, __ATOMIC_RELEASE);
		struct timespec ts = { 0, WAIT_POLL_NS };
		nanosleep(&ts, NULL);
	}
}

/* ---- hami-park, run from here --------------------------------------------- */

/* hami-park lies beside this library (native/build/, or _native/ in a wheel). */
static int park_tool(char *out, size_t cap)
{
	Dl_info info;
	if (!dladdr((void *)park_tool, &info) || !info.dli_fname)
		return -1;
	const char *slash = strrchr(info.dli_fname, '/');
	size_t dir = slash ? (size_t)(slash - info.dli_fname) : 0;
	int w = dir ? snprintf(out, cap, "%.*s/hami-park", (int)dir, info.dli_fname)
		    : snprintf(out, cap, "hami-park");
	return w > 0 && (size_t)w < cap && access(out, X_OK) == 0 ? 0 : -1;
}

extern char **environ;

/*
 * Run "hami-park WHAT <this pid> EXTRA..." without this library in it, and read its one
 * line of answer: "ok ..." or "error <CUresult> <why>". The answer comes through
 * a pipe, not the exit status, so a program that reaps every child (or ignores
 * SIGCHLD) cannot take it from us. Returns the CUresult, -1 when it did not
 * run; *answer* (cap bytes) gets the line.
 */
static int run_park_tool(const char *what, char *const *extra, char *answer, size_t cap)
{
	char tool[4096], pid[32];
	if (park_tool(tool, sizeof(tool)) < 0) {
		hami_log(HAMI_LOG_ERROR, "hami-park was not found beside libvgpu.so: a parked process "
			 "cannot be resumed; reinstall hami-jupyter");
		return -1;
	}
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -1;
	/* The child's environment: ours without the preload library. */
	size_t n = 0;
	for (char **e = environ; e && *e; e++)
		n++;
	char **env = calloc(n + 1, sizeof(*env));
	if (!env) {
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	size_t k = 0;
	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
			env[k++] = *e;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
	char *argv[4 + HAMI_SLICE_MAX_DEVICES] = { tool, (char *)what, pid };
	for (int i = 0; extra && extra[i] && i < HAMI_SLICE_MAX_DEVICES; i++)
		argv[3 + i] = extra[i];
	pid_t child;
	int err = posix_spawn(&child, tool, &fa, NULL, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	free(env);
	close(fds[1]);
	if (err) {
		close(fds[0]);
		hami_log(HAMI_LOG_ERROR, "cannot run %s: %s", tool, strerror(err));
		return -1;
	}
	size_t got = 0;
	struct pollfd p = { .fd = fds[0], .events = POLLIN };
	while (got < cap - 1 && poll(&p, 1, RESTORE_TIMEOUT_MS) > 0) {
		ssize_t r = read(fds[0], answer + got, cap - 1 - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	answer[got] = '\0';
	close(fds[0]);
	waitpid(child, NULL, WNOHANG); /* reaped here when nobody else took it; else a zombie until exit */
	if (strncmp(answer, "ok", 2) == 0)
		return CUDA_SUCCESS;
	int rc = CUDA_ERROR_UNKNOWN;
	if (sscanf(answer, "error %d", &rc) != 1)
		rc = CUDA_ERROR_UNKNOWN;
	answer[strcspn(answer, "\n")] = '\0';
	/* No room yet is a wait (the slot's park_wait says so), not an error. */
	hami_log(rc == CUDA_ERROR_OUT_OF_MEMORY ? HAMI_LOG_INFO : HAMI_LOG_ERROR, "hami-park %s %s failed: %s",
		 what, pid, answer[0] ? answer : "no answer");
	return rc;
}

/* ---- the parking thread's part ------------------------------------------- */

static int slot_index_of(struct hami_slot *s)
{
	struct hami_slice_file *f = hami_slice();
	return f ? (int)(s - f->slot) : -1;
}

/* Parked: the charge goes to parked[], so the slice counts host memory apart. */
static void move_charge_out(struct hami_slot *s)
{
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		uint64_t bytes = __atomic_load_n(&s->memory_used[d], __ATOMIC_ACQUIRE);
		if (!bytes)
			continue;
		__atomic_store_n(&s->parked[d], bytes, __ATOMIC_RELEASE);
		hami_credit(d, bytes);
	}
	moved = 1;
	hami_log(HAMI_LOG_INFO, "parked: this process's GPU memory is in host memory");
}

/* Give back what a resume reserved, devices below *upto*. */
static void unreserve(struct hami_slot *s, int upto)
{
	for (int d = 0; d < upto; d++) {
		uint64_t bytes = __atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE);
		if (bytes)
			hami_credit(d, bytes);
	}
}

static void set_wait(struct hami_slot *s, uint32_t why)
{
	__atomic_store_n(&s->park_wait, why, __ATOMIC_RELEASE);
	if (why != last_wait_logged && why != HAMI_PARK_WAIT_NONE)
		hami_log(HAMI_LOG_WARN, "the parked GPU state waits for room %s to come back",
			 why == HAMI_PARK_WAIT_SLICE ? "under the slice's memory cap" : "on the GPU");
	last_wait_logged = why;
}

/* Whether the wait for GPU room goes on: the resume is still wanted. It is
 * also the parking thread's heartbeat while it waits. */
static int resume_wanted(void)
{
	struct hami_slot *s = __atomic_load_n(&hami_parkable_slot, __ATOMIC_ACQUIRE);
	if (!s)
		return 0;
	__atomic_store_n(&s->active_unix_ns, hami_now_ns(), __ATOMIC_RELAXED);
	return __atomic_load_n(&s->park_wanted, __ATOMIC_ACQUIRE) != 0;
}

/* The slice device hami-park restore found short of free memory ("GPU <uuid>
 * has N bytes free, M needed"), else the first with parked bytes; -1: none. */
static int short_device(struct hami_slot *s, const char *answer)
{
	struct hami_slice_file *f = hami_slice();
	const char *at = strstr(answer, "GPU ");
	for (int d = 0; f && at && d < HAMI_SLICE_MAX_DEVICES; d++) {
		size_t n = strnlen(f->device[d].uuid, HAMI_SLICE_UUID_LEN);
		if (n && strncmp(at + 4, f->device[d].uuid, n) == 0 && at[4 + n] == ' ' &&
		    __atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE))
			return d;
	}
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		if (__atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE))
			return d;
	return -1;
}

/*
 * The room ledger's word on a resume of parked[] (no NVML here: in a parked
 * process it blocks). *keep*: per device, what the restore must leave free
 * (the reserve and others' grants). -1 with *wait_on* set when the resume
 * must wait its turn on that device first: others wait for room there, and
 * this slice is beyond its guarantee.
 */
static int resume_turn(struct hami_slot *s, uint64_t keep[HAMI_SLICE_MAX_DEVICES], int *wait_on)
{
	struct hami_slice_file *f = hami_slice();
	for (int d = 0; f && d < HAMI_SLICE_MAX_DEVICES; d++) {
		struct hami_ledger_gpu g;
		keep[d] = 0;
		if (!__atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE) || hami_ledger_gpu_now(f->device[d].uuid, &g) < 0 ||
		    !g.turns)
			continue;
		uint64_t mine = hami_ledger_granted(&g, room.ticket);
		if (!mine && g.waiting && !hami_within_guarantee(d)) {
			snprintf(room.turn, sizeof(room.turn), "others wait for room on it first");
			*wait_on = d;
			return -1;
		}
		uint64_t others = g.granted_bytes > mine ? g.granted_bytes - mine : 0;
		keep[d] = g.reserve_bytes + others;
	}
	return 0;
}

/*
 * Whether GPU sdev has bytes for a fast resume now: its turn, and room beyond
 * what the room ledger keeps for parks and for others, as an allocation
 * (room_ledger.c: this process is not locked, so NVML answers it). 1: room, or
 * no way to tell (the driver's own refusal then says).
 */
static int gpu_has_room(int sdev, uint64_t bytes)
{
	if (hami_room_turn_now(&room, sdev, bytes) != CUDA_SUCCESS)
		return 0;
	uint64_t free_bytes;
	return hami_fast_free_memory(sdev, &free_bytes) < 0 || free_bytes >= bytes;
}

/* Still parked, nothing reserved: the broker may park others for it, never
 * this process. Its OK: try again at once. */
static void wait_for_gpu(struct hami_slot *s, int short_of)
{
	next_try_ns = hami_monotonic_ns() + RETRY_NS;
	if (short_of >= 0 &&
	    hami_room_wait(&room, short_of, __atomic_load_n(&s->parked[short_of], __ATOMIC_ACQUIRE), NULL,
			   resume_wanted))
		next_try_ns = 0;
}

/* The same as the end of a restore, for a process that parked itself. */
static void resumed(struct hami_slot *s);

/* A process that parked itself brings its memory back itself: room on each
 * GPU first, then the blocks mapped again and their bytes copied back. */
static void fast_resume(struct hami_slot *s)
{
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		if (!__atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE) || gpu_has_room(d, hami_fast_parked_bytes(d)))
			continue;
		unreserve(s, HAMI_SLICE_MAX_DEVICES);
		set_wait(s, HAMI_PARK_WAIT_GPU);
		wait_for_gpu(s, d);
		return;
	}
	__atomic_store_n(&s->park_state, HAMI_PARK_RESUMING, __ATOMIC_RELEASE);
	CUresult rc = hami_fast_resume();
	if (rc != CUDA_SUCCESS) {
		unreserve(s, HAMI_SLICE_MAX_DEVICES);
		__atomic_store_n(&s->park_error, rc, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_state, HAMI_PARK_PARKED, __ATOMIC_RELEASE);
		hami_log(rc == CUDA_ERROR_OUT_OF_MEMORY ? HAMI_LOG_INFO : HAMI_LOG_ERROR,
			 "bringing the parked memory back failed (error %d); it stays in host memory and is tried "
			 "again", rc);
		set_wait(s, rc == CUDA_ERROR_OUT_OF_MEMORY ? HAMI_PARK_WAIT_GPU : HAMI_PARK_WAIT_NONE);
		if (rc == CUDA_ERROR_OUT_OF_MEMORY)
			wait_for_gpu(s, short_device(s, ""));
		else
			next_try_ns = hami_monotonic_ns() + RETRY_NS;
		return;
	}
	fast_parked = 0;
	__atomic_store_n(&s->park_fast, HAMI_FAST_NONE, __ATOMIC_RELAXED);
	resumed(s);
}

static void resume(struct hami_slot *s)
{
	uint64_t now = hami_monotonic_ns();
	if (now < next_try_ns)
		return;
	int d = 0;
	for (; d < HAMI_SLICE_MAX_DEVICES; d++) {
		uint64_t bytes = __atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE);
		if (bytes && hami_charge(d, bytes, NULL) != CUDA_SUCCESS)
			break;
	}
	if (d < HAMI_SLICE_MAX_DEVICES) {
		unreserve(s, d);
		set_wait(s, HAMI_PARK_WAIT_SLICE);
		return;
	}
	if (fast_parked) {
		fast_resume(s);
		return;
	}
	uint64_t keep[HAMI_SLICE_MAX_DEVICES];
	int turn_on = -1;
	if (resume_turn(s, keep, &turn_on) < 0) {
		/* Others were first: the broker serves this resume in its turn. */
		unreserve(s, HAMI_SLICE_MAX_DEVICES);
		set_wait(s, HAMI_PARK_WAIT_GPU);
		wait_for_gpu(s, turn_on);
		return;
	}
	/* Each GPU must have the bytes free beyond what is kept: hami-park asks
	 * NVML, which blocks here. */
	struct hami_slice_file *f = hami_slice();
	char wants[HAMI_SLICE_MAX_DEVICES][HAMI_SLICE_UUID_LEN + 48];
	char *extra[HAMI_SLICE_MAX_DEVICES + 1] = { NULL };
	int n = 0;
	for (d = 0; f && d < HAMI_SLICE_MAX_DEVICES; d++) {
		uint64_t bytes = __atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE);
		if (!bytes)
			continue;
		snprintf(wants[n], sizeof(wants[n]), "%.*s=%llu+%llu", HAMI_SLICE_UUID_LEN - 1, f->device[d].uuid,
			 (unsigned long long)bytes, (unsigned long long)keep[d]);
		extra[n] = wants[n];
		n++;
	}
	__atomic_store_n(&s->park_state, HAMI_PARK_RESUMING, __ATOMIC_RELEASE);
	char answer[512];
	int rc = run_park_tool("restore", extra, answer, sizeof(answer));
	if (rc != CUDA_SUCCESS) {
		unreserve(s, HAMI_SLICE_MAX_DEVICES);
		__atomic_store_n(&s->park_error, rc, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_state, HAMI_PARK_PARKED, __ATOMIC_RELEASE);
		set_wait(s, rc == CUDA_ERROR_OUT_OF_MEMORY ? HAMI_PARK_WAIT_GPU : HAMI_PARK_WAIT_NONE);
		wait_for_gpu(s, rc == CUDA_ERROR_OUT_OF_MEMORY ? short_device(s, answer) : -1);
		return;
	}
	resumed(s);
}

static void resumed(struct hami_slot *s)
{
	hami_room_end(&room);
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		__atomic_store_n(&s->parked[d], 0, __ATOMIC_RELAXED);
	moved = 0;
	last_wait_logged = HAMI_PARK_WAIT_NONE;
	__atomic_store_n(&s->park_wait, HAMI_PARK_WAIT_NONE, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_error, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_reason, HAMI_PARK_REASON_NONE, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_unix_ns, hami_now_ns(), __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_wanted, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELEASE);
	hami_log(HAMI_LOG_INFO, "resumed: this process's GPU memory is back on the GPU");
}

/* ---- the fast park ------------------------------------------------------------- */

/* A parker asks this process to park itself (park_state PARKING, the parker
 * holding its lock): refuse at once when it cannot, else move its memory. */
static void fast_answer(struct hami_slot *s)
{
	uint32_t asked = HAMI_FAST_ASKED;
	const char *why = hami_fast_park_refusal();
	if (why) {
		hami_log(HAMI_LOG_INFO, "asked to park itself: it cannot (%s); the parker checkpoints it", why);
		__atomic_compare_exchange_n(&s->park_fast, &asked, HAMI_FAST_REFUSED, 0, __ATOMIC_ACQ_REL,
					    __ATOMIC_ACQUIRE);
		return;
	}
	if (!__atomic_compare_exchange_n(&s->park_fast, &asked, HAMI_FAST_TAKEN, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return; /* withdrawn meanwhile */
	CUresult error;
	int outcome = hami_fast_park(s, &error);
	if (outcome == HAMI_FAST_DONE) {
		moved = 1;
		fast_parked = 1;
		hami_log(HAMI_LOG_INFO, "parked: this process moved its GPU memory to host memory itself");
	} else if (outcome == HAMI_FAST_FAILED) {
		__atomic_store_n(&s->park_error, error, __ATOMIC_RELAXED);
		hami_log(HAMI_LOG_WARN, "parking itself failed half-way (error %d); nothing is lost, it runs on "
			 "unparked", error);
	}
	if (outcome == HAMI_FAST_WITHDRAWN) {
		uint32_t w = HAMI_FAST_WITHDRAWN;
		__atomic_compare_exchange_n(&s->park_fast, &w, HAMI_FAST_NONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		return;
	}
	__atomic_store_n(&s->park_fast, (uint32_t)outcome, __ATOMIC_RELEASE);
}

void hami_park_tick(void)
{
	struct hami_slot *s = __atomic_load_n(&hami_parkable_slot, __ATOMIC_ACQUIRE);
	if (!s)
		return;
	/* The heartbeat a parker checks: this thread, which resumes, is running. */
	__atomic_store_n(&s->active_unix_ns, hami_now_ns(), __ATOMIC_RELAXED);
	uint64_t calls;
	int inside = hami_threads_in_driver(&calls);
	if (calls != calls_seen) {
		calls_seen = calls;
		__atomic_store_n(&s->gpu_active_unix_ns, hami_now_ns(), __ATOMIC_RELAXED);
	}
	uint32_t state = __atomic_load_n(&s->park_state, __ATOMIC_ACQUIRE);
	if (state == HAMI_PARK_RUNNING) {
		hami_room_end(&room); /* back on the GPU however it came (a no-op without a wait) */
		return;
	}
	if (inside)
		__atomic_store_n(&s->park_wanted, 1, __ATOMIC_RELEASE);
	int parker = hami_slot_byte_locked(slot_index_of(s), offsetof(struct hami_slot, park_state));
	uint32_t fast = __atomic_load_n(&s->park_fast, __ATOMIC_ACQUIRE);
	if (fast == HAMI_FAST_WITHDRAWN) { /* the parker checkpoints instead: the request is over */
		__atomic_compare_exchange_n(&s->park_fast, &fast, HAMI_FAST_NONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		fast = HAMI_FAST_NONE;
	}
	if (state == HAMI_PARK_PARKING && fast == HAMI_FAST_ASKED && parker == 1) {
		fast_answer(s);
		return;
	}
	if (state == HAMI_PARK_PARKING && fast == HAMI_FAST_DONE && parker == 0) {
		/* It parked itself and its parker died before saying so: parked all the same. */
		__atomic_store_n(&s->park_unix_ns, hami_now_ns(), __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_state, HAMI_PARK_PARKED, __ATOMIC_RELEASE);
		return;
	}
	if (state == HAMI_PARK_PARKING && parker == 0) {
		__atomic_store_n(&s->park_fast, HAMI_FAST_NONE, __ATOMIC_RELAXED);
		/* The parker died half-way: never leave the process locked. */
		char answer[512];
		hami_log(HAMI_LOG_WARN, "the process that was parking this one is gone: undoing its work");
		if (run_park_tool("recover", NULL, answer, sizeof(answer)) == CUDA_SUCCESS) {
			int parked = strstr(answer, "checkpointed") != NULL;
			if (!parked) /* a reason the dead parker may have left */
				__atomic_store_n(&s->park_reason, HAMI_PARK_REASON_NONE, __ATOMIC_RELAXED);
			__atomic_store_n(&s->park_state, parked ? HAMI_PARK_PARKED : HAMI_PARK_RUNNING,
					 __ATOMIC_RELEASE);
		}
		return;
	}
	if (state != HAMI_PARK_PARKED || parker != 0)
		return;
	if (!moved)
		move_charge_out(s);
	if (__atomic_load_n(&s->park_wanted, __ATOMIC_ACQUIRE))
		resume(s);
	else
		hami_room_end(&room); /* the wish was taken back: no wait for room either */
}

/*
 * The parking thread: the housekeeper's NVML calls block while the process is
 * locked, so parking has a thread of its own that calls neither CUDA nor NVML
 * while the driver holds the process, and so runs all through a park: it moves
 * the charge, and it resumes. A process that parks itself is never locked:
 * then this thread moves the memory through the driver, and asks NVML for room.
 */
static void *parking_thread(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct timespec ts = { 0, TICK_NS };
		nanosleep(&ts, NULL);
		hami_park_tick();
	}
	return NULL;
}

void hami_park_start(void)
{
	if (__atomic_exchange_n(&thread_started, 1, __ATOMIC_ACQ_REL))
		return;
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, HAMI_DRIVER_THREAD_STACK); /* the fast park calls the driver here */
	if (pthread_create(&t, &attr, parking_thread, NULL) != 0) {
		hami_log(HAMI_LOG_WARN, "cannot start the parking thread: this process cannot be resumed, "
			 "so it is never parked");
		__atomic_store_n(&hami_parkable_slot, NULL, __ATOMIC_RELEASE);
	}
	pthread_attr_destroy(&attr);
}

/* A child of fork has none of its parent's GPU state, slot, marks or threads. */
void hami_park_after_fork(void)
{
	thread_started = 0;
	__atomic_store_n(&hami_parkable_slot, NULL, __ATOMIC_RELEASE);
	moved = 0;
	fast_parked = 0;
	calls_seen = 0;
	next_try_ns = 0;
	if (room.fd >= 0)
		close(room.fd); /* the parent's grant is the parent's */
	room = (struct hami_room)HAMI_ROOM_INIT;
	struct hami_call_mark *mine = hami_thread_mark;
	for (int i = 0; i < MAX_MARKS; i++)
		if (&marks[i] != mine)
			mark_free(&marks[i]);
	if (mine)
		__atomic_store_n(&mine->in_call, 0, __ATOMIC_RELAXED);
}
