/*
 * The memory broker's protocol, the library's side (docs/parking.md). A Unix
 * stream socket, one request per connection, one ASCII line each way:
 *
 *   ROOM <gpu uuid> <bytes> <since_unix_ns>\n   the request
 *   BUSY <position>\n        queued behind others; the final answer follows
 *   OK <bytes made free> [<ticket>]\n
 *                            room was made (or was there): try the driver again; the
 *                            ticket names its grant in the room ledger, held while
 *                            the connection stays open
 *   NO <why>\n               nothing can be parked now
 *
 * Nothing here calls CUDA or NVML, takes a library mutex or raises SIGPIPE.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "hami.h"

#define POLL_SLICE_MS 250 /* go_on() is asked this often while an answer is awaited */
#define LINE_MAX_BYTES 512

/*
 * Connect to the broker's socket within timeout_ns (a full listen queue makes
 * connect(2) wait; SO_SNDTIMEO bounds it). A socket, or -1 when no broker
 * takes the connection: no such file, nobody listening, no permission, or
 * too slow.
 */
int hami_broker_connect(const char *path, uint64_t timeout_ns)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	size_t len = path ? strlen(path) : 0;
	if (!len || len >= sizeof(addr.sun_path))
		return -1;
	memcpy(addr.sun_path, path, len);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (timeout_ns < 1000000)
		timeout_ns = 1000000;
	struct timeval tv = { .tv_sec = (time_t)(timeout_ns / 1000000000ull),
			      .tv_usec = (suseconds_t)(timeout_ns % 1000000000ull / 1000) };
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc;
	do
		rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int send_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		buf += w;
		len -= (size_t)w;
	}
	return 0;
}

/* One answer line (NUL-terminated, no newline): 1 final (OK/NO, *why* for NO,
 * *ticket* for OK), 0 BUSY. */
static int read_line(const char *line, enum hami_broker_answer *out, uint64_t *ticket, char *why, size_t cap)
{
	if (strncmp(line, "BUSY", 4) == 0 && (line[4] == ' ' || line[4] == '\0'))
		return 0;
	if (strncmp(line, "OK", 2) == 0 && (line[2] == ' ' || line[2] == '\0')) {
		unsigned long long made, t;
		*ticket = sscanf(line + 2, "%llu %llu", &made, &t) == 2 ? (uint64_t)t : 0;
		*out = HAMI_BROKER_OK;
		return 1;
	}
	*out = HAMI_BROKER_NO;
	if (strncmp(line, "NO", 2) == 0 && (line[2] == ' ' || line[2] == '\0'))
		snprintf(why, cap, "%s", line[2] ? line + 3 : "no reason given");
	else
		snprintf(why, cap, "an answer this library does not know: \"%.80s\"", line);
	return 1;
}

/*
 * Send "ROOM ..." on fd and wait for the final answer until deadline
 * (monotonic ns). *answered is set once any line came back.
 */
int hami_broker_request(int fd, const char *uuid, uint64_t bytes, uint64_t since_ns, uint64_t deadline,
			int (*go_on)(void), int *answered, uint64_t *ticket, char *why, size_t cap)
{
	char buf[LINE_MAX_BYTES];
	int n = snprintf(buf, sizeof(buf), "ROOM %s %llu %llu\n", uuid, (unsigned long long)bytes,
			 (unsigned long long)since_ns);
	if (n <= 0 || (size_t)n >= sizeof(buf) || send_all(fd, buf, (size_t)n) < 0)
		return HAMI_BROKER_LOST;
	size_t got = 0;
	sigset_t mask; /* only Jupyter's interrupt ends the wait (room.c) */
	hami_wait_mask(&mask);
	for (;;) {
		uint64_t now = hami_monotonic_ns();
		if (now >= deadline)
			return HAMI_BROKER_LATE;
		if (go_on && !go_on())
			return HAMI_BROKER_STOPPED;
		uint64_t left_ns = deadline - now, slice_ns = (uint64_t)POLL_SLICE_MS * 1000000ull;
		if (left_ns > slice_ns)
			left_ns = slice_ns;
		struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)left_ns };
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = ppoll(&p, 1, &ts, &mask);
		if (r < 0)
			return errno == EINTR ? HAMI_BROKER_INTERRUPTED : HAMI_BROKER_LOST;
		if (r <= 0)
			continue;
		ssize_t k = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0)
			return HAMI_BROKER_LOST; /* closed before a final answer */
		got += (size_t)k;
		buf[got] = '\0';
		char *nl;
		while ((nl = memchr(buf, '\n', got)) != NULL) {
			*nl = '\0';
			if (nl > buf && nl[-1] == '\r')
				nl[-1] = '\0';
			*answered = 1;
			enum hami_broker_answer a;
			if (read_line(buf, &a, ticket, why, cap))
				return a;
			size_t used = (size_t)(nl - buf) + 1;
			memmove(buf, nl + 1, got - used);
			got -= used;
			buf[got] = '\0';
		}
		if (got == sizeof(buf) - 1) {
			*answered = 1;
			snprintf(why, cap, "an answer longer than %d bytes", LINE_MAX_BYTES);
			return HAMI_BROKER_NO;
		}
	}
}
