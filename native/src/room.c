/*
 * Waiting for room on the GPU (docs/preload.md, "When the GPU is full"). The
 * slice had room for an allocation and reserved it, but the driver said out of
 * memory: other slices' work fills the GPU. The node's memory broker can park
 * idle kernels to make room, so the waiting thread asks it (broker_client.c)
 * and, on its OK, the caller tries the driver again; on its NO it asks again
 * until HAMI_ROOM_WAIT runs out. No broker (nothing takes the connection):
 * out of memory at once, as without one.
 *
 * While a thread waits, the process's slot says so (room_wait_*: the oldest
 * wait of the process), for the views and for a restarted broker's queue.
 *
 * The broker's OK comes with a grant (a ticket in the room ledger): the room it
 * made is this process's while the connection stays open, so the connection
 * is kept until the wait ends (hami_room_end) or asks again, and the take
 * that follows passes the ledger's rule with that ticket (room_ledger.c).
 *
 * Jupyter's interrupt (SIGINT, which Python handles) ends the wait: every
 * sleep and poll here runs with every other signal blocked (hami_wait_mask),
 * so a SIGCHLD from a DataLoader worker that exits, or any other signal the
 * program handles, waits for the sleep's end instead of ending the wait; a
 * SIGINT returns EINTR, the wait gives up with out of memory, and so does any
 * wait the same process begins within INTERRUPT_HOLD_NS of it (a framework
 * retries a refused allocation at once, after freeing its caches), so the
 * cell ends and Python raises. Nothing here calls CUDA or NVML, and no
 * library mutex is held while waiting (hami_room_lock only guards the table
 * of waits, for microseconds).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

#define CONNECT_TIMEOUT_NS 1000000000ull /* a broker that takes longer to accept is not there */
#define ASK_AGAIN_NS 1000000000ull       /* after a NO */
#define RECONNECT_NS 250000000ull        /* after a broker that answered before went away */
#define MAX_WAITS 64                     /* threads waiting at once that the slot can show */
#define NO_BROKER_REPORT_NS 1000000000ull /* "no memory broker answered": once a second at most */
#define INTERRUPT_HOLD_NS 1000000000ull  /* after an interrupt, new waits give up at once this long */

pthread_mutex_t hami_room_lock = PTHREAD_MUTEX_INITIALIZER;

/* The process's waits, for the slot's fields. Guarded by hami_room_lock. */
static struct {
	int used;
	int sdev;
	uint64_t bytes;
	uint64_t since_ns;
} waits[MAX_WAITS];

/* Show the oldest wait in the slot (or none). Called with hami_room_lock held. */
static void show_oldest(void)
{
	struct hami_slice_file *f = hami_slice();
	int i = hami_slot();
	if (!f || i < 0)
		return;
	struct hami_slot *s = &f->slot[i];
	int oldest = -1;
	for (int k = 0; k < MAX_WAITS; k++)
		if (waits[k].used && (oldest < 0 || waits[k].since_ns < waits[oldest].since_ns))
			oldest = k;
	/* since last when set, first when cleared: a reader that sees it nonzero sees the rest */
	__atomic_store_n(&s->room_wait_since_unix_ns, 0, __ATOMIC_RELEASE);
	if (oldest < 0)
		return;
	__atomic_store_n(&s->room_wait_device, (uint32_t)waits[oldest].sdev, __ATOMIC_RELAXED);
	__atomic_store_n(&s->room_wait_bytes, waits[oldest].bytes, __ATOMIC_RELAXED);
	__atomic_store_n(&s->room_wait_since_unix_ns, waits[oldest].since_ns, __ATOMIC_RELEASE);
}

/* The wait's size changed (a wait for the driver's own memory asks more each time). */
static void table_resize(int entry, uint64_t bytes)
{
	if (entry < 0 || entry >= MAX_WAITS)
		return;
	pthread_mutex_lock(&hami_room_lock);
	if (waits[entry].used && waits[entry].bytes != bytes) {
		waits[entry].bytes = bytes;
		show_oldest();
	}
	pthread_mutex_unlock(&hami_room_lock);
}

static int table_add(int sdev, uint64_t bytes, uint64_t since_ns)
{
	int entry = -1;
	pthread_mutex_lock(&hami_room_lock);
	for (int k = 0; k < MAX_WAITS && entry < 0; k++)
		if (!waits[k].used) {
			waits[k].used = 1;
			waits[k].sdev = sdev;
			waits[k].bytes = bytes;
			waits[k].since_ns = since_ns;
			entry = k;
		}
	show_oldest();
	pthread_mutex_unlock(&hami_room_lock);
	return entry; /* -1: the table is full; the wait goes on unseen */
}

