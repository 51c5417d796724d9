/*
 * The slice file: creating or opening it, checking it, finding a GPU's entry,
 * reading limits, and owning one process slot. docs/slice-file.md has the rules.
 *
 * Ownership of a slot is an OFD lock on its first byte, which the kernel drops
 * when the process dies: no PID checks, so PID namespaces and PID reuse cannot
 * confuse it. A slot whose lock can be taken belongs to nobody alive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

#define HOUSEKEEPING_INTERVAL_NS (50 * 1000000L) /* SM-share changes apply within 100 ms */

static struct hami_slice_file *map;
static int map_fd = -1;
static int map_writable;
static int slot_index = -1;
static int slots_closed; /* set at exit, under slot_lock: no slot is taken after it */
static int housekeeper_running;
pthread_mutex_t hami_slot_lock = PTHREAD_MUTEX_INITIALIZER;
#define slot_lock hami_slot_lock

struct hami_slice_file *hami_slice(void)
{
	return __atomic_load_n(&map, __ATOMIC_ACQUIRE);
}

const char *hami_slice_name(void)
{
	struct hami_slice_file *f = hami_slice();
	return f ? f->header.name : hami_config()->slice_name;
}

/* ---- byte-range ownership ------------------------------------------------ */

static off_t slot_offset(int i)
{
	return (off_t)(offsetof(struct hami_slice_file, slot) + (size_t)i * sizeof(struct hami_slot));
}

static int ofd_lock(int fd, off_t at, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1 };
	return fcntl(fd, F_OFD_SETLK, &fl);
}

/*
 * A second open file description of the same file, for the slot locks. The
 * locks must not live on the description the mapping was made from: a forked
 * child inherits the mapping, which would keep that description, and with it
 * the parent's locks, alive after the parent died.
 */
