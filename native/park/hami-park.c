/*
 * hami-park: moves one process's GPU state to host memory and back, with the
 * CUDA driver's process checkpoint API (docs/parking.md).
 *
 *   hami-park park SLICE_FILE PID [LOCK_TIMEOUT_MS [REASON]]
 *                                                     the process parks itself when its library
 *                                                     can (the fast park), else lock, checkpoint;
 *                                                     the slot says PARKED and why: REASON idle
 *                                                     (the default), asked, room or guard
 *   hami-park hold PID [LOCK_TIMEOUT_MS]              lock, checkpoint, and nothing else: a process
 *                                                     the guard parks (it may have no slot, and only
 *                                                     an administrator's restore brings it back)
 *   hami-park restore PID [UUID=BYTES[+KEEP]...]     restore, unlock (run by the parked process, or
 *                                                     for a held one by an administrator); first,
 *                                                     each GPU named must have BYTES free beyond KEEP
 *   hami-park recover PID                             undo a park whose parker died
 *   hami-park state PID                               the driver's word on PID
 *
 * It runs without the preload library, as the user of the target process (or
 * root), and every verb acts only for them: run by anyone else it refuses
 * before it reaches the driver (the binary is world-executable, and "hold" of
 * another user's kernel would freeze it). The driver has a rule of its own
 * (docs/parking.md, "Who may park whom"); this one does not lean on it. Park
 * also acts only on a process whose owner (its real uid) owns the slice file,
 * through the slot that names it in its own PID namespace: the file is written
 * by its user, so a slot naming another user's process is refused. It answers
 * with one line on stdout: "ok ..." or "error <code> <why>", the code the
 * driver's CUresult, or one of HAMI_PARK_REFUSED_* (slice_file.h) when what
 * the slot says stands in the way; the exit status is 0 or 1. A park that
 * fails half-way is undone: the target is never left locked.
 *
 * Park writes the target's slot: park_state from RUNNING to PARKING (compare
 * and swap), then PARKED, holding an OFD lock on park_state's first byte all
 * along, so that the target's housekeeper can tell a parker at work from one
 * that died (and then runs "recover"). The reason goes to park_reason before
 * PARKED is published. Everything else of the slot, the charge included, the
 * target itself moves (and it clears park_reason when it resumes).
 *
 * The fast park (docs/parking.md): a target whose slot says it can
 * (park_fast_able) is first asked, through its slot's park_fast, to move its
 * memory itself. It takes the request within ANSWER_MS or is checkpointed;
 * while it waits for its threads and its GPU work (up to LOCK_TIMEOUT_MS) the
 * request may still be withdrawn for the checkpoint; once it copies, it
 * answers DONE (parked) or FAILED (nothing lost, it runs on). It refuses when
 * it holds memory it cannot move: then it is checkpointed. The answer line
 * ends with the path taken: "ok BYTES SECONDS fast|checkpoint".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hami/cuda_types.h"
#include "hami/slice_file.h"

#define DEFAULT_LOCK_TIMEOUT_MS 10000 /* a kernel busy that long is not idle */
#define ANSWER_MS 3000                /* a process that has not taken a fast park's request by then does not answer */

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*lock_fn)(int, CUcheckpointLockArgs *);
typedef CUresult (*checkpoint_fn)(int, CUcheckpointCheckpointArgs *);
typedef CUresult (*restore_fn)(int, CUcheckpointRestoreArgs *);
typedef CUresult (*unlock_fn)(int, CUcheckpointUnlockArgs *);
typedef CUresult (*state_fn)(int, CUprocessState *);

static struct {
	lock_fn lock;
	checkpoint_fn checkpoint;
	restore_fn restore;
	unlock_fn unlock;
	state_fn state;
} cu;

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(int rc, const char *fmt, ...)
{
	va_list ap;
	printf("error %d ", rc);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	return 1;
}

