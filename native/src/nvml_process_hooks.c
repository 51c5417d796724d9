/*
 * NVML's per-process answers, as a slice sees them: its own processes only.
 *
 * NVML lists every process on a GPU with its pid and bytes, and programs
 * repeat what it says: PyTorch's out-of-memory message names each process
 * and what it holds, nvidia-smi and torch.cuda.list_gpu_processes() list
 * them. Inside a slice that told one user about another's work. So a slice's
 * process is given the part of each list that names the live processes of
 * its slice (their slots) and itself, and the size NVML tells a caller to
 * allocate is that of the shorter list.
 *
 * The library's own readings (true_up.c, sm_share.c, sm_work.c) call the
 * real entry points through HAMI_REAL and still see every process.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hami.h"
#include "hook_api.h"

#define PROCESS_INFO_V1_SIZE sizeof(struct nvmlProcessInfo_v1_st)
#define PROCESS_INFO_V2_SIZE sizeof(nvmlProcessInfo_t)
#define PROCESS_INFO_CC_SIZE 32   /* the v2 element and an 8-byte usedGpuCcProtectedMemory */
#define ELEMENT_ROOM 40           /* the largest element read here (nvmlProcessUtilizationInfo_v1_t) */
#define LOCAL_ENTRIES 64          /* read on the stack; longer lists on the heap */
#define MAX_ENTRIES (1u << 16)    /* more processes than this on one GPU: refuse */
#define READ_TRIES 8              /* a list that outgrows our room this often: refuse */
#define ARGUMENT_VERSION_MISMATCH 25 /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */

_Static_assert(sizeof(struct nvmlProcessInfo_v1_st) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) <= ELEMENT_ROOM, "sample");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == ELEMENT_ROOM, "utilization info");
_Static_assert(sizeof(nvmlProcessDetail_v1_t) == 32, "process detail");

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);
typedef nvmlReturn_t (*samples_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
				   unsigned long long);
typedef nvmlReturn_t (*infos_fn)(nvmlDevice_t, nvmlProcessesUtilizationInfo_t *);
typedef nvmlReturn_t (*details_fn)(nvmlDevice_t, nvmlProcessDetailList_t *);

/* ---- who the slice is ----------------------------------------------------- */

struct members {
	int everyone; /* not in a slice: nothing is hidden */
	unsigned int n;
	unsigned int pid[HAMI_SLICE_MAX_SLOTS + 1];
};

/* Whether the settings put this process in a slice: a named one, any limit
 * (a private slice), or settings that failed (which fail closed). */
static int in_a_slice(const struct hami_config *c)
{
	struct hami_device_limit l;
	if (c->error || c->slice_path || c->has_process_limit || hami_config_limit(-1, &l))
		return 1;
	for (int i = 0; i < HAMI_SLICE_MAX_DEVICES; i++)
		if (hami_config_limit(i, &l))
			return 1;
	return 0;
}

static uint64_t own_pid_namespace(void)
{
	struct stat st;
	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void add_member(struct members *m, unsigned int pid)
{
	for (unsigned int i = 0; i < m->n; i++)
		if (m->pid[i] == pid)
			return;
	if (m->n < sizeof(m->pid) / sizeof(m->pid[0]))
		m->pid[m->n++] = pid;
}

/* Slot i's pid when a live process of our pid namespace owns it, else 0. */
static unsigned int live_slot_pid(struct hami_slice_file *f, int i, uint64_t ns)
{
	struct hami_slot *s = &f->slot[i];
	if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE)
		return 0;
	int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
	if (pid <= 0 || __atomic_load_n(&s->pid_ns, __ATOMIC_ACQUIRE) != ns)
		return 0;
	/* A slot whose owner died says LIVE until a sweep, and its pid may be
	 * someone else's by now: only a held lock proves an owner. */
	if (hami_slot_byte_locked(i, 0) != 1)
		return 0;
	if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != HAMI_SLOT_LIVE ||
	    __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != pid)
		return 0; /* taken over while we looked */
	return (unsigned int)pid;
}