static int reopen(int fd, int writable)
{
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	int again = open(self, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (again < 0 && hami_config()->slice_path)
		again = open(hami_config()->slice_path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	return again;
}

/* Keep the mapping, swap its descriptor for a lock-only one. */
static int adopt(int fd, void *m, int writable)
{
	int lock_fd = reopen(fd, writable);
	close(fd);
	if (lock_fd < 0) {
		hami_log(HAMI_LOG_ERROR, "cannot reopen slice file %s: %s",
			 hami_config()->slice_path ? hami_config()->slice_path : "(private)", strerror(errno));
		munmap(m, sizeof(struct hami_slice_file));
		return -1;
	}
	map_fd = lock_fd;
	map_writable = writable;
	__atomic_store_n(&map, (struct hami_slice_file *)m, __ATOMIC_RELEASE);
	return 0;
}

/* ---- creating and checking ----------------------------------------------- */

static void fill_new_slice(struct hami_slice_file *f, const char *name, uint32_t flags,
			   const struct hami_device_info *dev, int count)
{
	memcpy(f->header.magic, HAMI_SLICE_MAGIC, 8);
	f->header.version_major = HAMI_SLICE_VERSION_MAJOR;
	f->header.version_minor = HAMI_SLICE_VERSION_MINOR;
	f->header.file_size = sizeof(*f);
	f->header.header_size = sizeof(f->header);
	f->header.flags = flags;
	f->header.max_devices = HAMI_SLICE_MAX_DEVICES;
	f->header.max_slots = HAMI_SLICE_MAX_SLOTS;
	f->header.device_size = sizeof(struct hami_slice_device);
	f->header.slot_size = sizeof(struct hami_slot);
	f->header.limits_offset = offsetof(struct hami_slice_file, limits);
	f->header.devices_offset = offsetof(struct hami_slice_file, device);
	f->header.slots_offset = offsetof(struct hami_slice_file, slot);
	f->header.created_unix_ns = hami_now_ns();
	snprintf(f->header.name, sizeof(f->header.name), "%s", name);

	/* The creator's environment sets the first limits; the file is the authority after. */
	struct hami_limit_set *set = &f->limits.copy[0];
	hami_config_limit(-1, &set->fallback);
	for (int i = 0; i < count && i < HAMI_SLICE_MAX_DEVICES; i++) {
		struct hami_slice_device *d = &f->device[i];
		d->state = HAMI_DEVICE_READY;
		d->sm_count = dev[i].sm_count;
		d->memory_total = dev[i].memory_total;
		memcpy(d->uuid, dev[i].uuid, sizeof(d->uuid));
		hami_config_limit(i, &set->device[i]);
	}
	f->limits.copy[1] = f->limits.copy[0];
	f->limits.changed_unix_ns = f->header.created_unix_ns;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Publish a fully written file with link(2): nobody ever sees half of one. */
static int create_slice_file(const char *path, const struct hami_device_info *dev, int count)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s.%d.new", path, (int)getpid());
	/* Only this user reads the slots (pids, kernel ids); the hub shares its own files. */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	struct hami_slice_file *f = calloc(1, sizeof(*f));
	int err = 0;
	if (!f)
		err = -ENOMEM;
	else {
		fill_new_slice(f, hami_config()->slice_name, 0, dev, count);
		if (write_all(fd, f, sizeof(*f)) < 0)
			err = -errno;
	}
	free(f);
	close(fd);
	if (!err && link(tmp, path) < 0 && errno != EEXIST)
		err = -errno;
	unlink(tmp);
	return err;
}

static int check_header(const struct hami_slice_header *h, off_t size, const char *path)
{
	if ((size_t)size < sizeof(*h) || memcmp(h->magic, HAMI_SLICE_MAGIC, 8) != 0) {
		if ((size_t)size < sizeof(*h) && size > 0 && memcmp(h->magic, HAMI_SLICE_MAGIC, 8) == 0)
			goto truncated;
		hami_log(HAMI_LOG_ERROR, "%s is not a hami slice file (bad magic); remove it or point "
			 "HAMI_SLICE elsewhere", path);
		return -1;
	}
	if (h->version_major != HAMI_SLICE_VERSION_MAJOR) {
		hami_log(HAMI_LOG_ERROR, "slice file %s has layout version %u.%u; this library reads "
			 "version %u: upgrade hami-jupyter in this environment",
			 path, h->version_major, h->version_minor, HAMI_SLICE_VERSION_MAJOR);
		return -1;
	}
	if (h->header_size != sizeof(*h) || h->max_devices != HAMI_SLICE_MAX_DEVICES ||
	    h->max_slots != HAMI_SLICE_MAX_SLOTS || h->device_size != sizeof(struct hami_slice_device) ||
	    h->slot_size != sizeof(struct hami_slot) ||
	    h->limits_offset != offsetof(struct hami_slice_file, limits) ||
	    h->devices_offset != offsetof(struct hami_slice_file, device) ||
	    h->slots_offset != offsetof(struct hami_slice_file, slot)) {
		hami_log(HAMI_LOG_ERROR, "slice file %s has a layout this library does not know "
			 "(corrupt?)", path);
		return -1;
	}
	if (h->file_size < sizeof(struct hami_slice_file) || (uint64_t)size < h->file_size)
		goto truncated;
	return 0;
truncated:
	hami_log(HAMI_LOG_ERROR, "slice file %s is truncated: %lld bytes, expected %zu", path,
		 (long long)size, sizeof(struct hami_slice_file));
	return -1;
}

/*
 * Open, check and map. 0, or -ENOENT when absent, or -1 (reported). The path
 * is looked at before it is opened: opening a FIFO would block, and nothing
 * but a regular file in a trusted folder is ever used.
 */
static int map_slice_file(const char *path, int writable)
{
	struct stat folder, st, opened;
	int rc = hami_check_folder(path, &folder);
	if (rc < 0)
		return rc == -ENOENT ? -ENOENT : -1;
	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return hami_stat_missing(path, "slice file") < 0 ? -1 : -ENOENT;
		hami_log(HAMI_LOG_ERROR, "cannot open slice file %s: %s", path, strerror(errno));
		return -1;
	}
	if (hami_check_file(path, &st, &folder, 0) < 0)
		return -1;
	int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : (hami_log(HAMI_LOG_ERROR,
				"cannot open slice file %s: %s", path, strerror(errno)), -1);
	struct hami_slice_header h;
	memset(&h, 0, sizeof(h));
	if (fstat(fd, &opened) < 0 || pread(fd, &h, sizeof(h), 0) < 0) {
		hami_log(HAMI_LOG_ERROR, "cannot read slice file %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	/* Swapped between the look and the open: check what we really hold. */
	if ((opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) &&
	    hami_check_file(path, &opened, &folder, 0) < 0) {
		close(fd);
		return -1;
	}
	if (check_header(&h, opened.st_size, path) < 0) {
		close(fd);
		return -1;
	}
	void *m = mmap(NULL, sizeof(struct hami_slice_file), PROT_READ | (writable ? PROT_WRITE : 0),
		       MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		hami_log(HAMI_LOG_ERROR, "cannot map slice file %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	/* Limits owned by the hub, if any: unusable ones fail closed, never "no limit". */
	if (hami_limits_file_map(path) < 0) {
		munmap(m, sizeof(struct hami_slice_file));
		close(fd);
		return -1;
	}
	/* A read-only mapping made earlier for NVML answers stays valid for
	 * readers that still hold it; it is simply no longer used. */
	return adopt(fd, m, writable);
}

/* A private slice: one process tree, no file name, same code paths. */
static int map_private_slice(const struct hami_device_info *dev, int count)
{
	int fd = memfd_create("hami-private-slice", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, sizeof(struct hami_slice_file)) < 0) {
		hami_log(HAMI_LOG_ERROR, "cannot create a private slice: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	struct hami_slice_file *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED) {
		hami_log(HAMI_LOG_ERROR, "cannot map a private slice: %s", strerror(errno));
		close(fd);
		return -1;
	}
	fill_new_slice(f, hami_config()->slice_name, HAMI_SLICE_FLAG_PRIVATE, dev, count);
	return adopt(fd, f, 1);
}

static void make_parent_dir(const char *path)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return;
	*slash = '\0';
	if (mkdir(dir, 0700) < 0 && errno == ENOENT) {
		make_parent_dir(dir);
		mkdir(dir, 0700);
	}
}

int hami_slice_attach(const struct hami_device_info *dev, int count)
{
	if (hami_slice() && map_writable)
		return CUDA_SUCCESS;
	const char *path = hami_config()->slice_path;
	if (!path)
		return map_private_slice(dev, count) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
	for (int attempt = 0; attempt < 2; attempt++) {
		int rc = map_slice_file(path, 1);
		if (rc == 0)
			return CUDA_SUCCESS;
		if (rc != -ENOENT)
			return CUDA_ERROR_INVALID_VALUE;
		make_parent_dir(path);
		struct stat folder;
		rc = hami_check_folder(path, &folder); /* never write into someone else's folder */
		if (rc < 0) {
			if (rc == -ENOENT)
				hami_log(HAMI_LOG_ERROR, "cannot make the folder of slice file %s", path);
			return CUDA_ERROR_INVALID_VALUE;
		}
		rc = create_slice_file(path, dev, count);
		if (rc < 0) {
			hami_log(HAMI_LOG_ERROR, "cannot create slice file %s: %s", path, strerror(-rc));
			return CUDA_ERROR_OPERATING_SYSTEM;
		}
	}
	hami_log(HAMI_LOG_ERROR, "slice file %s disappeared each time it was made; is something removing it?",
		 path);
	return CUDA_ERROR_OPERATING_SYSTEM;
}

/* For NVML-only processes: map an existing slice file read-only, create nothing. */
int hami_slice_open_existing(void)
{
	static int refused; /* said once why; NVML is asked often */
	const struct hami_config *c = hami_config();
	if (hami_slice())
		return 0;
	if (c->error || !c->slice_path || __atomic_load_n(&refused, __ATOMIC_ACQUIRE))
		return -1;
	pthread_mutex_lock(&hami_open_lock);
	int rc = hami_slice() ? 0 : map_slice_file(c->slice_path, 0);
	if (rc < 0 && rc != -ENOENT)
		__atomic_store_n(&refused, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&hami_open_lock);
	return rc == 0 ? 0 : -1;
}

/* ---- devices ------------------------------------------------------------- */

/*
 * The slice's entry for a GPU, claimed on first sight, so two processes never
 * make two entries for one UUID. A claimer holds an OFD lock on the entry's
 * first byte from before it marks the entry CLAIMING until it is READY; the
 * kernel drops the lock if the claimer dies. So an entry that is CLAIMING
 * while nobody holds its lock was left half-made by a dead process, and is
 * emptied again; one whose claimer lives is waited for (briefly).
 */
/* OFD locks do not tell our threads apart: they take turns (claim_lock) */
pthread_mutex_t hami_claim_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t hami_open_lock = PTHREAD_MUTEX_INITIALIZER;
#define claim_lock hami_claim_lock

static off_t device_offset(int i)
{
	return (off_t)(offsetof(struct hami_slice_file, device) + (size_t)i * sizeof(struct hami_slice_device));
}

/* Whether a live process other than us holds entry i's claim lock. */
static int claim_in_progress(int i)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = device_offset(i), .l_len = 1 };
	if (map_fd < 0 || fcntl(map_fd, F_OFD_GETLK, &fl) < 0)
		return 1; /* cannot tell: treat it as alive, so we wait and then refuse */
	return fl.l_type != F_UNLCK;
}

/* Entry i is CLAIMING: empty it if its claimer died. 1: emptied (look again). */
static int repair_dead_claim(struct hami_slice_file *f, int i)
{
	if (!map_writable || map_fd < 0 || ofd_lock(map_fd, device_offset(i), F_WRLCK) < 0)
		return 0;
	struct hami_slice_device *d = &f->device[i];
	int repaired = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE) == HAMI_DEVICE_CLAIMING;
	if (repaired) {
		hami_log(HAMI_LOG_WARN, "slice \"%s\": GPU entry %d was left half-claimed by a process "
			 "that died; emptied it", f->header.name, i);
		memset(d->uuid, 0, sizeof(d->uuid));
		d->memory_total = 0;
		d->sm_count = 0;
		__atomic_store_n(&d->state, HAMI_DEVICE_EMPTY, __ATOMIC_RELEASE);
	}
	ofd_lock(map_fd, device_offset(i), F_UNLCK);
	return repaired;
}

/* Claim empty entry i for *info; 0 when another process got there first. */
static int claim_device(struct hami_slice_file *f, int i, const struct hami_device_info *info)
{
	struct hami_slice_device *d = &f->device[i];
	if (!map_writable || map_fd < 0 || ofd_lock(map_fd, device_offset(i), F_WRLCK) < 0)
		return 0;
	uint32_t expect = HAMI_DEVICE_EMPTY;
	int won = __atomic_compare_exchange_n(&d->state, &expect, HAMI_DEVICE_CLAIMING, 0,
					      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	if (won) {
		memcpy(d->uuid, info->uuid, sizeof(d->uuid));
		d->memory_total = info->memory_total;
		d->sm_count = info->sm_count;
		__atomic_store_n(&d->state, HAMI_DEVICE_READY, __ATOMIC_RELEASE);
	}
	ofd_lock(map_fd, device_offset(i), F_UNLCK);
	return won;
}

/*
 * The entry of GPU *uuid*: its index; -1 when the slice has none (info NULL:
 * look only, claim nothing; else: no room left); -2 when a live claim kept us
 * from knowing (the caller must not take the GPU as unlimited).
 */
int hami_slice_device(const char *uuid, const struct hami_device_info *info)
{
	struct hami_slice_file *f = hami_slice();
	if (!f)
		return -1;
	/* Looking may repair a dead claim, which takes the entry's lock: our
	 * threads take turns, as for the slots (sweep_locked). */
	pthread_mutex_lock(&claim_lock);
	int found = -2;
	for (int round = 0; round < 2000; round++, found = -2) {
		int pending = 0, repaired = 0, empty = -1;
		found = -1;
		for (int i = 0; i < HAMI_SLICE_MAX_DEVICES && found < 0; i++) {
			struct hami_slice_device *d = &f->device[i];
			uint32_t st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
			if (st == HAMI_DEVICE_READY && strncmp(d->uuid, uuid, sizeof(d->uuid)) == 0)
				found = i;
			else if (st == HAMI_DEVICE_CLAIMING && claim_in_progress(i))
				pending = 1; /* it may be this very GPU: wait, never claim a second entry */
			else if (st == HAMI_DEVICE_CLAIMING)
				repaired |= repair_dead_claim(f, i); /* read-only: a dead claim is no entry */
			else if (st == HAMI_DEVICE_EMPTY && empty < 0)
				empty = i;
		}
		if (found >= 0)
			break;
		if (repaired)
			continue; /* look again at once */
		if (pending) {
			struct timespec ts = { 0, 50000 }; /* a claim takes microseconds; 100 ms at most */
			nanosleep(&ts, NULL);
			continue;
		}
		if (!info || empty < 0)
			break;
		if (claim_device(f, empty, info)) {
			found = empty;
			break;
		}
	}
	pthread_mutex_unlock(&claim_lock);
	return found;
}

/* ---- limits -------------------------------------------------------------- */

/* The limit in force for a slice device (-1: the fallback entry, for a GPU no
 * process has claimed yet): the copy the generation points at. */
int hami_slice_limit(int sdev, struct hami_device_limit *out)
{
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < -1 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return -1;
	const struct hami_slice_limits *l = hami_limits_block(f);
	for (int tries = 0; tries < 16; tries++) {
		uint64_t g = __atomic_load_n(&l->generation, __ATOMIC_ACQUIRE);
		const struct hami_limit_set *set = &l->copy[g & 1];
		struct hami_device_limit d = sdev >= 0 ? set->device[sdev] : set->fallback;
		if (!(d.flags & HAMI_LIMIT_SET))
			d = set->fallback;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&l->generation, __ATOMIC_RELAXED) == g) {
			*out = d;
			return 0;
		}
	}
	/* Writers keep racing us: the copy we read last is still a whole one most
	 * of the time; better a momentarily stale limit than a reader that hangs. */
	uint64_t g = __atomic_load_n(&l->generation, __ATOMIC_ACQUIRE);
	*out = sdev >= 0 ? l->copy[g & 1].device[sdev] : l->copy[g & 1].fallback;
	if (!(out->flags & HAMI_LIMIT_SET))
		*out = l->copy[g & 1].fallback;
	return 0;
}

