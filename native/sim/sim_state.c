/*
 * The simulated GPU's shared state: configuration, the state file, process
 * entries and their liveness, memory charges and the device timelines.
 * See sim_state.h for the rules.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sim_state.h"
#include "../src/size.h"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to be shared");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free to be shared");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "atomic layout");

/* This process's view (one per copy of this file: each sim library has one). */
static struct {
	pthread_mutex_t mu; /* guards everything below and serializes sweeps */
	struct sim_state *st;
	int fd;
	int self; /* our entry, or -1 */
	dev_t dev;
	ino_t ino;
	uint64_t launch_ns; /* HAMI_SIM_LAUNCH_NS: this process's, not the state's */
	char path[PATH_MAX];
} g = {PTHREAD_MUTEX_INITIALIZER, NULL, -1, -1, 0, 0, 0, ""};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

uint64_t sim_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct sim_state *sim_st(void)
{
	return g.st;
}

const char *sim_path(void)
{
	return g.path;
}

/* ---- configuration ------------------------------------------------------ */

/* The library's size grammar (native/src/size.c); zero is refused here:
 * a GPU of no memory, or a context of none, is a mistake in the test. */
int sim_parse_size(const char *s, uint64_t *out)
{
	uint64_t v;
	if (hami_parse_size(s, &v) < 0 || v == 0)
		return -1;
	*out = v;
	return 0;
}

static int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	if (!*s)
		return -1;
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s))
			return -1;
		if (v > (max - (uint64_t)(*s - '0')) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

/* An empty variable counts as unset. */
static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static void bad(const char *var, const char *val, const char *why)
{
	fprintf(stderr, "hami-sim: invalid %s=\"%s\": %s\n", var, val, why);
}

static int valid_uuid(const char *s)
{
	/* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx */
	static const int dash[] = {8, 13, 18, 23};
	if (strncmp(s, "GPU-", 4) != 0 || strlen(s) != 40)
		return 0;
	s += 4;
	for (int i = 0, k = 0; i < 36; i++) {
		if (k < 4 && i == dash[k]) {
			if (s[i] != '-')
				return 0;
			k++;
		} else if (!isxdigit((unsigned char)s[i])) {
			return 0;
		}
	}
	return 1;
}

static int parse_uuids(const char *v, struct sim_config *cfg, int ndev_given)
{
	char buf[SIM_MAX_DEVICES * SIM_UUID_LEN + 64];
	unsigned n = 0;

	if (strlen(v) >= sizeof(buf)) {
		bad("HAMI_SIM_UUIDS", v, "too long");
		return -1;
	}
	strcpy(buf, v);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		size_t len = strlen(tok);
		while (len && tok[len - 1] == ' ')
			tok[--len] = 0;
		if (!valid_uuid(tok)) {
			fprintf(stderr, "hami-sim: invalid HAMI_SIM_UUIDS=\"%s\": \"%s\" is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\n",
				v, tok);
			return -1;
		}
		if (n == SIM_MAX_DEVICES) {
			bad("HAMI_SIM_UUIDS", v, "more than 16 UUIDs");
			return -1;
		}
		for (unsigned i = 0; i < n; i++) {
			if (strcasecmp(cfg->uuid[i], tok) == 0) {
				bad("HAMI_SIM_UUIDS", v, "a UUID appears twice");
				return -1;
			}
		}
		strcpy(cfg->uuid[n++], tok);
	}
	if (n == 0) {
		bad("HAMI_SIM_UUIDS", v, "no UUID");
		return -1;
	}
	if (!ndev_given) {
		cfg->ndev = n;
	} else if (n != cfg->ndev) {
		fprintf(stderr, "hami-sim: invalid HAMI_SIM_UUIDS=\"%s\": %u UUIDs for HAMI_SIM_DEVICES=%u devices\n", v, n,
			cfg->ndev);
		return -1;
	}
	return 0;
}

/* Parse every HAMI_SIM_* variable; prints what is wrong and returns
 * SIM_ECONFIG on the first malformed one. */
