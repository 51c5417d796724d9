/*
 * Device memory contents of the simulated GPU (libcuda.so.1 only).
 *
 * A process's device memory lives in one sparse file beside the state file,
 * "<state>.mem/<entry>", which other processes can reach too (a checkpoint is
 * taken by another process). Each allocation owns an extent of the file; the
 * process maps an extent MAP_SHARED only when a copy first touches it, and
 * punches the extent's hole on free if anything was written there. Untouched
 * memory costs nothing: no blocks, no mapping, not even the file.
 *
 * Extents are page-aligned and reused (first fit), so the file stays about as
 * large as the memory the process holds at its peak.
 *
 * A checkpoint (called by another process, while the owner is locked: none of
 * its calls is running) copies the file's data to "<state>.ckpt/<entry>", the
 * owner's host copy, and punches the whole file: the owner's mappings stay
 * valid and read zeros, as a bug that reads device memory while checkpointed
 * should. A restore copies the data back and removes the host copy. The
 * device charges move with them (sim_park, sim_unpark).
 *
 * Who may call them on whom is the real driver's rule as far as it is known
 * (docs/parking.md, "Who may park whom"): the driver reaches its target
 * through /proc, so the kernel's rule for looking into another process
 * holds: the caller acts on a process of its own user (the target's real,
 * effective and saved uids and gids are all the caller's), or is root.
 * Anything else is refused (SIM_EPERM) and changes nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim_mem.h"
#include "sim_state.h"

#define GROW_STEP (1ull << 30) /* the file grows in these (sparse: free) */

struct hole {
	uint64_t off, len;
};

/* The owner's side. Callers serialize (libcuda's C.mu). */
static struct {
	int fd;        /* the backing file, opened at the first mapping */
	uint64_t size; /* its size */
	uint64_t end;  /* every extent lies below */
	struct hole *holes; /* free extents below end, sorted, never adjacent */
	size_t nholes, cap;
	uint64_t page;
	int warned;
} M = {.fd = -1};

static uint64_t page(void)
{
	if (!M.page) {
		long p = sysconf(_SC_PAGESIZE);
		M.page = p > 0 ? (uint64_t)p : 4096;
	}
	return M.page;
}

/* SIZE rounded up to whole pages, 0 when that overflows. */
static uint64_t span(uint64_t size)
{
	uint64_t p = page();
	return size > UINT64_MAX - (p - 1) ? 0 : (size + p - 1) / p * p;
}

int sim_mem_reserve(uint64_t size, uint64_t *off)
{
	uint64_t len = span(size);
	if (!len)
		return -1;
	for (size_t i = 0; i < M.nholes; i++) {
		struct hole *h = &M.holes[i];
		if (h->len < len)
			continue;
		*off = h->off;
		h->off += len;
		h->len -= len;
		if (!h->len) {
			memmove(h, h + 1, (M.nholes - i - 1) * sizeof(*h));
			M.nholes--;
		}
		return 0;
	}
	if (len > UINT64_MAX - M.end || M.end + len > (uint64_t)INT64_MAX)
		return -1;
	*off = M.end;
	M.end += len;
	return 0;
}

/* Give [OFF, OFF + LEN) back to the free extents, merged with neighbours. */
static void hole_add(uint64_t off, uint64_t len)
{
	size_t i = 0;
	while (i < M.nholes && M.holes[i].off < off)
		i++;
	int prev = i > 0 && M.holes[i - 1].off + M.holes[i - 1].len == off;
	int next = i < M.nholes && off + len == M.holes[i].off;
	if (prev && next) {
		M.holes[i - 1].len += len + M.holes[i].len;
		memmove(&M.holes[i], &M.holes[i + 1], (M.nholes - i - 1) * sizeof(M.holes[0]));
		M.nholes--;
		i--;
	} else if (prev) {
		M.holes[--i].len += len;
	} else if (next) {
		M.holes[i].off = off;
		M.holes[i].len += len;
	} else {
		if (M.nholes == M.cap) {
			size_t cap = M.cap ? M.cap * 2 : 64;
			struct hole *h = realloc(M.holes, cap * sizeof(*h));
			if (!h)
				return; /* the extent is never reused: only file space is lost */
			M.holes = h;
			M.cap = cap;
		}
		memmove(&M.holes[i + 1], &M.holes[i], (M.nholes - i) * sizeof(M.holes[0]));
		M.holes[i] = (struct hole){off, len};
		M.nholes++;
	}
	/* A free extent at the top just lowers the top. */
	if (M.holes[i].off + M.holes[i].len == M.end) {
		M.end = M.holes[i].off;
		M.nholes--;
	}
}