/* ---- slots --------------------------------------------------------------- */

static uint64_t add_saturating(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The live slots' shares of device d, slot *skip* left out, never wrapping. */
static uint64_t live_shares(struct hami_slice_file *f, int d, int skip)
{
	uint64_t sum = 0;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++)
		if (i != skip && __atomic_load_n(&f->slot[i].state, __ATOMIC_SEQ_CST) == HAMI_SLOT_LIVE)
			sum = add_saturating(sum, __atomic_load_n(&f->slot[i].memory_used[d], __ATOMIC_SEQ_CST));
	return sum;
}

/*
 * What slot i may give back on device d out of the *share* it says it holds:
 * never more than the device's counter holds beyond the other live slots'.
 * Slots are written by the slice's user, and a forged or corrupted one
 * (2^64-1 bytes, say) must not take the counter below what live processes
 * hold: that would lift the cap. Giving back less is safe: the counter stays
 * high (the cap holds), and a recount returns the rest once the slots are quiet.
 */
static uint64_t reclaimable(struct hami_slice_file *f, int i, int d, uint64_t share)
{
	uint64_t total = __atomic_load_n(&f->device[d].memory_used, __ATOMIC_SEQ_CST);
	uint64_t others = live_shares(f, d, i);
	uint64_t room = total > others ? total - others : 0;
	return share < room ? share : room;
}