/* The driver's words for the results a park meets most. */
static const char *result_name(int rc)
{
	switch (rc) {
	case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory on the GPU: the checkpoint needs room of its own";
	case CUDA_ERROR_TIMEOUT: return "timed out: the process stayed busy inside the driver";
	case CUDA_ERROR_ILLEGAL_STATE: return "the driver holds the process in another checkpoint state";
	case CUDA_ERROR_NOT_PERMITTED: return "not permitted";
	default: return "the driver's error";
	}
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The real driver's checkpoint entry points; CUDA_SUCCESS or why not. */
static int load_driver(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return fail(CUDA_ERROR_NOT_FOUND, "cannot load libcuda.so.1: %s", dlerror());
	init_fn init = (init_fn)dlsym(lib, "cuInit");
	cu.lock = (lock_fn)dlsym(lib, "cuCheckpointProcessLock");
	cu.checkpoint = (checkpoint_fn)dlsym(lib, "cuCheckpointProcessCheckpoint");
	cu.restore = (restore_fn)dlsym(lib, "cuCheckpointProcessRestore");
	cu.unlock = (unlock_fn)dlsym(lib, "cuCheckpointProcessUnlock");
	cu.state = (state_fn)dlsym(lib, "cuCheckpointProcessGetState");
	if (!init || !cu.lock || !cu.checkpoint || !cu.restore || !cu.unlock || !cu.state)
		return fail(CUDA_ERROR_NOT_SUPPORTED, "this CUDA driver has no process checkpoint API "
			    "(driver 550 or newer has it)");
	init(0); /* the checkpoint calls need the driver up; they work on another process */
	return 0;
}

static int parse_pid(const char *text, int *pid)
{
	char *end;
	long v = strtol(text, &end, 10);
	if (*text == '\0' || *end != '\0' || v <= 0 || v > 4194304)
		return -1;
	*pid = (int)v;
	return 0;
}

/* ---- the slice file ------------------------------------------------------- */

static int ofd(int fd, off_t at, short type, int cmd)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1 };
	if (fcntl(fd, cmd, &fl) < 0)
		return -1;
	return cmd == F_OFD_GETLK ? fl.l_type != F_UNLCK : 0;
}

static off_t slot_at(int i)
{
	return (off_t)(offsetof(struct hami_slice_file, slot) + (size_t)i * sizeof(struct hami_slot));
}

static uint64_t own_pid_namespace(void)
{
	struct stat st;
	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/*
 * How the target's own PID namespace knows it: the inode of its namespace and
 * the last field of NSpid. A slot holds those, so a kernel in a container's
 * PID namespace (a pod) is found by a parker on the host (hostPID) too.
 * 0 when /proc does not tell: the caller then compares with its own.
 */
static uint64_t target_namespace(int pid, int *ns_pid)
{
	char path[64], line[256];
	struct stat st;
	snprintf(path, sizeof(path), "/proc/%d/ns/pid", pid);
	if (stat(path, &st) < 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "re");
	int found = 0;
	while (f && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "NSpid:", 6) != 0)
			continue;
		for (char *tok = strtok(line + 6, " \t\n"); tok; tok = strtok(NULL, " \t\n"))
			found = atoi(tok); /* the last one: its PID in its own namespace */
		break;
	}
	if (f)
		fclose(f);
	if (found <= 0)
		return 0;
	*ns_pid = found;
	return (uint64_t)st.st_ino;
}

/* The real uid of PID (the first field of Uid: in /proc/PID/status); -1 when gone. */
static int process_uid(int pid, uid_t *uid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "re");
	int found = -1;
	unsigned long v;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %lu", &v) == 1) {
			*uid = (uid_t)v;
			found = 0;
			break;
		}
	if (f)
		fclose(f);
	return found;
}

/*
 * Whether the caller may act on PID: root may act on any process, anyone else
 * only on their own (the target's real uid is the caller's real and
 * effective uid). 0, or -1 after saying why.
 */