void sim_mem_release(uint64_t off, uint64_t size, void *host, int dirty)
{
	uint64_t len = span(size);
	if (host)
		munmap(host, size);
	/* Written bytes must not reach the extent's next owner. Where holes
	 * cannot be punched the extent is left unused instead. */
	if (dirty && (M.fd < 0 || fallocate(M.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0))
		return;
	hole_add(off, len);
}

static void warn(const char *what, const char *path)
{
	if (M.warned)
		return;
	M.warned = 1;
	fprintf(stderr, "hami-sim: device memory contents: %s %s: %s\n", what, path, strerror(errno));
}

/* Our backing file, created empty: a file left at our entry's name belonged
 * to a process that is gone. */
static int backing_open(void)
{
	char path[PATH_MAX + 32];
	int self = sim_self();
	if (self < 0 || sim_side_path("mem", (unsigned)self, path, sizeof(path)) != SIM_OK)
		return -1;
	char *slash = strrchr(path, '/');
	*slash = 0;
	if (sim_side_mkdir(path) < 0) {
		warn("cannot create", path);
		return -1;
	}
	*slash = '/';
	M.fd = sim_side_open(path, 1);
	if (M.fd < 0) {
		warn("cannot create", path);
		return -1;
	}
	M.size = 0;
	return 0;
}

void *sim_mem_map(uint64_t off, uint64_t size)
{
	if (M.fd < 0 && backing_open() < 0)
		return NULL;
	uint64_t need = off + span(size);
	if (need > M.size) {
		uint64_t grow = need > UINT64_MAX - GROW_STEP ? need : (need + GROW_STEP - 1) / GROW_STEP * GROW_STEP;
		if (ftruncate(M.fd, (off_t)grow) < 0) {
			warn("cannot grow", "the backing file");
			return NULL;
		}
		M.size = grow;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, M.fd, (off_t)off);
	if (p == MAP_FAILED) {
		warn("cannot map", "the backing file");
		return NULL;
	}
	return p;
}

/* A forked child: the file is its parent's (the caller unmapped what it
 * inherited). */
void sim_mem_forget(void)
{
	if (M.fd >= 0)
		close(M.fd);
	free(M.holes);
	M.fd = -1;
	M.size = M.end = 0;
	M.holes = NULL;
	M.nholes = M.cap = 0;
}

/* ---- checkpoints: the controller's side --------------------------------- */

#define CKPT_POLL_NS 10000000ull /* lock: how often a wait looks at the target */
#define COPY_CHUNK (1u << 20)

static int all_zero(const unsigned char *b, size_t n)
{
	return n == 0 || (b[0] == 0 && memcmp(b, b + 1, n - 1) == 0);
}

static int write_all(int fd, const unsigned char *b, size_t n, off_t at)
{
	while (n) {
		ssize_t w = pwrite(fd, b, n, at);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
		at += w;
	}
	return 0;
}

/* SRC's data into DST at the same offsets: only SRC's data extents, and no
 * chunk of zeros, so DST stays as sparse as SRC. */
static int copy_data(int src, int dst)
{
	struct stat sb;
	if (fstat(src, &sb) < 0)
		return -1;
	unsigned char *buf = malloc(COPY_CHUNK);
	if (!buf)
		return -1;
	int rc = 0;
	off_t pos = 0;
	while (rc == 0 && pos < sb.st_size) {
		off_t data = lseek(src, pos, SEEK_DATA);
		if (data < 0) {
			rc = errno == ENXIO ? 1 : -1; /* ENXIO: no data after POS */
			break;
		}
		off_t end = lseek(src, data, SEEK_HOLE);
		if (end < 0) {
			rc = -1;
			break;
		}
		for (pos = data; pos < end;) {
			size_t n = end - pos < COPY_CHUNK ? (size_t)(end - pos) : COPY_CHUNK;
			ssize_t got = pread(src, buf, n, pos);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0) {
				rc = -1;
				break;
			}
			if (got == 0) { /* the file ended early: nothing more to copy */
				pos = sb.st_size;
				break;
			}
			if (!all_zero(buf, (size_t)got) && write_all(dst, buf, (size_t)got, pos) < 0) {
				rc = -1;
				break;
			}
			pos += got;
		}
	}
	free(buf);
	return rc < 0 ? -1 : 0;
}

