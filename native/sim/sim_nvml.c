/*
 * libnvidia-ml.so.1 of the simulated GPU: the NVML subset monitoring code and
 * tests use. It reads the same shared state as the sim's libcuda.so.1, so its
 * memory figures and process lists are physical: every process, every device,
 * CUDA_VISIBLE_DEVICES ignored (index = device order in the state).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim_api.h"
#include "sim_state.h"

#define DRIVER_VERSION_STRING "580.0-sim"
#define NVML_VERSION_STRING "13.580.0-sim"
#define CUDA_DRIVER_VERSION 13000
#define PCI_DEVICE_ID 0x233010deu /* H100 SXM5, vendor NVIDIA */

struct nvmlDevice_st {
	unsigned index;
};

static struct nvmlDevice_st devs[SIM_MAX_DEVICES];

static struct {
	pthread_mutex_t mu;
	_Atomic unsigned refs;
} N = {PTHREAD_MUTEX_INITIALIZER, 0};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void nv_prepare(void)
{
	pthread_mutex_lock(&N.mu);
}

static void nv_release(void)
{
	pthread_mutex_unlock(&N.mu);
}

static void register_atfork(void)
{
	sim_atfork_init(); /* first: fork then takes N.mu before sim_state's lock */
	pthread_atfork(nv_prepare, nv_release, nv_release);
}

/* ---- init --------------------------------------------------------------- */

static nvmlReturn_t init(void)
{
	nvmlReturn_t r = NVML_SUCCESS;

	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&N.mu);
	if (atomic_load(&N.refs) == 0) {
		int s = sim_open(NULL);
		if (s < 0) {
			r = s == SIM_ECONFIG ? NVML_ERROR_UNKNOWN : NVML_ERROR_OPERATING_SYSTEM;
			goto out;
		}
		/* Our process entry (shared with the sim's libcuda in this
		 * process); NVML works without one, so a full table is no error. */
		sim_self();
		for (unsigned i = 0; i < SIM_MAX_DEVICES; i++)
			devs[i].index = i;
	}
	atomic_fetch_add(&N.refs, 1);
out:
	pthread_mutex_unlock(&N.mu);
	return r;
}

nvmlReturn_t nvmlInit_v2(void)
{
	return init();
}

nvmlReturn_t nvmlInit(void)
{
	return init();
}

/* NVML_INIT_FLAG_NO_GPUS / NO_ATTACH change nothing here. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	return init();
}

nvmlReturn_t nvmlShutdown(void)
{
	nvmlReturn_t r = NVML_SUCCESS;
	pthread_mutex_lock(&N.mu);
	if (atomic_load(&N.refs) == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else
		atomic_fetch_sub(&N.refs, 1);
	pthread_mutex_unlock(&N.mu);
	return r;
}

static const struct {
	nvmlReturn_t code;
	const char *text;
} errors[] = {
	{NVML_SUCCESS, "Success"},
	{NVML_ERROR_UNINITIALIZED, "Uninitialized"},
	{NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
	{NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
	{NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
	{NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
	{NVML_ERROR_NOT_FOUND, "Not Found"},
	{NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
	{NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
	{NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
	{NVML_ERROR_OPERATING_SYSTEM, "Operating System Error"},
	{NVML_ERROR_LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch."},
	{NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
	{NVML_ERROR_UNKNOWN, "Unknown Error"},
};

const char *nvmlErrorString(nvmlReturn_t result)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == result)
			return errors[i].text;
	return "Unknown Error";
}

/* ---- helpers ------------------------------------------------------------ */