/* Return a slot's charges to the slice: a dead process's, or (dead = 0) our
 * own at exit. Caller holds the slot's lock. */
static void reclaim_slot(struct hami_slice_file *f, int i, int dead)
{
	struct hami_slot *s = &f->slot[i];
	/* Nonzero while we work: a concurrent recount must not act on half of it. */
	__atomic_store_n(&s->txn, 1, __ATOMIC_SEQ_CST);
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		uint64_t v = __atomic_exchange_n(&s->memory_used[d], 0, __ATOMIC_SEQ_CST);
		uint64_t back = v ? reclaimable(f, i, d, v) : 0;
		if (back)
			hami_credit_device(d, back);
		uint32_t n = __atomic_exchange_n(&s->decoders[d], 0, __ATOMIC_ACQ_REL);
		uint32_t have = __atomic_load_n(&f->device[d].decoders, __ATOMIC_ACQUIRE);
		while (n && !__atomic_compare_exchange_n(&f->device[d].decoders, &have, have > n ? have - n : 0,
							 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
	}
	/* Parked bytes were host memory of the process: they died with it. */
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		__atomic_store_n(&s->parked[d], 0, __ATOMIC_RELAXED);
		__atomic_store_n(&s->driver_bytes[d], 0, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_wanted, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_fast, HAMI_FAST_NONE, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_fast_able, 0, __ATOMIC_RELAXED);
	if (dead && __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == HAMI_SLOT_LIVE)
		hami_log(HAMI_LOG_INFO, "slice \"%s\": reclaimed slot %d of dead process %d",
			 f->header.name, i, s->pid);
	__atomic_store_n(&s->state, HAMI_SLOT_FREE, __ATOMIC_RELEASE);
	__atomic_add_fetch(&s->changes, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&s->txn, 0, __ATOMIC_SEQ_CST);
}

static uint64_t pid_namespace(void)
{
	struct stat st;
	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Each slot's changes counter, or -1 when some slot is half-way through a
 * charge, credit or reclaim (its txn is not 0). */
static int quiet_slots(struct hami_slice_file *f, uint64_t changes[HAMI_SLICE_MAX_SLOTS])
{
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		if (__atomic_load_n(&f->slot[i].txn, __ATOMIC_SEQ_CST) != 0)
			return -1;
		changes[i] = __atomic_load_n(&f->slot[i].changes, __ATOMIC_SEQ_CST);
	}
	return 0;
}

/*
 * When no slot is half-way through a charge (every txn is 0), a device's
 * counter must be the sum of the slots' shares. A process killed half-way
 * leaves it higher; this puts it back. The counter and the sum are one
 * instant's only if no charge, credit or reclaim ran while we read them:
 * none in flight before (txn), none finished after (changes; each one
 * counts itself there before its txn goes back to 0). That excess, and only
 * it, comes off: the compare-and-swap lands on the counter as we read it
 * (charges after our look that cancel out may have come and gone: their
 * slots' shares moved with them, so the excess is still there to take).
 *
 * A counter below the sum is never left by the library (a charge raises the
 * counter before the slot, a credit and a reclaim lower the slot first): its
 * user wrote it (issue 39: she zeroed it, and it stayed 0 B against 5 GiB
 * really held until her kernel was replaced). Seen so for UNDER_CONFIRM_NS in
 * this process's recounts, it is raised back to the sum: the slots' shares
 * are what each process charged, and the true-up keeps each of them at least
 * what the driver says the process holds (true_up.c), so the counter comes
 * back to the driver's figures. A slot zeroed as well is raised by the
 * true-up first, and the counter follows at the next recount.
 */
#define UNDER_CONFIRM_NS 1000000000ull
static uint64_t under_since[HAMI_SLICE_MAX_DEVICES]; /* under slot_lock: since when we see it low, or 0 */

static void recount(struct hami_slice_file *f)
{
	uint64_t before[HAMI_SLICE_MAX_SLOTS], after[HAMI_SLICE_MAX_SLOTS];
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
		if (__atomic_load_n(&f->device[d].state, __ATOMIC_ACQUIRE) != HAMI_DEVICE_READY)
			continue;
		if (quiet_slots(f, before) < 0)
			return;
		uint64_t total = __atomic_load_n(&f->device[d].memory_used, __ATOMIC_SEQ_CST);
		uint64_t sum = live_shares(f, d, -1); /* saturating: forged shares never wrap to little */
		if (quiet_slots(f, after) < 0 || memcmp(before, after, sizeof(before)) != 0)
			return;
		if (total > sum &&
		    __atomic_compare_exchange_n(&f->device[d].memory_used, &total, sum, 0, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST))
			hami_log(HAMI_LOG_INFO, "slice \"%s\" GPU %s: %llu bytes left by a process killed "
				 "half-way returned", f->header.name, f->device[d].uuid,
				 (unsigned long long)(total - sum));
		if (total >= sum) {
			under_since[d] = 0;
			continue;
		}
		uint64_t now = hami_monotonic_ns();
		if (!under_since[d]) {
			under_since[d] = now;
			continue;
		}
		if (now - under_since[d] < UNDER_CONFIRM_NS)
			continue;
		under_since[d] = 0;
		if (__atomic_compare_exchange_n(&f->device[d].memory_used, &total, sum, 0, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST))
			hami_log(HAMI_LOG_WARN, "slice \"%s\" GPU %s: its usage counter said %llu bytes, its "
				 "processes hold %llu: set back to what they hold (the slice file was changed by "
				 "hand)", f->header.name, f->device[d].uuid, (unsigned long long)total,
				 (unsigned long long)sum);
	}
}