int sim_config_from_env(struct sim_config *cfg)
{
	const char *v;
	uint64_t n;

	memset(cfg, 0, sizeof(*cfg));
	cfg->ndev = SIM_DEFAULT_DEVICES;
	cfg->memory = SIM_DEFAULT_MEMORY;
	cfg->sm_count = SIM_DEFAULT_SM_COUNT;
	cfg->context_bytes = SIM_DEFAULT_CONTEXT_BYTES;
	cfg->ns_per_wave = SIM_DEFAULT_NS_PER_WAVE;
	cfg->module_bytes = SIM_DEFAULT_MODULE_BYTES;
	cfg->ckpt_min_free = SIM_DEFAULT_CKPT_FREE;
	strcpy(cfg->name, SIM_DEFAULT_NAME);

	if ((v = env("HAMI_SIM_DEVICES"))) {
		if (parse_uint(v, SIM_MAX_DEVICES, &n) < 0 || n == 0) {
			bad("HAMI_SIM_DEVICES", v, "expected a device count from 1 to 16");
			return SIM_ECONFIG;
		}
		cfg->ndev = (unsigned)n;
	}
	if ((v = env("HAMI_SIM_MEMORY"))) {
		if (sim_parse_size(v, &cfg->memory) < 0) {
			bad("HAMI_SIM_MEMORY", v, "expected bytes or a size like 16g, 512m, 1.5g");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_NAME"))) {
		if (strlen(v) >= SIM_NAME_LEN) {
			bad("HAMI_SIM_NAME", v, "longer than 95 bytes");
			return SIM_ECONFIG;
		}
		strcpy(cfg->name, v);
	}
	if ((v = env("HAMI_SIM_SM_COUNT"))) {
		if (parse_uint(v, 1000000, &n) < 0 || n == 0) {
			bad("HAMI_SIM_SM_COUNT", v, "expected a count from 1 to 1000000");
			return SIM_ECONFIG;
		}
		cfg->sm_count = (unsigned)n;
	}
	if ((v = env("HAMI_SIM_CONTEXT_BYTES"))) {
		if (strcmp(v, "0") == 0)
			cfg->context_bytes = 0;
		else if (sim_parse_size(v, &cfg->context_bytes) < 0) {
			bad("HAMI_SIM_CONTEXT_BYTES", v, "expected 0, bytes or a size like 64m");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_MODULE_BYTES"))) {
		if (strcmp(v, "0") == 0)
			cfg->module_bytes = 0;
		else if (sim_parse_size(v, &cfg->module_bytes) < 0) {
			bad("HAMI_SIM_MODULE_BYTES", v, "expected 0, bytes or a size like 2m");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_CKPT_FREE"))) {
		if (strcmp(v, "0") == 0)
			cfg->ckpt_min_free = 0;
		else if (sim_parse_size(v, &cfg->ckpt_min_free) < 0) {
			bad("HAMI_SIM_CKPT_FREE", v, "expected 0, bytes or a size like 8m");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_NS_PER_WAVE"))) {
		if (parse_uint(v, 1000000000000ull, &cfg->ns_per_wave) < 0) {
			bad("HAMI_SIM_NS_PER_WAVE", v, "expected nanoseconds from 0 to 10^12");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_LAUNCH_NS"))) {
		if (parse_uint(v, 1000000000ull, &cfg->launch_ns) < 0) {
			bad("HAMI_SIM_LAUNCH_NS", v, "expected nanoseconds from 0 to 10^9");
			return SIM_ECONFIG;
		}
	}
	if ((v = env("HAMI_SIM_UUIDS"))) {
		if (parse_uuids(v, cfg, env("HAMI_SIM_DEVICES") != NULL) < 0)
			return SIM_ECONFIG;
	} else {
		for (unsigned i = 0; i < cfg->ndev; i++)
			snprintf(cfg->uuid[i], SIM_UUID_LEN, "GPU-5a1f0000-0000-4000-8000-%012x", i);
	}
	return SIM_OK;
}

/* /tmp/hami-sim-<uid>/state; creates the directory (0700) and refuses one
 * that is not ours. */
int sim_default_path(char *buf, size_t len)
{
	char dir[64];
	struct stat sb;

	snprintf(dir, sizeof(dir), "/tmp/hami-sim-%u", (unsigned)getuid());
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "hami-sim: cannot create %s: %s\n", dir, strerror(errno));
		return SIM_EIO;
	}
	if (lstat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode) || sb.st_uid != getuid()) {
		fprintf(stderr, "hami-sim: %s is not a directory owned by uid %u; set HAMI_SIM_STATE\n", dir,
			(unsigned)getuid());
		return SIM_EIO;
	}
	if ((size_t)snprintf(buf, len, "%s/state", dir) >= len)
		return SIM_EIO;
	return SIM_OK;
}

/* ---- the state file ----------------------------------------------------- */

static struct sim_state *map_fd(int fd)
{
	void *p = mmap(NULL, sizeof(struct sim_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* Open an existing state file. -1 with errno ENOENT when there is none;
 * other failures are printed and return -2. */
static int open_existing(const char *path, struct sim_state **out)
{
	struct stat sb;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -1;
		fprintf(stderr, "hami-sim: cannot open state file %s: %s\n", path, strerror(errno));
		return -2;
	}
	if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < sizeof(struct sim_state)) {
		fprintf(stderr, "hami-sim: %s is not a simulated GPU state file of this version (size %lld)\n", path,
			(long long)sb.st_size);
		close(fd);
		return -2;
	}
	struct sim_state *st = map_fd(fd);
	if (!st) {
		fprintf(stderr, "hami-sim: cannot map %s: %s\n", path, strerror(errno));
		close(fd);
		return -2;
	}
	const struct sim_header *h = &st->hdr;
	if (memcmp(h->magic, SIM_MAGIC, 8) != 0 || h->version != SIM_VERSION || h->file_size != sizeof(*st) ||
	    h->max_devices != SIM_MAX_DEVICES || h->max_procs != SIM_MAX_PROCS || h->ndev == 0 ||
	    h->ndev > SIM_MAX_DEVICES) {
		fprintf(stderr, "hami-sim: %s is not a simulated GPU state file of this version\n", path);
		munmap(st, sizeof(*st));
		close(fd);
		return -2;
	}
	g.dev = sb.st_dev;
	g.ino = sb.st_ino;
	*out = st;
	return fd;
}

static void side_dirs_make(const char *state);

/* Create a fully initialised file beside PATH and link it into place.
 * Returns the fd, -1 with errno EEXIST when someone else was first, -2 on
 * other failures (printed). */
static int create_state(const char *path, const struct sim_config *cfg, struct sim_state **out)
{
	char tmp[PATH_MAX + 64];
	struct stat sb;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llx", path, (int)getpid(), (unsigned long long)sim_now_ns());
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
	if (fd < 0) {
		fprintf(stderr, "hami-sim: cannot create state file %s: %s\n", path, strerror(errno));
		return -2;
	}
	struct sim_state *st = NULL;
	if (ftruncate(fd, sizeof(*st)) < 0 || !(st = map_fd(fd)) || fstat(fd, &sb) < 0) {
		fprintf(stderr, "hami-sim: cannot size or map %s: %s\n", tmp, strerror(errno));
		goto fail;
	}
	struct sim_header *h = &st->hdr;
	memcpy(h->magic, SIM_MAGIC, 8);
	h->version = SIM_VERSION;
	h->ndev = cfg->ndev;
	h->file_size = sizeof(*st);
	h->max_devices = SIM_MAX_DEVICES;
	h->max_procs = SIM_MAX_PROCS;
	h->context_bytes = cfg->context_bytes;
	h->ns_per_wave = cfg->ns_per_wave;
	h->module_bytes = cfg->module_bytes;
	h->ckpt_min_free = cfg->ckpt_min_free;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	h->created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (unsigned i = 0; i < cfg->ndev; i++) {
		struct sim_device *d = &st->dev[i];
		strcpy(d->uuid, cfg->uuid[i]);
		strcpy(d->name, cfg->name);
		d->total = cfg->memory;
		d->sm_count = cfg->sm_count;
	}
	if (link(tmp, path) < 0) {
		int e = errno;
		if (e != EEXIST)
			fprintf(stderr, "hami-sim: cannot create state file %s: %s\n", path, strerror(e));
		munmap(st, sizeof(*st));
		close(fd);
		unlink(tmp);
		errno = e;
		return e == EEXIST ? -1 : -2;
	}
	unlink(tmp);
	side_dirs_make(path);
	g.dev = sb.st_dev;
	g.ino = sb.st_ino;
	*out = st;
	return fd;
fail:
	if (st)
		munmap(st, sizeof(*st));
	close(fd);
	unlink(tmp);
	return -2;
}

/* Fork: the child must not share our open file description, or it would
 * "hold" our entry's lock (and our locks would survive us in it). It gets a
 * fresh description of the same file and claims its own entry when needed. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&g.mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&g.mu);
}

/* A new open file description of the state file (not a dup). */
static int reopen(int fd)
{
	char p[40];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	int nfd = open(p, O_RDWR | O_CLOEXEC);
	if (nfd < 0 && g.path[0])
		nfd = open(g.path, O_RDWR | O_CLOEXEC);
	struct stat sb;
	if (nfd >= 0 && (fstat(nfd, &sb) < 0 || sb.st_dev != g.dev || sb.st_ino != g.ino)) {
		close(nfd);
		nfd = -1;
	}
	return nfd;
}

static void fork_child(void)
{
	if (g.fd >= 0) {
		int nfd = reopen(g.fd);
		close(g.fd);
		g.fd = nfd;
	}
	g.self = -1;
	pthread_mutex_unlock(&g.mu);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void sim_atfork_init(void)
{
	pthread_once(&atfork_once, register_atfork);
}

int sim_open(const char *path)
{
	struct sim_config cfg;
	struct sim_state *st = NULL;
	char def[PATH_MAX];
	int fd = -2, rc;

	sim_atfork_init();
	pthread_mutex_lock(&g.mu);
	if (g.st) {
		pthread_mutex_unlock(&g.mu);
		return SIM_OK;
	}
	/* Parsed even when the file exists (its values then lose), so a
	 * malformed variable is always reported. */
	if ((rc = sim_config_from_env(&cfg)) < 0)
		goto out;
	if (!path)
		path = env("HAMI_SIM_STATE");
	if (!path) {
		if ((rc = sim_default_path(def, sizeof(def))) < 0)
			goto out;
		path = def;
	}
	if (strlen(path) >= sizeof(g.path)) {
		fprintf(stderr, "hami-sim: state path too long\n");
		rc = SIM_EIO;
		goto out;
	}
	/* Either open the file or create it; a race with a concurrent creator
	 * or a reset ends in one of the two within a few rounds. */
	for (int tries = 0; tries < 16 && fd < 0; tries++) {
		fd = open_existing(path, &st);
		if (fd == -1)
			fd = create_state(path, &cfg, &st);
		if (fd == -2)
			break;
	}
	if (fd < 0) {
		if (fd == -1)
			fprintf(stderr, "hami-sim: cannot open or create %s\n", path);
		rc = SIM_EIO;
		goto out;
	}
	strcpy(g.path, path);
	__atomic_store_n(&g.launch_ns, cfg.launch_ns, __ATOMIC_RELAXED);
	/* Entry locks go on a description of their own: the one the mapping was
	 * made from lives on in forked children's mappings, and would keep a dead
	 * parent's locks with it. */
	g.fd = reopen(fd);
	close(fd);
	if (g.fd < 0) {
		fprintf(stderr, "hami-sim: cannot reopen %s: %s\n", path, strerror(errno));
		munmap(st, sizeof(*st));
		rc = SIM_EIO;
		goto out;
	}
	g.st = st;
	g.self = -1;
	rc = SIM_OK;
out:
	pthread_mutex_unlock(&g.mu);
	return rc;
}

void sim_close(void)
{
	pthread_mutex_lock(&g.mu);
	if (g.st)
		munmap(g.st, sizeof(*g.st));
	if (g.fd >= 0)
		close(g.fd);
	g.st = NULL;
	g.fd = -1;
	g.self = -1;
	pthread_mutex_unlock(&g.mu);
}

/* ---- process entries ---------------------------------------------------- */

static int entry_lock(unsigned i, short type)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = (off_t)(offsetof(struct sim_state, proc) + i * sizeof(struct sim_proc));
	fl.l_len = 1;
	return fcntl(g.fd, F_OFD_SETLK, &fl);
}

/* Entry I's checkpoint lock (its second byte) on description FD; WAIT: block
 * until it can be had. */
static int ckpt_lock_fd(int fd, unsigned i, short type, int wait)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = type;
	fl.l_whence = SEEK_SET;
	fl.l_start = (off_t)(offsetof(struct sim_state, proc) + i * sizeof(struct sim_proc) + 1);
	fl.l_len = 1;
	int r;
	while ((r = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl)) < 0 && wait && errno == EINTR)
		;
	return r;
}

/* Before a reclaim: no checkpoint call may be at work on the entry. */
static int ckpt_lock(unsigned i, short type)
{
	return ckpt_lock_fd(g.fd, i, type, 0);
}

/* 1 when another open file description (a live process, or the other sim
 * library of this process) holds entry I's lock. */
static int entry_held(unsigned i)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	fl.l_start = (off_t)(offsetof(struct sim_state, proc) + i * sizeof(struct sim_proc));
	fl.l_len = 1;
	if (fcntl(g.fd, F_OFD_GETLK, &fl) < 0)
		return 1; /* cannot tell: never reclaim on doubt */
	return fl.l_type != F_UNLCK;
}