static nvmlReturn_t ready(void)
{
	return atomic_load(&N.refs) ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static nvmlReturn_t dev_index(nvmlDevice_t device, unsigned *idx)
{
	if (!atomic_load(&N.refs))
		return NVML_ERROR_UNINITIALIZED;
	uintptr_t p = (uintptr_t)device, base = (uintptr_t)devs;
	if (p < base || (p - base) % sizeof(devs[0]) || (p - base) / sizeof(devs[0]) >= sim_st()->hdr.ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*idx = (unsigned)((p - base) / sizeof(devs[0]));
	return NVML_SUCCESS;
}

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src)
{
	if (!dst)
		return NVML_ERROR_INVALID_ARGUMENT;
	size_t n = strlen(src) + 1;
	if (n > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, src, n);
	return NVML_SUCCESS;
}

struct pinfo {
	unsigned pid;
	unsigned entry;
	uint64_t used;
};

/* Live processes with a context or memory on device D (dead ones swept):
 * GRAPHICS 0 the compute processes, 1 those marked graphics processes
 * (hamiSimGraphicsProcess). used is every byte the process holds there:
 * allocations, contexts, pools' and the graph pool's reserves, decoders,
 * what its driver holds by itself. A checkpointed process keeps its contexts
 * but holds no device memory: it is listed with 0 bytes. */
static unsigned list_procs(unsigned d, struct pinfo *out, int graphics)
{
	struct sim_state *st = sim_st();
	unsigned n = 0;

	sim_sweep();
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &st->proc[i];
		if (atomic_load(&p->state) != SIM_PROC_LIVE || (atomic_load(&p->graphics) != 0) != (graphics != 0))
			continue;
		uint64_t used = atomic_load(&p->used[d]);
		int32_t pid = atomic_load(&p->pid);
		if (pid <= 0 || (!used && !atomic_load(&p->contexts[d])) || sim_entry_owner_gone(i))
			continue;
		out[n++] = (struct pinfo){(unsigned)pid, i, used};
	}
	return n;
}

/* ---- system ------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	nvmlReturn_t r = ready();
	return r ? r : copy_str(version, length, DRIVER_VERSION_STRING);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	return copy_str(version, length, NVML_VERSION_STRING);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
	if (!cudaDriverVersion)
		return NVML_ERROR_INVALID_ARGUMENT;
	*cudaDriverVersion = CUDA_DRIVER_VERSION;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
	return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices ------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
	nvmlReturn_t r = ready();
	if (r)
		return r;
	if (!deviceCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	*deviceCount = sim_st()->hdr.ndev;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
	return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	nvmlReturn_t r = ready();
	if (r)
		return r;
	if (!device || index >= sim_st()->hdr.ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &devs[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	nvmlReturn_t r = ready();
	if (r)
		return r;
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	const struct sim_state *st = sim_st();
	for (unsigned i = 0; i < st->hdr.ndev; i++) {
		if (strcasecmp(st->dev[i].uuid, uuid) == 0) {
			*device = &devs[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!index)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = i;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
	return nvmlDeviceGetIndex(device, minorNumber);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	return r ? r : copy_str(name, length, sim_st()->dev[i].name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	return r ? r : copy_str(uuid, length, sim_st()->dev[i].uuid);
}

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!pci)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof(*pci));
	pci->bus = i + 1;
	pci->pciDeviceId = PCI_DEVICE_ID;
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02x:00.0", i + 1);
	snprintf(pci->busId, sizeof(pci->busId), "00000000:%02x:00.0", i + 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return pci_info(device, pci);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return pci_info(device, pci);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!major || !minor)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = 9;
	*minor = 0;
	return NVML_SUCCESS;
}

/* ---- memory and utilization --------------------------------------------- */

static void mem_figures(unsigned i, uint64_t *total, uint64_t *used)
{
	sim_sweep(); /* a killed process's memory is free again */
	const struct sim_device *d = &sim_st()->dev[i];
	*total = d->total;
	*used = atomic_load(&d->used);
	if (*used > *total)
		*used = *total;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	uint64_t total, used;
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	mem_figures(i, &total, &used);
	memory->total = total;
	memory->used = used;
	memory->free = total - used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	uint64_t total, used;
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	mem_figures(i, &total, &used);
	memory->total = total;
	memory->reserved = 0;
	memory->used = used;
	memory->free = total - used;
	return NVML_SUCCESS;
}

/* gpu: percent of the last complete sample period (SIM_SAMPLE_NS) the device
 * ran kernels, the same period nvmlDeviceGetProcessUtilization reports. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!utilization)
		return NVML_ERROR_INVALID_ARGUMENT;
	utilization->gpu = sim_sample_pct(sim_st()->dev[i].util, sim_sample_end(sim_now_ns()));
	utilization->memory = 0;
	return NVML_SUCCESS;
}

/* ---- power and temperature ------------------------------------------------ */