static void table_remove(int entry)
{
	pthread_mutex_lock(&hami_room_lock);
	if (entry >= 0 && entry < MAX_WAITS)
		waits[entry].used = 0;
	show_oldest();
	pthread_mutex_unlock(&hami_room_lock);
}

/* A child of fork has none of its parent's waiting threads. */
void hami_room_after_fork(void)
{
	memset(waits, 0, sizeof(waits));
}

/* When the latest wait of this process was interrupted (monotonic ns; 0: never). */
static uint64_t last_interrupt_ns;

static void note_interrupt(void)
{
	__atomic_store_n(&last_interrupt_ns, hami_monotonic_ns(), __ATOMIC_RELAXED);
}

/* Whether a wait beginning now follows an interrupt closely enough to give up at once. */
static int just_interrupted(void)
{
	uint64_t t = __atomic_load_n(&last_interrupt_ns, __ATOMIC_RELAXED);
	return t && hami_monotonic_ns() - t < INTERRUPT_HOLD_NS;
}

void hami_wait_mask(sigset_t *mask)
{
	sigset_t now;
	pthread_sigmask(SIG_BLOCK, NULL, &now);
	sigfillset(mask);
	if (!sigismember(&now, SIGINT))
		sigdelset(mask, SIGINT);
}

int hami_pause_ns(uint64_t ns, uint64_t deadline)
{
	uint64_t now = hami_monotonic_ns();
	if (deadline && now >= deadline)
		return 0;
	if (deadline && ns > deadline - now)
		ns = deadline - now;
	sigset_t mask;
	hami_wait_mask(&mask);
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull) };
	return ppoll(NULL, 0, &ts, &mask) < 0 && errno == EINTR ? -1 : 0;
}

/* The broker's grant is given back: its connection closes. */
static void drop_lease(struct hami_room *w)
{
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	w->ticket = 0;
}

static uint64_t last_no_broker_report;

/* Whether "no memory broker answered" may be said now: a program that keeps
 * meeting a full GPU without a broker gets it once a second, as charge.c's
 * out-of-memory line. */
static int no_broker_report_due(void)
{
	return hami_report_due(&last_no_broker_report, NO_BROKER_REPORT_NS);
}

/* The wait ends without room: one line saying why (once per wait). */
static int give_up(struct hami_room *w, const char *gpu, uint64_t bytes, const char *what)
{
	if (!w->told_end) {
		char size[32];
		const char *for_what = what ? what : "this process's parked memory";
		hami_human(bytes, size);
		w->told_end = 1;
		if (w->interrupted) {
			hami_log(HAMI_LOG_WARN, "the wait for room on %s for %s (%s) was interrupted: out of "
				 "memory; nothing of it stays reserved", gpu, size, for_what);
		} else if (!w->connected) {
			if (no_broker_report_due())
				hami_log(HAMI_LOG_ERROR, "%s has no room for %s (%s) and no memory broker answered "
					 "(is hami-jupyter broker running?): out of memory", gpu, size, for_what);
		} else if (w->why[0])
			hami_log(HAMI_LOG_ERROR, "%s still has no room for %s (%s) after %u s: the memory "
				 "broker found nothing to park: %s; out of memory", gpu, size, for_what,
				 hami_config()->room_wait_s, w->why);
		else if (w->answered)
			hami_log(HAMI_LOG_ERROR, "%s still has no room for %s (%s) after %u s: the memory "
				 "broker made none in time; out of memory", gpu, size, for_what,
				 hami_config()->room_wait_s);
		else
			hami_log(HAMI_LOG_ERROR, "%s still has no room for %s (%s) after %u s: the memory "
				 "broker took the request but never answered; out of memory", gpu, size,
				 for_what, hami_config()->room_wait_s);
	}
	w->deadline = 0;
	return 0;
}

/* A signal ended the wait: out of memory, said once, and new waits give up for a moment. */
static int interrupted(struct hami_room *w, const char *gpu, uint64_t bytes, const char *what)
{
	note_interrupt();
	w->interrupted = 1;
	return give_up(w, gpu, bytes, what);
}

/*
 * The driver refused *bytes* on slice device sdev that the slice had
 * reserved: ask the broker for room. 1: room was made, try the driver again
 * (call again if it still refuses: the same wait goes on, its since kept);
 * 0: give up (the line saying why is written; go_on() returning 0 stops the
 * wait quietly). hami_room_end() closes the wait either way.
 */
