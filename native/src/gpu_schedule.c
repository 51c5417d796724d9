/*
 * Laying the slices' launch windows side by side on each GPU
 * (include/hami/gpu_schedule.h). Runs in the housekeeping thread only: the
 * launch path reads one process-local offset.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hami.h"
#include "hami/gpu_schedule.h"

struct schedule {
	struct hami_schedule_file *map;
	int fd;
	int entry; /* ours, -1 while we hold none */
	int failed;
};

static struct schedule sched[HAMI_SLICE_MAX_DEVICES];
static uint64_t offset_ppm[HAMI_SLICE_MAX_DEVICES]; /* read by the launch path */
static int neighbours[HAMI_SLICE_MAX_DEVICES];     /* other slices with a share here; the launch path reads it */
static int busy_neighbours[HAMI_SLICE_MAX_DEVICES]; /* those of them that launched within BUSY_NS */

#define BUSY_NS 1000000000ull

static off_t entry_offset(int i)
{
	return (off_t)(offsetof(struct hami_schedule_file, entry) + (size_t)i * sizeof(struct hami_schedule_entry));
}

static int lock(int fd, int i, short type, int cmd)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = entry_offset(i), .l_len = 1 };
	if (cmd == F_OFD_GETLK) {
		if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
			return -1;
		return fl.l_type != F_UNLCK; /* 1: someone else holds a lock */
	}
	return fcntl(fd, cmd, &fl);
}