/*
 * This process and the live processes of its slice. A slice that cannot be
 * read (missing, refused, no namespace to compare) leaves this process alone,
 * never everyone.
 */
static void slice_members(struct members *m)
{
	m->everyone = 0;
	m->n = 0;
	if (!in_a_slice(hami_config())) {
		m->everyone = 1;
		return;
	}
	add_member(m, (unsigned int)getpid());
	struct hami_slice_file *f = hami_slice() || hami_slice_open_existing() == 0 ? hami_slice() : NULL;
	uint64_t ns = own_pid_namespace();
	if (!f || !ns)
		return;
	for (int i = 0; i < HAMI_SLICE_MAX_SLOTS; i++) {
		unsigned int pid = live_slot_pid(f, i, ns);
		if (pid)
			add_member(m, pid);
	}
}

static int is_member(const struct members *m, unsigned int pid)
{
	for (unsigned int i = 0; i < m->n; i++)
		if (m->pid[i] == pid)
			return 1;
	return 0;
}

/* ---- reading a whole list ------------------------------------------------- */

/* One real call: fill buf, which has room for *n elements, and set *n. */
struct reading {
	nvmlReturn_t (*read)(const struct reading *r, void *buf, unsigned int *n);
	nvmlDevice_t device;
	void *fn;                     /* the real entry point */
	unsigned long long since;     /* lastSeenTimeStamp, for the samples */
	unsigned int version, mode;   /* the detail list's request */
};

static nvmlReturn_t read_list(const struct reading *r, void *buf, unsigned int *n)
{
	return ((list_fn)r->fn)(r->device, n, buf);
}

static nvmlReturn_t read_samples(const struct reading *r, void *buf, unsigned int *n)
{
	return ((samples_fn)r->fn)(r->device, buf, n, r->since);
}

static nvmlReturn_t read_infos(const struct reading *r, void *buf, unsigned int *n)
{
	nvmlProcessesUtilizationInfo_t q = { .version = nvmlProcessesUtilizationInfo_v1,
					     .processSamplesCount = *n,
					     .lastSeenTimeStamp = r->since,
					     .procUtilArray = buf };
	nvmlReturn_t rc = ((infos_fn)r->fn)(r->device, &q);
	*n = q.processSamplesCount;
	return rc;
}

static nvmlReturn_t read_details(const struct reading *r, void *buf, unsigned int *n)
{
	nvmlProcessDetailList_t q = { .version = r->version, .mode = r->mode,
				      .numProcArrayEntries = *n, .procArray = buf };
	nvmlReturn_t rc = ((details_fn)r->fn)(r->device, &q);
	*n = q.numProcArrayEntries;
	return rc;
}

/*
 * The whole list into our own buffer (local, or grown on the heap and then
 * left in *grown for the caller to free): the real call's result and, on
 * success, *n elements at *out. Every element slot has ELEMENT_ROOM bytes,
 * so a driver writing larger elements than we think still stays inside it.
 */
static nvmlReturn_t read_all(const struct reading *r, unsigned char *local, unsigned char **grown,
			     unsigned char **out, unsigned int *n)
{
	unsigned char *buf = local;
	unsigned int room = LOCAL_ENTRIES;
	*grown = NULL;
	for (int tries = 0; tries < READ_TRIES; tries++) {
		unsigned int got = room;
		nvmlReturn_t rc = r->read(r, buf, &got);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
			*out = buf;
			*n = got < room ? got : room;
			return rc;
		}
		if (got > MAX_ENTRIES)
			break;
		/* Room for what it asked and some to spare: processes come and go. */
		room = (got > room ? got : room) + 16;
		free(*grown);
		*grown = calloc(room, ELEMENT_ROOM);
		if (!*grown)
			return NVML_ERROR_MEMORY;
		buf = *grown;
	}
	return NVML_ERROR_UNKNOWN;
}