/*
 * Reclaim the slots of dead processes. Caller holds slot_lock: OFD locks
 * belong to the open file description, not the thread, so two threads of
 * this process would both "win" a slot's lock, and the first to let go would
 * drop it for both; the second would then look at a slot a new process may
 * have just claimed, and free it under that process's feet.
 */
static void sweep_locked(struct hami_slice_file *f)
{
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		if (i == slot_index || __atomic_load_n(&f->slot[i].state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE)
			continue;
		if (ofd_lock(map_fd, slot_offset(i), F_WRLCK) < 0)
			continue; /* its owner lives */
		if (__atomic_load_n(&f->slot[i].state, __ATOMIC_ACQUIRE) == HAMI_SLOT_LIVE)
			reclaim_slot(f, i, 1);
		ofd_lock(map_fd, slot_offset(i), F_UNLCK);
	}
	recount(f);
}

void hami_slice_sweep(void)
{
	struct hami_slice_file *f = hami_slice();
	if (!f || !map_writable)
		return;
	pthread_mutex_lock(&slot_lock);
	if (map_fd >= 0)
		sweep_locked(f);
	pthread_mutex_unlock(&slot_lock);
}

static void *housekeeper(void *arg)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct timespec ts = { 0, HOUSEKEEPING_INTERVAL_NS };
		nanosleep(&ts, NULL);
		hami_slice_sweep();
		/* NVML blocks in a process the driver has locked for parking: not then. */
		struct hami_slot *me = __atomic_load_n(&hami_parkable_slot, __ATOMIC_ACQUIRE);
		if (!me || __atomic_load_n(&me->park_state, __ATOMIC_ACQUIRE) == HAMI_PARK_RUNNING) {
			hami_sm_tick();
			hami_true_up_tick();
		}
	}
	return NULL;
}