static uint64_t slice_key(const struct hami_slice_file *f)
{
	uint64_t h = 1469598103934665603ull ^ f->header.created_unix_ns;
	for (const char *p = f->header.name; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	return h ? h : 1;
}

static int open_schedule(struct schedule *s, const char *uuid)
{
	const char *dir = getenv("HAMI_SCHEDULE_DIR");
	char path[PATH_MAX], tmp[PATH_MAX + 32];
	snprintf(path, sizeof(path), "%s/hami-gpu-%s", dir && *dir ? dir : "/dev/shm", uuid);
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		/* Fully written first, then linked into place: nobody sees half a file. */
		snprintf(tmp, sizeof(tmp), "%s.%d.new", path, (int)getpid());
		int t = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (t >= 0) {
			struct hami_schedule_file init;
			memset(&init, 0, sizeof(init));
			memcpy(init.magic, HAMI_SCHEDULE_MAGIC, 8);
			init.version = HAMI_SCHEDULE_VERSION;
			init.entries = HAMI_SCHEDULE_ENTRIES;
			fchmod(t, 0666); /* slices of every user share it, whatever the umask */
			/* EEXIST: another process was first, and its file is as good. */
			if (write(t, &init, sizeof(init)) == (ssize_t)sizeof(init) && link(tmp, path) < 0 &&
			    errno != EEXIST)
				hami_log(HAMI_LOG_DEBUG, "cannot publish GPU schedule %s: %s", path, strerror(errno));
			close(t);
			unlink(tmp);
		}
		fd = open(path, O_RDWR | O_CLOEXEC);
	}
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct hami_schedule_file)) {
		hami_log(HAMI_LOG_WARN, "GPU schedule %s unusable (%s): slices' windows on this GPU may "
			 "overlap", path, fd < 0 ? strerror(errno) : "too short");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	void *m = mmap(NULL, sizeof(struct hami_schedule_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return -1;
	}
	s->map = m;
	if (memcmp(s->map->magic, HAMI_SCHEDULE_MAGIC, 8) != 0 || s->map->version != HAMI_SCHEDULE_VERSION) {
		hami_log(HAMI_LOG_WARN, "GPU schedule %s has an unknown layout: not used", path);
		munmap(m, sizeof(struct hami_schedule_file));
		s->map = NULL;
		close(fd);
		return -1;
	}
	/* Locks on a description of their own: the mapping's would outlive us in forked children. */
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	s->fd = open(self, O_RDWR | O_CLOEXEC);
	close(fd);
	s->entry = -1;
	return s->fd < 0 ? -1 : 0;
}

/* Join the slice's entry (read lock), or claim a free one (write lock, then read). */
static int join(struct schedule *s, uint64_t key)
{
	struct hami_schedule_file *m = s->map;
	for (int i = 0; i < HAMI_SCHEDULE_ENTRIES; i++)
		if (__atomic_load_n(&m->entry[i].state, __ATOMIC_ACQUIRE) == 1 &&
		    __atomic_load_n(&m->entry[i].key, __ATOMIC_ACQUIRE) == key &&
		    lock(s->fd, i, F_RDLCK, F_OFD_SETLK) == 0) {
			if (m->entry[i].key == key && m->entry[i].state == 1)
				return i;
			lock(s->fd, i, F_UNLCK, F_OFD_SETLK);
		}
	for (int i = 0; i < HAMI_SCHEDULE_ENTRIES; i++) {
		if (lock(s->fd, i, F_WRLCK, F_OFD_SETLK) < 0)
			continue; /* in use */
		__atomic_store_n(&m->entry[i].key, key, __ATOMIC_RELEASE);
		__atomic_store_n(&m->entry[i].open_ppm, 0, __ATOMIC_RELEASE);
		__atomic_store_n(&m->entry[i].active_ns, 1, __ATOMIC_RELEASE);
		__atomic_store_n(&m->entry[i].state, 1, __ATOMIC_RELEASE);
		lock(s->fd, i, F_RDLCK, F_OFD_SETLK); /* downgrade: the slice's other processes may join */
		return i;
	}
	return -1;
}

/*
 * Every housekeeping tick, for a GPU where the slice has a share: publish our
 * window's length (and, when this process launched since the last tick, that
 * the slice is busy) and learn where the window starts and which other slices
 * are busy. Without a usable schedule the offset stays 0 and the windows of
 * different slices may overlap.
 */
void hami_schedule_tick(int sdev, uint32_t open_ppm, int launched)
{
	struct hami_slice_file *f = hami_slice();
	struct schedule *s = &sched[sdev];
	if (!f || s->failed)
		return;
	if (!s->map && open_schedule(s, f->device[sdev].uuid) < 0) {
		s->failed = 1;
		return;
	}
	if (s->entry < 0 && (s->entry = join(s, slice_key(f))) < 0)
		return;
	struct hami_schedule_file *m = s->map;
	__atomic_store_n(&m->entry[s->entry].open_ppm, open_ppm, __ATOMIC_RELEASE);
	uint64_t now = hami_monotonic_ns();
	if (launched)
		__atomic_store_n(&m->entry[s->entry].active_ns, now, __ATOMIC_RELEASE);
	uint64_t before = 0;
	int others = 0, busy = 0;
	for (int i = 0; i < HAMI_SCHEDULE_ENTRIES; i++) {
		if (i == s->entry || __atomic_load_n(&m->entry[i].state, __ATOMIC_ACQUIRE) != 1 ||
		    m->entry[i].key == m->entry[s->entry].key || lock(s->fd, i, F_WRLCK, F_OFD_GETLK) != 1)
			continue;
		others++;
		uint64_t active = __atomic_load_n(&m->entry[i].active_ns, __ATOMIC_ACQUIRE);
		if (active == 0 || (active > 1 && active + BUSY_NS > now))
			busy++; /* 0: an older library that does not say: take it as busy */
		if (i < s->entry)
			before += __atomic_load_n(&m->entry[i].open_ppm, __ATOMIC_ACQUIRE);
	}
	__atomic_store_n(&neighbours[sdev], others, __ATOMIC_RELAXED);
	busy_neighbours[sdev] = busy;
	__atomic_store_n(&offset_ppm[sdev], before % 1000000u, __ATOMIC_RELAXED);
}

/* Leave the schedule of a GPU where the slice no longer has a share. */
void hami_schedule_leave(int sdev)
{
	struct schedule *s = &sched[sdev];
	if (s->map && s->entry >= 0) {
		lock(s->fd, s->entry, F_UNLCK, F_OFD_SETLK);
		s->entry = -1;
	}
	__atomic_store_n(&offset_ppm[sdev], 0, __ATOMIC_RELAXED);
	__atomic_store_n(&neighbours[sdev], 0, __ATOMIC_RELAXED);
	busy_neighbours[sdev] = 0;
}

/* How many other slices with a share on this GPU launched within the last
 * second (as of the last tick; housekeeper only). */
int hami_schedule_busy_neighbours(int sdev)
{
	return busy_neighbours[sdev];
}

/* How many other slices have a share on this GPU (as of the last tick). */
int hami_schedule_neighbours(int sdev)
{
	return __atomic_load_n(&neighbours[sdev], __ATOMIC_RELAXED);
}

uint64_t hami_schedule_offset_ppm(int sdev)
{
	return __atomic_load_n(&offset_ppm[sdev], __ATOMIC_RELAXED);
}

/* After fork: the child shares no lock of ours; it joins again on its own. */
void hami_schedule_after_fork(void)
{
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		struct schedule *s = &sched[d];
		if (s->fd >= 0 && s->map)
			close(s->fd);
		if (s->map)
			munmap(s->map, sizeof(struct hami_schedule_file));
		memset(s, 0, sizeof(*s));
		offset_ppm[d] = 0;
		__atomic_store_n(&neighbours[d], 0, __ATOMIC_RELAXED);
		busy_neighbours[d] = 0;
	}
}