/* Keep, in order, the elements whose pid (at byte pid_at) is a member; how many. */
static unsigned int keep_members(const struct members *m, unsigned char *buf, unsigned int n, size_t size,
				 size_t pid_at)
{
	unsigned int kept = 0;
	for (unsigned int i = 0; i < n; i++) {
		unsigned int pid;
		memcpy(&pid, buf + (size_t)i * size + pid_at, sizeof(pid));
		if (!is_member(m, pid))
			continue;
		if (kept != i)
			memmove(buf + (size_t)kept * size, buf + (size_t)i * size, size);
		kept++;
	}
	return kept;
}

/*
 * Answer a caller whose buffer dst has room for *room elements of `size`
 * bytes, NVML's way, counting only the members: too little room (or, for
 * samples, no buffer) is NVML_ERROR_INSUFFICIENT_SIZE with *room set to what
 * is needed; samples of nobody are NVML_ERROR_NOT_FOUND with *room 0.
 */
static nvmlReturn_t answer(const struct reading *r, const struct members *m, size_t size, size_t pid_at,
			   int samples, unsigned int *room, void *dst)
{
	_Alignas(8) unsigned char local[LOCAL_ENTRIES * ELEMENT_ROOM];
	unsigned char *grown = NULL, *buf = NULL;
	unsigned int n = 0;
	nvmlReturn_t rc = read_all(r, local, &grown, &buf, &n);
	if (rc == NVML_SUCCESS) {
		unsigned int kept = keep_members(m, buf, n, size, pid_at);
		if (samples && kept == 0) {
			*room = 0;
			rc = NVML_ERROR_NOT_FOUND;
		} else if (kept > *room || (samples && !dst)) {
			*room = kept;
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		} else if (kept && !dst) {
			rc = NVML_ERROR_INVALID_ARGUMENT;
		} else {
			if (kept)
				memcpy(dst, buf, (size_t)kept * size);
			*room = kept;
		}
	} else if (rc == NVML_ERROR_NOT_FOUND) {
		*room = 0;
	}
	free(grown);
	return rc;
}

/* ---- the process lists ---------------------------------------------------- */

/*
 * The element the _v3 lists write. NVML 12.0's header gave it an 8-byte
 * usedGpuCcProtectedMemory (32 bytes); NVML 12.2's (driver 535) moved that
 * field to nvmlProcessDetail_v1_t, which came with
 * nvmlDeviceGetRunningProcessDetailList, and _v3 writes the 24-byte v2
 * element again (seen on driver 580.159.04: 16, 24 and 24 bytes for the plain,
 * _v2 and _v3 lists). So 32 only for a driver that has the
 * confidential-computing queries but not the detail list.
 */
static size_t v3_element_size(void)
{
	static size_t size;
	size_t s = __atomic_load_n(&size, __ATOMIC_ACQUIRE);
	if (!s) {
		int cc = hami_nvml_sym("nvmlDeviceGetConfComputeMemSizeInfo") != NULL;
		int detail = hami_nvml_sym("nvmlDeviceGetRunningProcessDetailList") != NULL;
		s = cc && !detail ? PROCESS_INFO_CC_SIZE : PROCESS_INFO_V2_SIZE;
		__atomic_store_n(&size, s, __ATOMIC_RELEASE);
	}
	return s;
}