static void dev_sub(unsigned d, uint64_t bytes)
{
	_Atomic uint64_t *u = &g.st->dev[d].used;
	uint64_t old = atomic_load(u), nu;
	do
		nu = old > bytes ? old - bytes : 0;
	while (!atomic_compare_exchange_weak(u, &old, nu));
}

static void sub32_clamped(_Atomic uint32_t *v, uint32_t n)
{
	uint32_t old = atomic_load(v), nu;
	do
		nu = old > n ? old - n : 0;
	while (!atomic_compare_exchange_weak(v, &old, nu));
}

/* ---- side files ---------------------------------------------------------- */

int sim_side_path(const char *kind, unsigned entry, char *buf, size_t len)
{
	if (!g.path[0] || (size_t)snprintf(buf, len, "%s.%s/%u", g.path, kind, entry) >= len)
		return SIM_EIO;
	return SIM_OK;
}

static void side_unlink(const char *kind, unsigned entry)
{
	char path[PATH_MAX + 32];
	if (sim_side_path(kind, entry, path, sizeof(path)) == SIM_OK)
		unlink(path);
}

static const char *const side_kinds[] = {"mem", "ckpt"};

int sim_side_mkdir(const char *dir)
{
	if (mkdir(dir, 01777) < 0)
		return errno == EEXIST ? 0 : -1;
	return chmod(dir, 01777); /* the umask took bits away */
}