static void start_housekeeper(void)
{
	if (housekeeper_running)
		return;
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, HAMI_DRIVER_THREAD_STACK); /* NVML calls run here */
	if (pthread_create(&t, &attr, housekeeper, NULL) == 0)
		housekeeper_running = 1;
	else
		hami_log(HAMI_LOG_WARN, "cannot start the slot housekeeper: dead processes are "
			 "reclaimed only when the slice runs full");
	pthread_attr_destroy(&attr);
}

static int claim_slot(struct hami_slice_file *f)
{
	const struct hami_config *c = hami_config();
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		if (ofd_lock(map_fd, slot_offset(i), F_WRLCK) < 0)
			continue;
		/* We hold the lock: whoever had this slot is gone. */
		if (__atomic_load_n(&f->slot[i].state, __ATOMIC_ACQUIRE) == HAMI_SLOT_LIVE)
			reclaim_slot(f, i, 1);
		struct hami_slot *s = &f->slot[i];
		s->pid = (int32_t)getpid();
		s->pid_ns = pid_namespace();
		s->uid = (uint32_t)getuid();
		s->started_unix_ns = s->active_unix_ns = hami_now_ns();
		snprintf(s->kernel_id, sizeof(s->kernel_id), "%s", c->kernel_id);
		memset(s->comm, 0, sizeof(s->comm));
		FILE *fp = fopen("/proc/self/comm", "re");
		if (fp) {
			if (fgets(s->comm, sizeof(s->comm), fp))
				s->comm[strcspn(s->comm, "\n")] = '\0';
			fclose(fp);
		}
		for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++) {
			s->memory_used[d] = 0;
			s->sm_util[d] = 0;
			s->decoders[d] = 0;
		}
		s->frames_decoded = s->frames_mapped = s->decode_ns = 0;
		s->park_state = HAMI_PARK_RUNNING;
		s->park_wanted = s->park_wait = 0;
		s->park_error = 0;
		s->park_unix_ns = 0;
		s->park_fast = HAMI_FAST_NONE;
		/* A parker asks this process to park itself only when its library can. */
		s->park_fast_able = hami_config()->fast_park && hami_gate_thunks_available();
		s->gpu_active_unix_ns = s->started_unix_ns;
		memset(s->parked, 0, sizeof(s->parked));
		memset(s->driver_bytes, 0, sizeof(s->driver_bytes));
		__atomic_store_n(&s->state, HAMI_SLOT_LIVE, __ATOMIC_RELEASE);
		return i;
	}
	return -1;
}