/* Every byte of FD reads zero afterwards, its size unchanged. */
static int drop_data(int fd)
{
	struct stat sb;
	if (fstat(fd, &sb) < 0)
		return -1;
	if (sb.st_size == 0 || fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, sb.st_size) == 0)
		return 0;
	/* No holes here: truncating does it (the owner touches nothing now). */
	return ftruncate(fd, 0) == 0 && ftruncate(fd, sb.st_size) == 0 ? 0 : -1;
}

static int side_paths(unsigned e, char *mem, char *ckpt, size_t len)
{
	return sim_side_path("mem", e, mem, len) == SIM_OK && sim_side_path("ckpt", e, ckpt, len) == SIM_OK ? 0 : -1;
}

/* Device bytes of entry E to its host copy; the device copy dropped. On
 * failure nothing changed. */
static int save(unsigned e)
{
	char mem[PATH_MAX + 32], ckpt[PATH_MAX + 32];
	if (side_paths(e, mem, ckpt, sizeof(mem)) < 0)
		return -1;
	int src = open(mem, O_RDWR | O_CLOEXEC);
	if (src < 0)
		return errno == ENOENT ? 0 : -1; /* no copy ever wrote its memory */
	int rc = -1, dst = -1;
	struct stat sb;
	char *slash = strrchr(ckpt, '/');
	*slash = 0;
	int dir = sim_side_mkdir(ckpt) == 0;
	*slash = '/';
	if (dir && fstat(src, &sb) == 0 && (dst = sim_side_open(ckpt, 1)) >= 0 &&
	    ftruncate(dst, sb.st_size) == 0 && copy_data(src, dst) == 0)
		rc = drop_data(src);
	if (dst >= 0) {
		close(dst);
		if (rc < 0)
			unlink(ckpt);
	}
	close(src);
	return rc;
}

/* The host copy of entry E back into its device memory, then removed. On
 * failure the device copy is dropped again and the host copy kept. */
static int load(unsigned e)
{
	char mem[PATH_MAX + 32], ckpt[PATH_MAX + 32];
	if (side_paths(e, mem, ckpt, sizeof(mem)) < 0)
		return -1;
	int src = open(ckpt, O_RDONLY | O_CLOEXEC);
	if (src < 0)
		return errno == ENOENT ? 0 : -1; /* the checkpoint saved nothing */
	int dst = open(mem, O_RDWR | O_CLOEXEC);
	int rc = dst >= 0 ? copy_data(src, dst) : -1;
	if (rc < 0 && dst >= 0)
		drop_data(dst);
	if (dst >= 0)
		close(dst);
	close(src);
	if (rc == 0)
		unlink(ckpt);
	return rc;
}

/* Two ids of a "Uid:" or "Gid:" line of /proc/PID/status: real, effective, saved. */
static int ids_of(const char *line, unsigned long ids[3])
{
	return sscanf(line, "%*s %lu %lu %lu", &ids[0], &ids[1], &ids[2]) == 3 ? 0 : -1;
}