static int may_act_on(int pid)
{
	uid_t owner;
	if (process_uid(pid, &owner) < 0)
		return fail(CUDA_ERROR_INVALID_VALUE, "process %d is gone", pid), -1;
	if (geteuid() == 0 || (owner == getuid() && owner == geteuid()))
		return 0;
	return fail(CUDA_ERROR_NOT_PERMITTED, "process %d belongs to uid %u; uid %u may act only on its own "
		    "processes (root on any): nothing done", pid, (unsigned)owner, (unsigned)getuid()), -1;
}

static uint64_t host_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kib = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kib * 1024;
}

/* Map SLICE_FILE and find PID's live slot; -1 after saying why. */
static int find_slot(const char *path, int pid, int *fd_out, struct hami_slice_file **map, int *index)
{
	int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return fail(CUDA_ERROR_INVALID_VALUE, "cannot open slice file %s: %s", path, strerror(errno)), -1;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size < sizeof(struct hami_slice_file)) {
		close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE, "%s is no slice file", path), -1;
	}
	struct hami_slice_file *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED) {
		close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE, "cannot map %s: %s", path, strerror(errno)), -1;
	}
	if (memcmp(f->header.magic, HAMI_SLICE_MAGIC, 8) != 0 ||
	    f->header.version_major != HAMI_SLICE_VERSION_MAJOR || f->header.version_minor < 4 ||
	    f->header.slot_size != sizeof(struct hami_slot) || f->header.max_slots != HAMI_SLICE_MAX_SLOTS) {
		munmap(f, sizeof(*f));
		close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE, "%s is no slice file of layout 1.4 or later", path), -1;
	}
	/*
	 * The file is its user's: a slot in it is her word, not a fact. Only a
	 * process of that user is hers to park (one of another user, named in a
	 * slot she wrote, is refused however the slot reads), and only the slot
	 * that names it as /proc does, in its own PID namespace.
	 */
	uid_t owner;
	if (process_uid(pid, &owner) < 0) {
		munmap(f, sizeof(*f));
		close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE, "process %d is gone", pid), -1;
	}
	if (owner != st.st_uid) {
		munmap(f, sizeof(*f));
		close(fd);
		return fail(CUDA_ERROR_NOT_PERMITTED, "process %d belongs to uid %u, not to uid %u, who owns %s: "
			    "not parked", pid, (unsigned)owner, (unsigned)st.st_uid, path), -1;
	}
	int want = pid;
	uint64_t ns = target_namespace(pid, &want);
	if (!ns)
		ns = own_pid_namespace();
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		struct hami_slot *s = &f->slot[i];
		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE || s->pid != want)
			continue;
		if (s->pid_ns != ns)
			continue; /* that pid names another process in another PID namespace (or none) */
		if (ofd(fd, slot_at(i), F_WRLCK, F_OFD_GETLK) != 1)
			continue; /* a dead process's slot, not reclaimed yet */
		*fd_out = fd;
		*map = f;
		*index = i;
		return 0;
	}
	munmap(f, sizeof(*f));
	close(fd);
	return fail(CUDA_ERROR_INVALID_VALUE, "process %d has no live slot in %s", pid, path), -1;
}

/* ---- the commands ---------------------------------------------------------- */

/* HAMI_PARK_REASON_* by the name the command line gives it; 0 for none known. */
static uint32_t parse_reason(const char *text)
{
	static const struct { const char *name; uint32_t reason; } names[] = {
		{ "idle", HAMI_PARK_REASON_IDLE },
		{ "asked", HAMI_PARK_REASON_ASKED },
		{ "room", HAMI_PARK_REASON_ROOM },
		{ "guard", HAMI_PARK_REASON_GUARD },
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(text, names[i].name) == 0)
			return names[i].reason;
	return HAMI_PARK_REASON_NONE;
}