/*
 * What a whole-GPU view reads beside utilization (nvdashboard's figures), and
 * what the SM share's work model reads (sm_work.c). The sim has no sensors:
 * both follow the device's utilization over the last second, as a real GPU's
 * do. HAMI_SIM_POWER=IDLE,FULL,CAP (watts; read at each call, like
 * HAMI_SIM_PROCESS_UTIL): the device draws IDLE + (FULL - IDLE) x the part of
 * the last second it was busy, at most CAP, its enforced power limit. A FULL
 * above CAP is a GPU whose cap holds back its full load (it clocks lower then,
 * as an H100 running a matmul loop does), so that work busy only part of the
 * time draws what a model of the boost reads as a speed-up. Unset: 70 W idle
 * to 700 W busy, an H100 SXM's range, never capped below its full load;
 * malformed: power is not supported, as on GPUs without readings.
 */
#define SIM_POWER_IDLE_W 70u
#define SIM_POWER_FULL_W 700u
#define SIM_TEMPERATURE_IDLE_C 31u

typedef struct {
	unsigned int version;
	int sensorType;
	int temperature;
} sim_nvmlTemperature_v1_t;
#define SIM_NVML_TEMPERATURE_GPU 0
#define SIM_NVML_TEMPERATURE_V1 (unsigned int)(sizeof(sim_nvmlTemperature_v1_t) | (1u << 24))

static int power_model(unsigned *idle, unsigned *full, unsigned *cap)
{
	const char *v = getenv("HAMI_SIM_POWER");
	char tail;
	if (!v) {
		*idle = SIM_POWER_IDLE_W;
		*full = *cap = SIM_POWER_FULL_W;
		return 1;
	}
	return sscanf(v, "%u,%u,%u%c", idle, full, cap, &tail) == 3 && *idle < *cap && *cap <= 100000;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
	unsigned i, idle, full, cap;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!power)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!power_model(&idle, &full, &cap))
		return NVML_ERROR_NOT_SUPPORTED;
	double w = idle + ((double)full - idle) * sim_util_pct(sim_st()->dev[i].util) / 100.0;
	*power = (unsigned)((w > cap ? cap : w) * 1000.0);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
	unsigned i, idle, full, cap;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!limit)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!power_model(&idle, &full, &cap))
		return NVML_ERROR_NOT_SUPPORTED;
	*limit = cap * 1000;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
	return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