/* SIM_OK when this process may act on PID (see the top of this file);
 * SIM_EPERM when not; SIM_OK too when /proc does not show PID, so that the
 * call itself says there is no such process. */
static int permitted(int pid)
{
	if (geteuid() == 0)
		return SIM_OK;
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return SIM_OK;
	unsigned long uids[3], gids[3];
	int have = 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Uid:", 4) == 0 && ids_of(line, uids) == 0)
			have |= 1;
		else if (strncmp(line, "Gid:", 4) == 0 && ids_of(line, gids) == 0)
			have |= 2;
	}
	fclose(f);
	if (have != 3)
		return SIM_EPERM;
	unsigned long uid = geteuid(), gid = getegid();
	for (int i = 0; i < 3; i++)
		if (uids[i] != uid || gids[i] != gid)
			return SIM_EPERM;
	return SIM_OK;
}

/* From FROM to TO, or SIM_ESTATE. */
static int step(struct sim_proc *p, uint32_t from, uint32_t to)
{
	return atomic_compare_exchange_strong(&p->ckpt, &from, to) ? SIM_OK : SIM_ESTATE;
}

int sim_ckpt_lock(int pid, uint64_t timeout_ms)
{
	struct sim_target t;
	int r = permitted(pid);
	if (r != SIM_OK)
		return r;
	r = sim_target_open(pid, &t);
	if (r != SIM_OK)
		return r;
	struct sim_proc *p = &sim_st()->proc[t.entry];
	if ((r = step(p, SIM_CKPT_RUNNING, SIM_CKPT_LOCKING)) != SIM_OK)
		goto out;
	/* New calls of the target now wait; those already inside finish. */
	uint64_t deadline = timeout_ms ? sim_now_ns() + timeout_ms * 1000000ull : UINT64_MAX;
	for (;;) {
		uint32_t n = atomic_load(&p->inflight);
		if (n == 0)
			break;
		uint64_t now = sim_now_ns();
		if (!sim_target_alive(&t)) {
			r = SIM_ENOENT;
			break;
		}
		if (now >= deadline) {
			r = SIM_ETIMEDOUT;
			break;
		}
		sim_shared_wait(&p->inflight, n, deadline - now < CKPT_POLL_NS ? deadline - now : CKPT_POLL_NS);
	}
	step(p, SIM_CKPT_LOCKING, r == SIM_OK ? SIM_CKPT_LOCKED : SIM_CKPT_RUNNING);
	if (r == SIM_OK)
		atomic_fetch_add(&p->locks, 1);
	if (r != SIM_OK)
		sim_shared_wake(&p->ckpt); /* the calls held back go on */
out:
	sim_target_close(&t);
	return r;
}

/* Whether every device the entry holds memory on has the checkpoint's own
 * working room free (an H200 refused a checkpoint at 4 MiB free). */
static int ckpt_room(const struct sim_proc *p)
{
	const struct sim_state *st = sim_st();
	for (unsigned d = 0; d < st->hdr.ndev && d < SIM_MAX_DEVICES; d++) {
		uint64_t used = atomic_load(&st->dev[d].used);
		uint64_t free = used < st->dev[d].total ? st->dev[d].total - used : 0;
		if (atomic_load(&p->used[d]) && free < st->hdr.ckpt_min_free)
			return 0;
	}
	return 1;
}

/*
 * HAMI_SIM_CKPT_RATE (read by the checkpointing process at each call, never
 * stored): bytes per second a checkpoint or a restore moves, "2g" as an H200
 * parks; unset or 0: at once. While it moves, other processes' calls that the
 * driver refuses during a move (new contexts, streams, events, module loads)
 * meet CUDA_ERROR_DEVICE_UNAVAILABLE for as long as a real move lasts.
 */