enum { FAST_NO, FAST_PARKED, FAST_FAILED };

/* Whether slot i's owner is alive (its lock on the slot's first byte is held). */
static int owner_alive(int fd, int i)
{
	return ofd(fd, slot_at(i), F_WRLCK, F_OFD_GETLK) == 1;
}

static unsigned answer_ms(void)
{
	const char *v = getenv("HAMI_FAST_PARK_ANSWER_MS");
	char *end;
	unsigned long ms = v ? strtoul(v, &end, 10) : 0;
	return v && *v && !*end && ms > 0 && ms <= 600000 ? (unsigned)ms : ANSWER_MS;
}

/*
 * Ask the target to park itself (park_state PARKING, our lock held): FAST_NO
 * when it cannot or does not answer in time (the caller checkpoints it; the
 * request withdrawn), FAST_PARKED with *bytes moved, or FAST_FAILED with why.
 */
static int fast_park(int fd, int i, struct hami_slot *s, unsigned timeout_ms, uint64_t *bytes, char *why,
		     size_t cap)
{
	uint32_t v = HAMI_FAST_NONE;
	if (!__atomic_load_n(&s->park_fast_able, __ATOMIC_ACQUIRE) ||
	    !__atomic_compare_exchange_n(&s->park_fast, &v, HAMI_FAST_ASKED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return FAST_NO;
	double t0 = now_s(), answer = t0 + answer_ms() / 1000.0;
	double busy = timeout_ms ? t0 + timeout_ms / 1000.0 : 1e300; /* 0: as the lock, no limit */
	for (unsigned polls = 0;; polls++) {
		v = __atomic_load_n(&s->park_fast, __ATOMIC_ACQUIRE);
		double now = now_s();
		if (v == HAMI_FAST_DONE) {
			*bytes = 0;
			for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
				*bytes += __atomic_load_n(&s->parked[d], __ATOMIC_ACQUIRE);
			return FAST_PARKED;
		}
		if (v == HAMI_FAST_REFUSED || v == HAMI_FAST_FAILED) {
			__atomic_store_n(&s->park_fast, HAMI_FAST_NONE, __ATOMIC_RELEASE);
			if (v == HAMI_FAST_FAILED)
				snprintf(why, cap, "its own park failed half-way (error %d)",
					 __atomic_load_n(&s->park_error, __ATOMIC_RELAXED));
			return v == HAMI_FAST_FAILED ? FAST_FAILED : FAST_NO;
		}
		if ((v == HAMI_FAST_ASKED && now > answer) || (v == HAMI_FAST_TAKEN && now > busy)) {
			if (__atomic_compare_exchange_n(&s->park_fast, &v, HAMI_FAST_WITHDRAWN, 0, __ATOMIC_ACQ_REL,
							__ATOMIC_ACQUIRE))
				return FAST_NO; /* it did not answer, or stayed busy: the checkpoint's lock judges */
			continue;
		}
		if (v != HAMI_FAST_ASKED && v != HAMI_FAST_TAKEN && v != HAMI_FAST_COPYING)
			return FAST_NO;
		if (polls % 64 == 0 && !owner_alive(fd, i)) {
			snprintf(why, cap, "it ended while parking itself");
			return FAST_FAILED;
		}
		struct timespec ts = { 0, 1000000L };
		nanosleep(&ts, NULL);
	}
}

static int park(const char *path, int pid, unsigned timeout_ms, uint32_t reason)
{
	int fd, i;
	struct hami_slice_file *f;
	if (find_slot(path, pid, &fd, &f, &i) < 0)
		return 1;
	struct hami_slot *s = &f->slot[i];
	off_t park_byte = slot_at(i) + (off_t)offsetof(struct hami_slot, park_state);
	/* Held until we are done: the target's housekeeper sees a parker at work. */
	if (ofd(fd, park_byte, F_WRLCK, F_OFD_SETLK) < 0)
		return fail(HAMI_PARK_REFUSED_PARKER, "another parker is working on process %d", pid);
	uint32_t running = HAMI_PARK_RUNNING;
	if (!__atomic_compare_exchange_n(&s->park_state, &running, HAMI_PARK_PARKING, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return fail(HAMI_PARK_REFUSED_STATE, "process %d is not running on the GPU (park state %u)",
			    pid, running);
	uint64_t bytes = 0;
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		bytes += __atomic_load_n(&s->memory_used[d], __ATOMIC_ACQUIRE);
	uint64_t host = host_available();
	int rc = CUDA_SUCCESS;
	const char *step = "";
	if (host && bytes > host) {
		__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELEASE);
		return fail(HAMI_PARK_REFUSED_HOST, "host memory too low to hold process %d's GPU state: "
			    "%llu bytes, %llu available", pid, (unsigned long long)bytes,
			    (unsigned long long)host);
	}
	double t0 = now_s();
	/* A call that passed the target's gate just before PARKING reaches the
	 * driver within this; the lock then waits for it instead of trapping it. */
	struct timespec settle = { 0, 10 * 1000000L };
	nanosleep(&settle, NULL);
	char why[160] = "";
	uint64_t moved = 0;
	int fast = fast_park(fd, i, s, timeout_ms, &moved, why, sizeof(why));
	if (fast == FAST_FAILED) {
		__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELEASE);
		return fail(CUDA_ERROR_UNKNOWN, "process %d was not parked: %s; nothing is lost, it runs on, unparked",
			    pid, why);
	}
	if (fast == FAST_PARKED) {
		__atomic_store_n(&s->park_error, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_reason, reason, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_unix_ns, (uint64_t)time(NULL) * 1000000000ull, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_state, HAMI_PARK_PARKED, __ATOMIC_RELEASE);
		printf("ok %llu %.3f fast\n", (unsigned long long)moved, now_s() - t0);
		return 0;
	}
	/* The checkpoint: what the fast park's wait used of the lock's time is spent. */
	double spent_ms = (now_s() - t0) * 1000.0;
	if (timeout_ms && spent_ms > 10)
		timeout_ms = spent_ms >= timeout_ms ? 1 : timeout_ms - (unsigned)spent_ms;
	if (load_driver() != 0) {
		__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELEASE);
		return 1;
	}
	CUcheckpointLockArgs lock_args = { .timeoutMs = timeout_ms };
	rc = cu.lock(pid, &lock_args);
	if (rc != CUDA_SUCCESS) {
		step = "lock";
	} else if ((rc = cu.checkpoint(pid, NULL)) != CUDA_SUCCESS) {
		step = "checkpoint";
		int undo = cu.unlock(pid, NULL);
		if (undo != CUDA_SUCCESS)
			fprintf(stderr, "hami-park: unlocking process %d after a failed checkpoint failed "
				"too (%d); its housekeeper retries\n", pid, undo);
	}
	if (rc != CUDA_SUCCESS) {
		__atomic_store_n(&s->park_error, rc, __ATOMIC_RELAXED);
		__atomic_store_n(&s->park_state, HAMI_PARK_RUNNING, __ATOMIC_RELEASE);
		return fail(rc, "%s of process %d failed (%d: %s); it runs on, unparked", step, pid, rc,
			    result_name(rc));
	}
	__atomic_store_n(&s->park_error, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_reason, reason, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_unix_ns, (uint64_t)time(NULL) * 1000000000ull, __ATOMIC_RELAXED);
	__atomic_store_n(&s->park_state, HAMI_PARK_PARKED, __ATOMIC_RELEASE); /* publishes the reason too */
	printf("ok %llu %.3f checkpoint\n", (unsigned long long)bytes, now_s() - t0);
	return 0; /* exit drops the lock, after PARKED is published */
}

/*
 * The guard's park: no slot is written (a process without the preload library
 * has none, and a process of ours must not bring itself back: its slot stays
 * RUNNING, so its own calls simply block in the driver until an administrator
 * restores it). Undone if the checkpoint fails: never left locked.
 */
static int hold(int pid, unsigned timeout_ms)
{
	if (load_driver() != 0)
		return 1;
	double t0 = now_s();
	CUcheckpointLockArgs lock_args = { .timeoutMs = timeout_ms };
	int rc = cu.lock(pid, &lock_args);
	if (rc != CUDA_SUCCESS)
		return fail(rc, "lock of process %d failed (%d: %s); it runs on", pid, rc, result_name(rc));
	if ((rc = cu.checkpoint(pid, NULL)) != CUDA_SUCCESS) {
		int undo = cu.unlock(pid, NULL);
		if (undo != CUDA_SUCCESS)
			return fail(rc, "checkpoint of process %d failed, and so did unlocking it (%d): it stays "
				    "locked; \"hami-park recover %d\" unlocks it", pid, undo, pid);
		return fail(rc, "checkpoint of process %d failed (%d: %s); it runs on, unparked", pid, rc,
			    result_name(rc));
	}
	printf("ok %.3f\n", now_s() - t0);
	return 0;
}

typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_by_uuid_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_memory_fn)(nvmlDevice_t, nvmlMemory_t *);