/* This process's slot, claimed on first need. -1: the slice has no free slot. */
int hami_slot(void)
{
	int i = __atomic_load_n(&slot_index, __ATOMIC_ACQUIRE);
	if (i >= 0)
		return i;
	struct hami_slice_file *f = hami_slice();
	if (!f || map_fd < 0 || !map_writable)
		return -1;
	pthread_mutex_lock(&slot_lock);
	i = slot_index;
	if (i < 0 && slots_closed) {
		/* Exiting: the housekeeper (still running while exit waits) must not take a new slot. */
		pthread_mutex_unlock(&slot_lock);
		return -1;
	}
	if (i < 0) {
		i = claim_slot(f);
		if (i < 0) {
			sweep_locked(f);
			i = claim_slot(f);
		}
		if (i >= 0) {
			__atomic_store_n(&slot_index, i, __ATOMIC_RELEASE);
			__atomic_store_n(&hami_parkable_slot, &f->slot[i], __ATOMIC_RELEASE);
			start_housekeeper();
			hami_park_start();
		} else {
			hami_log(HAMI_LOG_ERROR, "slice \"%s\" has no free process slot (%d in use)",
				 f->header.name, HAMI_SLICE_MAX_SLOTS);
		}
	}
	pthread_mutex_unlock(&slot_lock);
	return i;
}