static void move_time(const struct sim_proc *p)
{
	const char *v = getenv("HAMI_SIM_CKPT_RATE");
	uint64_t rate = 0, bytes = 0;
	if (!v || sim_parse_size(v, &rate) < 0 || !rate)
		return;
	for (unsigned d = 0; d < SIM_MAX_DEVICES; d++)
		bytes += atomic_load(&p->used[d]); /* on the device: before a checkpoint, after a restore's charge */
	uint64_t ns = (uint64_t)((double)bytes / (double)rate * 1e9);
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int sim_ckpt_checkpoint(int pid)
{
	struct sim_target t;
	int r = permitted(pid);
	if (r != SIM_OK)
		return r;
	r = sim_target_open(pid, &t);
	if (r != SIM_OK)
		return r;
	struct sim_proc *p = &sim_st()->proc[t.entry];
	if ((r = step(p, SIM_CKPT_LOCKED, SIM_CKPT_CHECKPOINTING)) == SIM_OK) {
		if (ckpt_room(p)) {
			move_time(p);
			r = save(t.entry) == 0 ? SIM_OK : SIM_EIO;
		} else {
			r = SIM_ENOMEM; /* nothing moved: the process stays locked, as it was */
		}
		if (r == SIM_OK)
			sim_park(t.entry);
		step(p, SIM_CKPT_CHECKPOINTING, r == SIM_OK ? SIM_CKPT_CHECKPOINTED : SIM_CKPT_LOCKED);
	}
	sim_target_close(&t);
	return r;
}

int sim_ckpt_restore(int pid)
{
	struct sim_target t;
	int r = permitted(pid);
	if (r != SIM_OK)
		return r;
	r = sim_target_open(pid, &t);
	if (r != SIM_OK)
		return r;
	struct sim_proc *p = &sim_st()->proc[t.entry];
	if ((r = step(p, SIM_CKPT_CHECKPOINTED, SIM_CKPT_RESTORING)) != SIM_OK)
		goto out;
	/* Room first: without it nothing changes. */
	if ((r = sim_unpark(t.entry)) == SIM_OK) {
		move_time(p);
		if (load(t.entry) < 0) {
			sim_park(t.entry);
			r = SIM_EIO;
		}
	}
	step(p, SIM_CKPT_RESTORING, r == SIM_OK ? SIM_CKPT_LOCKED : SIM_CKPT_CHECKPOINTED);
out:
	sim_target_close(&t);
	return r;
}

int sim_ckpt_unlock(int pid)
{
	struct sim_target t;
	int r = permitted(pid);
	if (r != SIM_OK)
		return r;
	r = sim_target_open(pid, &t);
	if (r != SIM_OK)
		return r;
	struct sim_proc *p = &sim_st()->proc[t.entry];
	if ((r = step(p, SIM_CKPT_LOCKED, SIM_CKPT_RUNNING)) == SIM_OK)
		sim_shared_wake(&p->ckpt);
	sim_target_close(&t);
	return r;
}

/* A step in progress reads as the state it started from; one that nobody
 * works on any more (its call died half-way) as FAILED: what it left behind
 * is unknown, and the target stays held. */
int sim_ckpt_state(int pid, unsigned *state)
{
	struct sim_target t;
	int r = permitted(pid);
	if (r != SIM_OK)
		return r;
	r = sim_target_open(pid, &t);
	if (r != SIM_OK)
		return r;
	_Atomic uint32_t *ck = &sim_st()->proc[t.entry].ckpt;
	uint32_t c;
	for (;;) {
		c = atomic_load(ck);
		if (c <= SIM_CKPT_FAILED)
			break;
		/* A call moves its step on before it lets go of the target: a
		 * step nobody holds that is still there was left behind. */
		int busy = sim_target_busy(&t);
		if (atomic_load(ck) != c)
			continue;
		c = !busy ? SIM_CKPT_FAILED
		    : c == SIM_CKPT_LOCKING ? SIM_CKPT_RUNNING
		    : c == SIM_CKPT_CHECKPOINTING ? SIM_CKPT_LOCKED : SIM_CKPT_CHECKPOINTED;
		break;
	}
	*state = c;
	sim_target_close(&t);
	return SIM_OK;
}