/*
 * Whether each GPU named "UUID=BYTES[+KEEP]" has BYTES free beyond KEEP (NVML,
 * physical memory; KEEP: what the node agent's room ledger keeps free there for
 * parks and for others, as the parked process read it). Asked here, in a
 * process of its own, because in the parked process NVML's calls block as its
 * CUDA calls do. 0: room, or NVML cannot tell (the driver's restore then
 * judges); 1: no room, said on stdout.
 */
static int gpus_lack_room(int n, char **wants)
{
	void *lib = n ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	nvml_init_fn init = lib ? (nvml_init_fn)dlsym(lib, "nvmlInit_v2") : NULL;
	nvml_by_uuid_fn by_uuid = lib ? (nvml_by_uuid_fn)dlsym(lib, "nvmlDeviceGetHandleByUUID") : NULL;
	nvml_memory_fn memory = lib ? (nvml_memory_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
	if (!init || !by_uuid || !memory || init() != NVML_SUCCESS)
		return 0;
	for (int i = 0; i < n; i++) {
		char uuid[HAMI_SLICE_UUID_LEN];
		char *eq = strchr(wants[i], '=');
		if (!eq || (size_t)(eq - wants[i]) >= sizeof(uuid))
			continue;
		snprintf(uuid, sizeof(uuid), "%.*s", (int)(eq - wants[i]), wants[i]);
		char *plus = NULL;
		unsigned long long bytes = strtoull(eq + 1, &plus, 10);
		unsigned long long keep = plus && *plus == '+' ? strtoull(plus + 1, NULL, 10) : 0;
		nvmlDevice_t dev;
		nvmlMemory_t m;
		if (by_uuid(uuid, &dev) != NVML_SUCCESS || memory(dev, &m) != NVML_SUCCESS)
			continue;
		if (m.free < keep || m.free - keep < bytes) {
			if (keep)
				return fail(CUDA_ERROR_OUT_OF_MEMORY, "GPU %s has %llu bytes free, %llu needed beyond "
					    "the %llu kept free for parks and for others", uuid,
					    (unsigned long long)m.free, bytes, keep);
			return fail(CUDA_ERROR_OUT_OF_MEMORY, "GPU %s has %llu bytes free, %llu needed", uuid,
				    (unsigned long long)m.free, bytes);
		}
	}
	return 0;
}

static int restore(int pid, int n, char **wants)
{
	if (gpus_lack_room(n, wants))
		return 1;
	if (load_driver() != 0)
		return 1;
	int rc = cu.restore(pid, NULL);
	if (rc != CUDA_SUCCESS)
		return fail(rc, "restore of process %d failed", pid);
	if ((rc = cu.unlock(pid, NULL)) != CUDA_SUCCESS)
		return fail(rc, "unlock of process %d after its restore failed", pid);
	printf("ok\n");
	return 0;
}

static const char *state_name(CUprocessState st)
{
	switch (st) {
	case CU_PROCESS_STATE_RUNNING: return "running";
	case CU_PROCESS_STATE_LOCKED: return "locked";
	case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
	case CU_PROCESS_STATE_FAILED: return "failed";
	}
	return "unknown";
}

/* After a parker died: a locked process is unlocked; a checkpointed one stays so (parked). */
static int recover(int pid)
{
	if (load_driver() != 0)
		return 1;
	CUprocessState st = CU_PROCESS_STATE_RUNNING;
	int rc = cu.state(pid, &st);
	if (rc != CUDA_SUCCESS)
		return fail(rc, "cannot ask the driver about process %d", pid);
	if (st == CU_PROCESS_STATE_LOCKED) {
		if ((rc = cu.unlock(pid, NULL)) != CUDA_SUCCESS)
			return fail(rc, "unlock of process %d failed", pid);
		st = CU_PROCESS_STATE_RUNNING;
	}
	if (st == CU_PROCESS_STATE_FAILED)
		return fail(CUDA_ERROR_UNKNOWN, "the driver says process %d failed its checkpoint", pid);
	printf("ok %s\n", state_name(st));
	return 0;
}

static int state(int pid)
{
	if (load_driver() != 0)
		return 1;
	CUprocessState st;
	int rc = cu.state(pid, &st);
	if (rc != CUDA_SUCCESS)
		return fail(rc, "cannot ask the driver about process %d", pid);
	printf("ok %s\n", state_name(st));
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: hami-park park SLICE_FILE PID [LOCK_TIMEOUT_MS [idle|asked|room|guard]] | "
		"hold PID [LOCK_TIMEOUT_MS] | "
		"restore PID [UUID=BYTES[+KEEP]...] | recover PID | state PID\n");
	return 2;
}