static nvmlReturn_t slice_list(list_fn fn, size_t size, nvmlDevice_t device, unsigned int *count, void *infos)
{
	struct members m;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	slice_members(&m);
	if (m.everyone || !count)
		return fn(device, count, infos);
	struct reading r = { .read = read_list, .device = device, .fn = (void *)fn };
	return answer(&r, &m, size, 0, 0, count, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
							      struct nvmlProcessInfo_v1_st *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetComputeRunningProcesses");
	return slice_list(fn, PROCESS_INFO_V1_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
								 nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetComputeRunningProcesses_v2");
	return slice_list(fn, PROCESS_INFO_V2_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
								 nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetComputeRunningProcesses_v3");
	return slice_list(fn, v3_element_size(), device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
							       struct nvmlProcessInfo_v1_st *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetGraphicsRunningProcesses");
	return slice_list(fn, PROCESS_INFO_V1_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
								  nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetGraphicsRunningProcesses_v2");
	return slice_list(fn, PROCESS_INFO_V2_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
								  nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetGraphicsRunningProcesses_v3");
	return slice_list(fn, v3_element_size(), device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
								 struct nvmlProcessInfo_v1_st *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetMPSComputeRunningProcesses");
	return slice_list(fn, PROCESS_INFO_V1_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
								    nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetMPSComputeRunningProcesses_v2");
	return slice_list(fn, PROCESS_INFO_V2_SIZE, device, infoCount, infos);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
								    nvmlProcessInfo_t *infos)
{
	list_fn fn = HAMI_REAL(list_fn, "nvmlDeviceGetMPSComputeRunningProcesses_v3");
	return slice_list(fn, v3_element_size(), device, infoCount, infos);
}

/*
 * The detail list (driver 535+) names every process of one mode, as the lists
 * above do: a slice's process gets its slice's part. A request of a layout
 * other than version 1 cannot be filtered, so it is not passed on.
 */
HAMI_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
	details_fn fn = HAMI_REAL(details_fn, "nvmlDeviceGetRunningProcessDetailList");
	struct members m;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	slice_members(&m);
	if (m.everyone || !plist)
		return fn(device, plist);
	if (plist->version >> 24 != 1)
		return ARGUMENT_VERSION_MISMATCH;
	struct reading r = { .read = read_details, .device = device, .fn = (void *)fn,
			     .version = plist->version, .mode = plist->mode };
	return answer(&r, &m, sizeof(nvmlProcessDetail_v1_t), offsetof(nvmlProcessDetail_v1_t, pid), 0,
		      &plist->numProcArrayEntries, plist->procArray);
}

/* ---- utilization per process ---------------------------------------------- */

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
							 nvmlProcessUtilizationSample_t *utilization,
							 unsigned int *processSamplesCount,
							 unsigned long long lastSeenTimeStamp)
{
	samples_fn fn = HAMI_REAL(samples_fn, "nvmlDeviceGetProcessUtilization");
	struct members m;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	slice_members(&m);
	if (m.everyone || !processSamplesCount)
		return fn(device, utilization, processSamplesCount, lastSeenTimeStamp);
	struct reading r = { .read = read_samples, .device = device, .fn = (void *)fn, .since = lastSeenTimeStamp };
	return answer(&r, &m, sizeof(nvmlProcessUtilizationSample_t), offsetof(nvmlProcessUtilizationSample_t, pid),
		      1, processSamplesCount, utilization);
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
							       nvmlProcessesUtilizationInfo_t *procesesUtilInfo)
{
	infos_fn fn = HAMI_REAL(infos_fn, "nvmlDeviceGetProcessesUtilizationInfo");
	nvmlProcessesUtilizationInfo_t *q = procesesUtilInfo;
	struct members m;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	slice_members(&m);
	if (m.everyone || !q)
		return fn(device, q);
	if (q->version != nvmlProcessesUtilizationInfo_v1)
		return ARGUMENT_VERSION_MISMATCH; /* a layout we cannot filter is not passed on */
	struct reading r = { .read = read_infos, .device = device, .fn = (void *)fn, .since = q->lastSeenTimeStamp };
	return answer(&r, &m, sizeof(nvmlProcessUtilizationInfo_v1_t), offsetof(nvmlProcessUtilizationInfo_v1_t, pid),
		      1, &q->processSamplesCount, q->procUtilArray);
}