static nvmlReturn_t temperature(nvmlDevice_t device, int sensor, unsigned int *out)
{
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (sensor != SIM_NVML_TEMPERATURE_GPU)
		return NVML_ERROR_NOT_SUPPORTED;
	*out = SIM_TEMPERATURE_IDLE_C + sim_util_pct(sim_st()->dev[i].util) * 45u / 100u;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp)
{
	return temperature(device, sensorType, temp);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, sim_nvmlTemperature_v1_t *temp)
{
	if (!temp)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (temp->version != SIM_NVML_TEMPERATURE_V1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	unsigned int c;
	nvmlReturn_t r = temperature(device, temp->sensorType, &c);
	if (!r)
		temp->temperature = (int)c;
	return r;
}

/* ---- processes ---------------------------------------------------------- */

/* HAMI_SIM_PROCESS_LIST_NS: how long a process-list call takes; the list is
 * read half-way through, as a real driver's reading falls somewhere inside
 * its call. Read at each call, like HAMI_SIM_PROCESS_UTIL. */
static void process_list_pause(void)
{
	const char *v = getenv("HAMI_SIM_PROCESS_LIST_NS");
	unsigned long long ns = v ? strtoull(v, NULL, 10) : 0;
	if (!ns || ns > 10000000000ull)
		return;
	struct timespec ts = { (time_t)(ns / 2 / 1000000000ull), (long)(ns / 2 % 1000000000ull) };
	nanosleep(&ts, NULL);
}

/* Standard NVML sizing: *count in = capacity; too small -> INSUFFICIENT_SIZE
 * with the count needed. ELEM: 1 = v1 element, 2 = v2/v3 element. GRAPHICS:
 * the graphics list, else the compute one. */
static nvmlReturn_t running(nvmlDevice_t device, unsigned *count, void *infos, int elem, int graphics)
{
	struct pinfo list[SIM_MAX_PROCS];
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	process_list_pause();
	unsigned n = list_procs(i, list, graphics);
	process_list_pause();
	if (n > *count) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	if (n && !infos)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned k = 0; k < n; k++) {
		if (elem == 1) {
			nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)infos + k;
			e->pid = list[k].pid;
			e->usedGpuMemory = list[k].used;
		} else {
			nvmlProcessInfo_t *e = (nvmlProcessInfo_t *)infos + k;
			e->pid = list[k].pid;
			e->usedGpuMemory = list[k].used;
			e->gpuInstanceId = SIM_NVML_VALUE_NOT_AVAILABLE; /* not MIG */
			e->computeInstanceId = SIM_NVML_VALUE_NOT_AVAILABLE;
		}
	}
	*count = n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
						  nvmlProcessInfo_v1_t *infos)
{
	return running(device, infoCount, infos, 1, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos)
{
	return running(device, infoCount, infos, 2, 0);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos)
{
	return running(device, infoCount, infos, 2, 0);
}

/* Processes marked with hamiSimGraphicsProcess (a sim-only knob: nothing
 * draws on a simulated GPU), with the same elements and figures. */
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
						   nvmlProcessInfo_v1_t *infos)
{
	return running(device, infoCount, infos, 1, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
						      nvmlProcessInfo_t *infos)
{
	return running(device, infoCount, infos, 2, 1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						      nvmlProcessInfo_t *infos)
{
	return running(device, infoCount, infos, 2, 1);
}

/* MPS clients: none, as on a GPU without an MPS server. HAMI_SIM_MPS=1 (read
 * at each call) lists the compute processes here too, as if each were an MPS
 * client, so that tests can watch this list. */
static nvmlReturn_t mps_clients(nvmlDevice_t device, unsigned *count, void *infos, int elem)
{
	const char *v = getenv("HAMI_SIM_MPS");
	unsigned i;
	if (v && strcmp(v, "1") == 0)
		return running(device, count, infos, elem, 0);
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_v1_t *infos)
{
	return mps_clients(device, infoCount, infos, 1);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
							nvmlProcessInfo_t *infos)
{
	return mps_clients(device, infoCount, infos, 2);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
							nvmlProcessInfo_t *infos)
{
	return mps_clients(device, infoCount, infos, 2);
}

/* One mode's processes in the detail form (driver 535+): the processes and
 * figures of that mode's _v3 list; no confidential computing, so no protected
 * bytes. Sized like the lists: too small a room is NVML_ERROR_INSUFFICIENT_SIZE
 * with the count needed. */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
	nvmlProcessInfo_t list[SIM_MAX_PROCS];
	unsigned n = SIM_MAX_PROCS;
	nvmlReturn_t r;
	if (!plist)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (plist->version != nvmlProcessDetailList_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	switch (plist->mode) {
	case NVML_PROCESS_MODE_COMPUTE:
		r = running(device, &n, list, 2, 0);
		break;
	case NVML_PROCESS_MODE_GRAPHICS:
		r = running(device, &n, list, 2, 1);
		break;
	case NVML_PROCESS_MODE_MPS:
		r = mps_clients(device, &n, list, 2);
		break;
	default:
		return NVML_ERROR_INVALID_ARGUMENT;
	}
	if (r)
		return r;
	if (n > plist->numProcArrayEntries) {
		plist->numProcArrayEntries = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	if (n && !plist->procArray)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned k = 0; k < n; k++) {
		nvmlProcessDetail_v1_t *e = &plist->procArray[k];
		memset(e, 0, sizeof(*e));
		e->pid = list[k].pid;
		e->usedGpuMemory = list[k].usedGpuMemory;
		e->gpuInstanceId = list[k].gpuInstanceId;
		e->computeInstanceId = list[k].computeInstanceId;
	}
	plist->numProcArrayEntries = n;
	return NVML_SUCCESS;
}

/* Live processes with a context on device D, or whose kernels ran on it in
 * the period ending at END (one that dropped its context since then). */
static unsigned sampled_procs(unsigned d, uint64_t end, struct pinfo *out)
{
	struct sim_state *st = sim_st();
	unsigned n = 0;

	sim_sweep();
	for (unsigned i = 0; i < SIM_MAX_PROCS; i++) {
		struct sim_proc *p = &st->proc[i];
		if (atomic_load(&p->state) != SIM_PROC_LIVE)
			continue;
		int32_t pid = atomic_load(&p->pid);
		if (pid <= 0 || (!atomic_load(&p->contexts[d]) && !sim_sample_busy(p->util[d], end)) ||
		    sim_entry_owner_gone(i))
			continue;
		out[n++] = (struct pinfo){(unsigned)pid, i, atomic_load(&p->used[d])};
	}
	return n;
}

/*
 * Like the real driver (580): one sample per process per SIM_SAMPLE_NS period.
 * The newest covers the last complete period [P - 200 ms, P); its timeStamp is
 * P in microseconds (CLOCK_MONOTONIC, the same for every process) and smUtil
 * the percent of the period the process's kernels occupied the device. Only
 * that newest sample is returned, one per process with a context. When
 * lastSeenTimeStamp >= P (nothing new) or there is no such process:
 * NVML_ERROR_NOT_FOUND with count 0. Sizing: NULL or too small a buffer gives
 * NVML_ERROR_INSUFFICIENT_SIZE with the count needed.
 */
static nvmlReturn_t process_samples(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
				    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
	struct pinfo list[SIM_MAX_PROCS];
	unsigned i;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!processSamplesCount)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t end = sim_sample_end(sim_now_ns());
	unsigned long long stamp = end / 1000;
	unsigned n = lastSeenTimeStamp < stamp ? sampled_procs(i, end, list) : 0;
	if (n == 0) {
		*processSamplesCount = 0;
		return NVML_ERROR_NOT_FOUND;
	}
	if (!utilization || *processSamplesCount < n) {
		*processSamplesCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	struct sim_state *st = sim_st();
	const char *only = getenv("HAMI_SIM_PROCESS_UTIL");
	if (only && strcmp(only, "one") == 0) {
		/* Like an H100 (driver 580) with two busy slices: one process,
		 * the newest, with the whole device's figure. */
		unsigned newest = 0;
		for (unsigned k = 1; k < n; k++)
			if (list[k].pid > list[newest].pid)
				newest = k;
		memset(&utilization[0], 0, sizeof(utilization[0]));
		utilization[0].pid = list[newest].pid;
		utilization[0].timeStamp = stamp;
		utilization[0].smUtil = sim_sample_pct(st->dev[i].util, end);
		*processSamplesCount = 1;
		return NVML_SUCCESS;
	}
	for (unsigned k = 0; k < n; k++) {
		nvmlProcessUtilizationSample_t *e = &utilization[k];
		memset(e, 0, sizeof(*e));
		e->pid = list[k].pid;
		e->timeStamp = stamp;
		e->smUtil = sim_sample_pct(st->proc[list[k].entry].util[i], end);
	}
	*processSamplesCount = n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
					     unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
	return process_samples(device, utilization, processSamplesCount, lastSeenTimeStamp);
}

/* The same samples in the newer form (driver 550+): the request carries the
 * count, the last time stamp seen and the array; jpgUtil and ofaUtil are 0. */
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *procesesUtilInfo)
{
	nvmlProcessesUtilizationInfo_t *q = procesesUtilInfo;
	nvmlProcessUtilizationSample_t s[SIM_MAX_PROCS];
	unsigned i, n = SIM_MAX_PROCS;
	nvmlReturn_t r = dev_index(device, &i);
	if (r)
		return r;
	if (!q)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (q->version != nvmlProcessesUtilizationInfo_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	r = process_samples(device, s, &n, q->lastSeenTimeStamp);
	if (r == NVML_ERROR_NOT_FOUND)
		q->processSamplesCount = 0;
	if (r)
		return r;
	if (!q->procUtilArray || q->processSamplesCount < n) {
		q->processSamplesCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (unsigned k = 0; k < n; k++) {
		nvmlProcessUtilizationInfo_v1_t *e = &q->procUtilArray[k];
		memset(e, 0, sizeof(*e));
		e->timeStamp = s[k].timeStamp;
		e->pid = s[k].pid;
		e->smUtil = s[k].smUtil;
	}
	q->processSamplesCount = n;
	return NVML_SUCCESS;
}