int sim_side_open(const char *path, int trunc)
{
	int flags = O_RDWR | O_CLOEXEC | (trunc ? O_TRUNC : 0);
	int fd = open(path, flags | O_CREAT | O_EXCL, 0666);
	if (fd >= 0) {
		if (fchmod(fd, 0666) < 0) {
			int e = errno;
			close(fd);
			unlink(path);
			errno = e;
			return -1;
		}
		return fd;
	}
	if (errno != EEXIST)
		return -1;
	return open(path, flags);
}

/* The side folders of a new state, made by its creator (often root, in a
 * folder only root may write) for every user who will use it. */
static void side_dirs_make(const char *state)
{
	char dir[PATH_MAX + 32];
	for (size_t k = 0; k < sizeof(side_kinds) / sizeof(side_kinds[0]); k++)
		if ((size_t)snprintf(dir, sizeof(dir), "%s.%s", state, side_kinds[k]) < sizeof(dir) &&
		    sim_side_mkdir(dir) < 0)
			fprintf(stderr, "hami-sim: cannot create %s: %s\n", dir, strerror(errno));
}

void sim_side_clear(const char *state)
{
	char dir[PATH_MAX + 32], path[PATH_MAX + 320];
	for (size_t k = 0; k < sizeof(side_kinds) / sizeof(side_kinds[0]); k++) {
		if ((size_t)snprintf(dir, sizeof(dir), "%s.%s", state, side_kinds[k]) >= sizeof(dir))
			continue;
		DIR *d = opendir(dir);
		if (!d)
			continue;
		for (struct dirent *e; (e = readdir(d));) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < sizeof(path))
				unlink(path);
		}
		closedir(d);
		rmdir(dir);
	}
}

/* Give a dead entry's memory back. Only called holding the entry's lock and
 * its checkpoint lock, and atomic_exchange makes each byte come back once
 * even if we die here. Its device memory's contents go too, and so does its
 * checkpoint's host copy: both lived in its address space. Parked bytes are
 * on no device: they are only forgotten. */