/*
 * A process that exits normally hands its slot back at once; the driver frees
 * its memory as it goes. (A killed one is reclaimed by the next sweep.)
 */
__attribute__((destructor)) static void release_slot_at_exit(void)
{
	struct hami_slice_file *f = hami_slice();
	/* All under slot_lock: a sweep of the housekeeper must neither take our
	 * slot for a dead one nor drop its lock while we still empty it. */
	pthread_mutex_lock(&slot_lock);
	slots_closed = 1;
	int i = __atomic_exchange_n(&slot_index, -1, __ATOMIC_ACQ_REL);
	__atomic_store_n(&hami_parkable_slot, NULL, __ATOMIC_RELEASE);
	if (f && i >= 0 && map_fd >= 0) {
		reclaim_slot(f, i, 0);
		ofd_lock(map_fd, slot_offset(i), F_UNLCK);
	}
	pthread_mutex_unlock(&slot_lock);
}

/* Whether some open file description other than ours holds a lock on byte
 * *field* of slot *slot* (the parker's, on park_state): 1, 0, or -1 unknown. */
int hami_slot_byte_locked(int slot, size_t field)
{
	if (map_fd < 0 || slot < 0 || slot >= HAMI_SLICE_MAX_SLOTS)
		return -1;
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
			    .l_start = slot_offset(slot) + (off_t)field, .l_len = 1 };
	if (fcntl(map_fd, F_OFD_GETLK, &fl) < 0)
		return -1;
	return fl.l_type != F_UNLCK;
}

/* Usage of a slice device, less what dead processes still hold (for read-only views). */
uint64_t hami_slice_live_used(int sdev)
{
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return 0;
	uint64_t used = __atomic_load_n(&f->device[sdev].memory_used, __ATOMIC_ACQUIRE);
	if (map_writable || map_fd < 0)
		return used;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		if (__atomic_load_n(&f->slot[i].state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE)
			continue;
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_offset(i), .l_len = 1 };
		if (fcntl(map_fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK) {
			uint64_t dead = __atomic_load_n(&f->slot[i].memory_used[sdev], __ATOMIC_ACQUIRE);
			used = used > dead ? used - dead : 0;
		}
	}
	return used;
}

/* ---- fork ----------------------------------------------------------------- */

/*
 * In a forked child (fork.c, every lock released): the child shares the
 * mapping but must not share the parent's slot: its inherited descriptor
 * holds the parent's lock, so it reopens the file (a new open file
 * description) and claims a slot of its own when it first charges.
 */
void hami_slice_after_fork(void)
{
	housekeeper_running = 0;
	slot_index = -1;
	memset(under_since, 0, sizeof(under_since));
	if (map_fd >= 0) {
		int fd = reopen(map_fd, map_writable);
		close(map_fd);
		map_fd = fd; /* -1: no slot for this child, its charges are refused */
	}
}