int hami_room_wait(struct hami_room *w, int sdev, uint64_t bytes, const char *what, int (*go_on)(void))
{
	const struct hami_config *c = hami_config();
	struct hami_slice_file *f = hami_slice();
	if (!c->room_wait_s || !f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES || !bytes)
		return 0;
	char uuid[HAMI_SLICE_UUID_LEN], gpu[HAMI_SLICE_UUID_LEN + 8];
	snprintf(uuid, sizeof(uuid), "%.*s", HAMI_SLICE_UUID_LEN - 1, f->device[sdev].uuid);
	hami_gpu_name(sdev, gpu, sizeof(gpu));
	if (!w->since_ns) {
		w->since_ns = hami_now_ns();
		w->entry = table_add(sdev, bytes, w->since_ns);
		if (just_interrupted()) { /* the same interrupt: out of memory at once, said already */
			w->interrupted = 1;
			w->told_end = 1;
			return 0;
		}
	} else {
		table_resize(w->entry, bytes);
	}
	if (!w->deadline)
		w->deadline = hami_monotonic_ns() + (uint64_t)c->room_wait_s * 1000000000ull;
	drop_lease(w); /* the room of an earlier OK did not serve: asked again */
	for (;;) {
		uint64_t now = hami_monotonic_ns();
		if (now >= w->deadline)
			return give_up(w, gpu, bytes, what);
		if (go_on && !go_on())
			return 0;
		uint64_t left = w->deadline - now;
		int fd = hami_broker_connect(c->broker_socket, left < CONNECT_TIMEOUT_NS ? left : CONNECT_TIMEOUT_NS);
		if (fd < 0) {
			if (!w->connected)
				return give_up(w, gpu, bytes, what); /* no broker: as without one */
			if (hami_pause_ns(RECONNECT_NS, w->deadline) < 0) /* it answered before: restarting? */
				return interrupted(w, gpu, bytes, what);
			continue;
		}
		w->connected = 1;
		if (!w->told_start) {
			char size[32];
			w->told_start = 1;
			if (w->turn[0])
				hami_log(HAMI_LOG_WARN, "%s is tight (%s): %s (%s) waits its turn, up to %u s, "
					 "for the memory broker", gpu, w->turn, hami_human(bytes, size),
					 what ? what : "this process's parked memory", c->room_wait_s);
			else
				hami_log(HAMI_LOG_WARN, "%s has no room for %s now (%s): waiting up to %u s while "
					 "the memory broker parks idle kernels of this GPU", gpu, hami_human(bytes, size),
					 what ? what : "this process's parked memory", c->room_wait_s);
		}
		char why[sizeof(w->why)] = "";
		uint64_t ticket = 0;
		int answer = hami_broker_request(fd, uuid, bytes, w->since_ns, w->deadline, go_on, &w->answered,
						 &ticket, why, sizeof(why));
		if (answer == HAMI_BROKER_OK) { /* the room is ours while the connection is open */
			w->fd = fd;
			w->ticket = ticket;
			w->turn[0] = '\0';
			return 1;
		}
		close(fd);
		switch (answer) {
		case HAMI_BROKER_NO:
			memcpy(w->why, why, sizeof(w->why));
			if (!w->told_no) {
				w->told_no = 1;
				hami_log(HAMI_LOG_WARN, "%s: the memory broker can make no room yet (%s); asking "
					 "again every second", gpu, why);
			}
			if (hami_pause_ns(ASK_AGAIN_NS, w->deadline) < 0)
				return interrupted(w, gpu, bytes, what);
			break;
		case HAMI_BROKER_LOST:
			if (hami_pause_ns(RECONNECT_NS, w->deadline) < 0) /* asked again with the same since */
				return interrupted(w, gpu, bytes, what);
			break;
		case HAMI_BROKER_INTERRUPTED:
			return interrupted(w, gpu, bytes, what);
		case HAMI_BROKER_STOPPED:
			return 0;
		default: /* LATE: the loop's first check gives up */
			break;
		}
	}
}

int hami_room_again(struct hami_room *w, CUresult rc, int sdev, uint64_t bytes, const char *what)
{
	if (rc == CUDA_ERROR_OUT_OF_MEMORY)
		return bytes && hami_room_wait(w, sdev, bytes, what, NULL);
	if (rc == CUDA_ERROR_DEVICE_UNAVAILABLE)
		return hami_busy_wait(&w->busy, sdev, -1, what);
	return 0;
}

/* The wait is over (room came, or not): the slot stops showing it, the grant goes back. */
void hami_room_end(struct hami_room *w)
{
	drop_lease(w);
	if (!w->since_ns) {
		*w = (struct hami_room)HAMI_ROOM_INIT;
		return;
	}
	if (w->told_start && !w->told_end)
		hami_log(HAMI_LOG_INFO, "the wait for room on the GPU is over: the memory broker made room");
	table_remove(w->entry);
	*w = (struct hami_room)HAMI_ROOM_INIT;
}