static void reclaim(struct sim_proc *p)
{
	unsigned i = (unsigned)(p - g.st->proc);
	side_unlink("mem", i);
	side_unlink("ckpt", i);
	atomic_store(&p->cuda, 0);
	atomic_store(&p->ckpt, SIM_CKPT_RUNNING);
	atomic_store(&p->inflight, 0);
	atomic_store(&p->graphics, 0);
	atomic_store(&p->locks, 0);
	for (unsigned d = 0; d < SIM_MAX_DEVICES; d++) {
		atomic_store(&p->parked[d], 0);
		atomic_store(&p->graph[d], 0);
		atomic_store(&p->internal[d], 0);
		uint64_t v = atomic_exchange(&p->used[d], 0);
		if (v)
			dev_sub(d, v);
		uint32_t n = atomic_exchange(&p->decoders[d], 0);
		if (n)
			sub32_clamped(&g.st->dev[d].decoders, n);
		atomic_store(&p->contexts[d], 0);
	}
	atomic_store(&p->pid, 0);
	atomic_store(&p->state, SIM_PROC_FREE);
}

/* Start time (clock ticks since boot, /proc/PID/stat field 22) of process
 * PID in our pid namespace; 0 when it does not exist or cannot be read. */
static uint64_t start_ticks_of(int32_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* Fields after the ")" of comm start at 3. */
	char *p = strrchr(buf, ')');
	for (int field = 2; p && field < 22; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

static uint64_t own_pidns(void)
{
	struct stat sb;
	return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static void self_ident(int32_t *pid, uint64_t *start, uint64_t *ns)
{
	*pid = (int32_t)getpid();
	*ns = own_pidns();
	*start = start_ticks_of(*pid);
}

/*
 * Whether the process an entry names is gone although the entry's lock is
 * held: a new process has just taken the entry over and not yet reclaimed
 * what the dead one held (it may even be stopped right there). The real
 * driver never lists a dead process, so neither do we. Only a process of our
 * own pid namespace can be looked up; any other counts as there.
 */
int sim_entry_owner_gone(unsigned i)
{
	const struct sim_proc *p = &g.st->proc[i];
	int32_t pid = atomic_load(&p->pid);
	uint64_t ns = atomic_load(&p->pidns), start = atomic_load(&p->start_ticks);
	if (pid <= 0 || !ns || ns != own_pidns() || !start)
		return 0;
	return start_ticks_of(pid) != start;
}

int sim_self(void)
{
	int32_t pid;
	uint64_t start, ns;

	pthread_mutex_lock(&g.mu);
	int rc = g.self;
	if (rc >= 0)
		goto out;
	rc = SIM_EIO;
	if (!g.st || g.fd < 0)
		goto out;
	self_ident(&pid, &start, &ns);
	/* The other sim library in this process may have claimed already. */
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &g.st->proc[i];
		if (atomic_load(&p->state) == SIM_PROC_LIVE && atomic_load(&p->pid) == pid &&
		    atomic_load(&p->start_ticks) == start && atomic_load(&p->pidns) == ns && entry_held(i)) {
			g.self = rc = (int)i;
			goto out;
		}
	}
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		if (entry_lock(i, F_WRLCK) < 0)
			continue; /* a live owner */
		struct sim_proc *p = &g.st->proc[i];
		if (atomic_load(&p->state) != SIM_PROC_FREE) {
			/* Its owner died; a checkpoint call still at work on it
			 * keeps it for now. */
			if (ckpt_lock(i, F_WRLCK) < 0) {
				entry_lock(i, F_UNLCK);
				continue;
			}
			reclaim(p);
			ckpt_lock(i, F_UNLCK);
		}
		atomic_store(&p->cuda, 0);
		atomic_store(&p->ckpt, SIM_CKPT_RUNNING);
		atomic_store(&p->inflight, 0);
		atomic_store(&p->graphics, 0);
		atomic_store(&p->locks, 0);
		for (unsigned d = 0; d < SIM_MAX_DEVICES; d++) {
			atomic_store(&p->parked[d], 0);
			atomic_store(&p->graph[d], 0);
			atomic_store(&p->internal[d], 0);
			atomic_store(&p->busy_ns[d], 0);
			for (unsigned k = 0; k < SIM_UTIL_SLOTS; k++)
				atomic_store(&p->util[d][k], 0);
		}
		atomic_store(&p->start_ticks, start);
		atomic_store(&p->pidns, ns);
		atomic_store(&p->pid, pid);
		atomic_store(&p->state, SIM_PROC_LIVE);
		g.self = rc = (int)i;
		goto out;
	}
	fprintf(stderr, "hami-sim: all %d process entries of %s are taken by live processes\n", SIM_MAX_PROCS,
		g.path);
	rc = SIM_EFULL;
out:
	pthread_mutex_unlock(&g.mu);
	return rc;
}

void sim_sweep(void)
{
	pthread_mutex_lock(&g.mu);
	for (unsigned i = 0; g.st && g.fd >= 0 && i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &g.st->proc[i];
		/* Our own entry: our description's lock would not conflict. */
		if ((int)i == g.self || atomic_load(&p->state) == SIM_PROC_FREE)
			continue;
		if (entry_lock(i, F_WRLCK) < 0)
			continue; /* alive */
		if (ckpt_lock(i, F_WRLCK) == 0) { /* else a checkpoint call holds it: later */
			if (atomic_load(&p->state) != SIM_PROC_FREE)
				reclaim(p);
			ckpt_lock(i, F_UNLCK);
		}
		entry_lock(i, F_UNLCK);
	}
	pthread_mutex_unlock(&g.mu);
}

int sim_proc_alive(unsigned i)
{
	pthread_mutex_lock(&g.mu);
	int alive = (int)i == g.self || (g.fd >= 0 && atomic_load(&g.st->proc[i].state) == SIM_PROC_LIVE && entry_held(i) &&
					   !sim_entry_owner_gone(i));
	pthread_mutex_unlock(&g.mu);
	return alive;
}

/* ---- memory ------------------------------------------------------------- */

static int dev_add(unsigned d, uint64_t bytes)
{
	struct sim_device *dv = &g.st->dev[d];
	uint64_t old = atomic_load(&dv->used), nu;
	do {
		if (old > dv->total || bytes > dv->total - old)
			return 0;
		nu = old + bytes;
	} while (!atomic_compare_exchange_weak(&dv->used, &old, nu));
	uint64_t pk = atomic_load(&dv->peak_used);
	while (pk < nu && !atomic_compare_exchange_weak(&dv->peak_used, &pk, nu))
		;
	return 1;
}

/* Device first, then our entry: dying in between leaves the bytes charged
 * (never lets the device look emptier than it is). */
int sim_charge(unsigned d, uint64_t bytes)
{
	if (bytes == 0)
		return SIM_OK;
	int self = sim_self();
	if (self < 0)
		return self;
	for (int pass = 0; pass < 2; pass++) {
		if (dev_add(d, bytes)) {
			atomic_fetch_add(&g.st->proc[self].used[d], bytes);
			return SIM_OK;
		}
		if (pass == 0)
			sim_sweep(); /* a dead process's memory may be waiting */
	}
	return SIM_ENOMEM;
}

static void sub_clamped(_Atomic uint64_t *v, uint64_t n)
{
	uint64_t old = atomic_load(v), nu;
	do
		nu = old > n ? old - n : 0;
	while (!atomic_compare_exchange_weak(v, &old, nu));
}

/* Entry first, then the device (same reason as in sim_charge). */
void sim_uncharge(unsigned d, uint64_t bytes)
{
	if (bytes == 0 || !g.st)
		return;
	int self = sim_self();
	if (self >= 0)
		sub_clamped(&g.st->proc[self].used[d], bytes);
	dev_sub(d, bytes);
}

void sim_ctx_count(unsigned d, int delta)
{
	int self = sim_self();
	if (self < 0)
		return;
	_Atomic uint32_t *c = &g.st->proc[self].contexts[d];
	if (delta > 0) {
		atomic_fetch_add(c, (uint32_t)delta);
	} else {
		uint32_t old = atomic_load(c), nu;
		do
			nu = old > (uint32_t)-delta ? old + (uint32_t)delta : 0;
		while (!atomic_compare_exchange_weak(c, &old, nu));
	}
}

/* Device first, then our entry, when one is added; entry first, then the
 * device, when one goes (as with memory: never fewer on the device than in
 * the entries). */
void sim_decoder_count(unsigned d, int delta)
{
	int self = sim_self();
	if (self < 0 || !g.st || d >= SIM_MAX_DEVICES)
		return;
	if (delta > 0) {
		atomic_fetch_add(&g.st->dev[d].decoders, (uint32_t)delta);
		atomic_fetch_add(&g.st->proc[self].decoders[d], (uint32_t)delta);
	} else if (delta < 0) {
		sub32_clamped(&g.st->proc[self].decoders[d], (uint32_t)-delta);
		sub32_clamped(&g.st->dev[d].decoders, (uint32_t)-delta);
	}
}

void sim_note_graph(unsigned d, uint64_t bytes)
{
	int self = sim_self();
	if (self >= 0 && d < SIM_MAX_DEVICES)
		atomic_store(&g.st->proc[self].graph[d], bytes);
}

void sim_note_internal(unsigned d, uint64_t bytes)
{
	int self = sim_self();
	if (self >= 0 && d < SIM_MAX_DEVICES)
		atomic_store(&g.st->proc[self].internal[d], bytes);
}

int sim_set_graphics(int on)
{
	int self = sim_self();
	if (self < 0)
		return self;
	atomic_store(&g.st->proc[self].graphics, on ? 1u : 0u);
	return SIM_OK;
}

/* ---- time --------------------------------------------------------------- */

static void slot_add(_Atomic uint64_t *s, uint64_t slot, uint64_t ns)
{
	uint32_t tag = (uint32_t)slot;
	uint64_t old = atomic_load(s), nu;
	do {
		uint32_t cur = (uint32_t)(old >> 32);
		if (cur == tag)
			nu = old + ns;
		else if ((int32_t)(cur - tag) > 0)
			return; /* the slot already moved on: too old to matter */
		else
			nu = (uint64_t)tag << 32 | ns;
	} while (!atomic_compare_exchange_weak(s, &old, nu));
}

/* Spread [start, end) over the slots it covers. */
static void util_add(_Atomic uint64_t *ring, uint64_t start, uint64_t end, uint64_t now)
{
	uint64_t last = now / SIM_UTIL_SLOT_NS + SIM_UTIL_SLOTS - SIM_UTIL_WINDOW - 2;
	for (uint64_t t = start; t < end;) {
		uint64_t slot = t / SIM_UTIL_SLOT_NS;
		if (slot > last)
			break; /* beyond the ring's reach */
		uint64_t seg = (slot + 1) * SIM_UTIL_SLOT_NS;
		if (seg > end)
			seg = end;
		slot_add(&ring[slot % SIM_UTIL_SLOTS], slot, seg - t);
		t = seg;
	}
}

/* Busy ns in slots [first, first + n); a slot whose tag is another slot's
 * (one no launch touched since the ring came round) counts 0. */
static uint64_t slots_sum(_Atomic uint64_t *ring, uint64_t first, uint64_t n)
{
	uint64_t sum = 0;
	for (uint64_t slot = first; slot < first + n; slot++) {
		uint64_t v = atomic_load(&ring[slot % SIM_UTIL_SLOTS]);
		if ((uint32_t)(v >> 32) == (uint32_t)slot)
			sum += v & 0xffffffffu;
	}
	return sum;
}

static unsigned pct_of(uint64_t busy, uint64_t span)
{
	uint64_t pct = (busy * 100 + span / 2) / span;
	return pct > 100 ? 100 : (unsigned)pct;
}

unsigned sim_util_pct(_Atomic uint64_t *ring)
{
	uint64_t cur = sim_now_ns() / SIM_UTIL_SLOT_NS;
	if (cur < SIM_UTIL_WINDOW)
		return 0;
	return pct_of(slots_sum(ring, cur - SIM_UTIL_WINDOW, SIM_UTIL_WINDOW), SIM_UTIL_WINDOW * SIM_UTIL_SLOT_NS);
}

_Static_assert(SIM_SAMPLE_NS % SIM_UTIL_SLOT_NS == 0, "a sample period is whole slots");
_Static_assert(SIM_SAMPLE_NS / SIM_UTIL_SLOT_NS <= SIM_UTIL_WINDOW, "the ring keeps a whole period");

uint64_t sim_sample_end(uint64_t now)
{
	return now / SIM_SAMPLE_NS * SIM_SAMPLE_NS;
}

/* Work is recorded when queued, always at or after the moment of queueing, so
 * a period that has ended can no longer change. */
uint64_t sim_sample_busy(_Atomic uint64_t *ring, uint64_t end)
{
	if (end < SIM_SAMPLE_NS)
		return 0;
	return slots_sum(ring, (end - SIM_SAMPLE_NS) / SIM_UTIL_SLOT_NS, SIM_SAMPLE_NS / SIM_UTIL_SLOT_NS);
}

unsigned sim_sample_pct(_Atomic uint64_t *ring, uint64_t end)
{
	return pct_of(sim_sample_busy(ring, end), SIM_SAMPLE_NS);
}

uint64_t sim_slot_busy(_Atomic uint64_t *ring, uint64_t slot)
{
	return slots_sum(ring, slot, 1);
}

/* The device runs kernels one after another, whoever queued them: reserve
 * [max(now, busy_until), +dur) with compare-and-swap. */
uint64_t sim_launch(unsigned d, uint64_t dur)
{
	struct sim_device *dv = &g.st->dev[d];
	int self = sim_self();
	uint64_t now = sim_now_ns(), start, end;
	uint64_t old = atomic_load(&dv->busy_until_ns);
	do {
		start = old > now ? old : now;
		end = start + dur < start ? UINT64_MAX : start + dur;
	} while (!atomic_compare_exchange_weak(&dv->busy_until_ns, &old, end));
	atomic_fetch_add(&dv->busy_total_ns, end - start);
	util_add(dv->util, start, end, now);
	if (self >= 0) {
		atomic_fetch_add(&g.st->proc[self].busy_ns[d], end - start);
		util_add(g.st->proc[self].util[d], start, end, now);
	}
	return end;
}

/*
 * A real driver's launch costs its thread CPU time (cuLaunchKernel about 4 us
 * on an H100), so a loop of short kernels is paced by its launches and leaves
 * the GPU idle part of the time. Spent spinning, as the driver's own work is.
 */
void sim_launch_cpu(void)
{
	uint64_t ns = __atomic_load_n(&g.launch_ns, __ATOMIC_RELAXED);
	if (!ns)
		return;
	for (uint64_t end = sim_now_ns() + ns; sim_now_ns() < end;)
		;
}

/* ---- checkpoints -------------------------------------------------------- */

/* A missed wake costs a blocked call at most this. */
#define GATE_POLL_NS 10000000ull

void sim_shared_wait(_Atomic uint32_t *w, uint32_t val, uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	/* Not FUTEX_PRIVATE: the word is in a file other processes map. */
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

void sim_shared_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void sim_mark_cuda(void)
{
	int self = sim_self();
	if (self >= 0)
		atomic_store(&g.st->proc[self].cuda, 1);
}

/* With a lock's controller: it sets the state, then reads the count; we add
 * to the count, then read the state (all sequentially consistent). So either
 * it sees our call and waits for it, or we see its state and step back. */
int sim_gate_enter(void)
{
	pthread_mutex_lock(&g.mu);
	struct sim_state *st = g.st;
	int i = st ? g.self : -1;
	pthread_mutex_unlock(&g.mu);
	if (i < 0)
		return -1; /* no entry: nobody can name us */
	struct sim_proc *p = &st->proc[i];
	for (;;) {
		uint32_t c = atomic_load(&p->ckpt);
		if (c != SIM_CKPT_RUNNING) {
			sim_shared_wait(&p->ckpt, c, GATE_POLL_NS);
			continue;
		}
		atomic_fetch_add(&p->inflight, 1);
		if (atomic_load(&p->ckpt) == SIM_CKPT_RUNNING)
			return i;
		sim_gate_leave(i);
	}
}

void sim_gate_leave(int i)
{
	if (i < 0)
		return;
	struct sim_proc *p = &g.st->proc[i];
	if (atomic_fetch_sub(&p->inflight, 1) == 1 && atomic_load(&p->ckpt) != SIM_CKPT_RUNNING)
		sim_shared_wake(&p->inflight);
}

/* 1 when a description other than FD holds entry I's first byte: its owner
 * lives (our own process included: FD is not the description it holds). */
static int owned(int fd, unsigned i)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	fl.l_start = (off_t)(offsetof(struct sim_state, proc) + i * sizeof(struct sim_proc));
	fl.l_len = 1;
	if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
		return 1; /* cannot tell: take it as alive */
	return fl.l_type != F_UNLCK;
}

int sim_target_open(int32_t pid, struct sim_target *t)
{
	int32_t me;
	uint64_t start, ns;

	if (pid <= 0)
		return SIM_ENOENT;
	self_ident(&me, &start, &ns);
	pthread_mutex_lock(&g.mu);
	int fd = g.st && g.fd >= 0 ? reopen(g.fd) : -1;
	pthread_mutex_unlock(&g.mu);
	if (fd < 0)
		return SIM_EIO;
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &g.st->proc[i];
		if (atomic_load(&p->state) != SIM_PROC_LIVE || atomic_load(&p->pid) != pid)
			continue;
		uint64_t pns = atomic_load(&p->pidns);
		if (ns && pns && pns != ns)
			continue; /* the same number in another pid namespace */
		if (ckpt_lock_fd(fd, i, F_RDLCK, 1) < 0)
			continue;
		/* Held now; a reclaim may have come first, so look again. */
		if (atomic_load(&p->state) == SIM_PROC_LIVE && atomic_load(&p->pid) == pid &&
		    atomic_load(&p->cuda) && owned(fd, i)) {
			*t = (struct sim_target){i, pid, atomic_load(&p->start_ticks), fd};
			return SIM_OK;
		}
		ckpt_lock_fd(fd, i, F_UNLCK, 0);
	}
	close(fd);
	return SIM_ENOENT;
}