int main(int argc, char **argv)
{
	int pid;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4 && strcmp(argv[1], "park") == 0 && argc <= 6) {
		char *end = NULL;
		unsigned long timeout = argc >= 5 ? strtoul(argv[4], &end, 10) : DEFAULT_LOCK_TIMEOUT_MS;
		uint32_t reason = argc == 6 ? parse_reason(argv[5]) : HAMI_PARK_REASON_IDLE;
		if (parse_pid(argv[3], &pid) < 0 || (end && *end) || timeout > 3600000 ||
		    reason == HAMI_PARK_REASON_NONE)
			return usage();
		return may_act_on(pid) < 0 ? 1 : park(argv[2], pid, (unsigned)timeout, reason);
	}
	if (argc >= 3 && argc <= 4 && strcmp(argv[1], "hold") == 0) {
		char *end = NULL;
		unsigned long timeout = argc == 4 ? strtoul(argv[3], &end, 10) : DEFAULT_LOCK_TIMEOUT_MS;
		if (parse_pid(argv[2], &pid) < 0 || (end && *end) || timeout > 3600000)
			return usage();
		return may_act_on(pid) < 0 ? 1 : hold(pid, (unsigned)timeout);
	}
	if (argc >= 3 && strcmp(argv[1], "restore") == 0 && parse_pid(argv[2], &pid) == 0)
		return may_act_on(pid) < 0 ? 1 : restore(pid, argc - 3, argv + 3);
	if (argc != 3 || parse_pid(argv[2], &pid) < 0)
		return usage();
	if (strcmp(argv[1], "recover") == 0)
		return may_act_on(pid) < 0 ? 1 : recover(pid);
	if (strcmp(argv[1], "state") == 0)
		return may_act_on(pid) < 0 ? 1 : state(pid);
	return usage();
}