void sim_target_close(struct sim_target *t)
{
	if (t->fd >= 0)
		close(t->fd); /* drops the checkpoint lock */
	t->fd = -1;
}

int sim_target_alive(const struct sim_target *t)
{
	const struct sim_proc *p = &g.st->proc[t->entry];
	return atomic_load(&p->state) == SIM_PROC_LIVE && atomic_load(&p->pid) == t->pid &&
	       atomic_load(&p->start_ticks) == t->start_ticks && owned(t->fd, t->entry);
}

/* Our own shared hold does not conflict with a probe from our description;
 * anyone else's does. */
int sim_target_busy(const struct sim_target *t)
{
	struct flock fl;
	memset(&fl, 0, sizeof(fl));
	fl.l_type = F_WRLCK;
	fl.l_whence = SEEK_SET;
	fl.l_start = (off_t)(offsetof(struct sim_state, proc) + t->entry * sizeof(struct sim_proc) + 1);
	fl.l_len = 1;
	if (fcntl(t->fd, F_OFD_GETLK, &fl) < 0)
		return 1;
	return fl.l_type != F_UNLCK;
}

/* Entry first, then the device, as in sim_uncharge. */
void sim_park(unsigned i)
{
	struct sim_proc *p = &g.st->proc[i];
	for (unsigned d = 0; d < SIM_MAX_DEVICES; d++) {
		uint64_t v = atomic_exchange(&p->used[d], 0);
		if (!v)
			continue;
		atomic_fetch_add(&p->parked[d], v);
		dev_sub(d, v);
	}
}

/* Devices first, then the entry, as in sim_charge; all devices or none. */
int sim_unpark(unsigned i)
{
	struct sim_proc *p = &g.st->proc[i];
	for (int pass = 0; pass < 2; pass++) {
		unsigned d;
		for (d = 0; d < SIM_MAX_DEVICES; d++) {
			uint64_t v = atomic_load(&p->parked[d]);
			if (v && !dev_add(d, v))
				break;
		}
		if (d == SIM_MAX_DEVICES) {
			for (d = 0; d < SIM_MAX_DEVICES; d++)
				atomic_fetch_add(&p->used[d], atomic_exchange(&p->parked[d], 0));
			return SIM_OK;
		}
		while (d-- > 0)
			dev_sub(d, atomic_load(&p->parked[d]));
		if (pass == 0)
			sim_sweep(); /* a dead process's memory may be waiting */
	}
	return SIM_ENOMEM;
}
