/*
 * Which entry points are hooked. dlsym looks hooks up by name; cuGetProcAddress
 * by the pointer the real driver returned, which is the address of one of its
 * exported symbols (checked on driver 580): so the driver's own choice of
 * variant for a cudaVersion and per-thread-stream flag is kept exactly.
 *
 * Two tables: the hooks that guard the slice (below), whose every version
 * must be known, and the parking gate's (park_gate_hooks.c), which charge
 * nothing, so an unknown version of those simply passes through.
 */
#include <pthread.h>
#include <string.h>

#include "hami.h"
#include "hook_api.h"

static const struct hami_hook hooks[] = {
	{ "cuInit", (void *)cuInit },
	{ "cuGetProcAddress", (void *)cuGetProcAddress },
	{ "cuGetProcAddress_v2", (void *)cuGetProcAddress_v2 },
	{ "cuMemAlloc_v2", (void *)cuMemAlloc_v2 },
	{ "cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2 },
	{ "cuMemAllocManaged", (void *)cuMemAllocManaged },
	{ "cuMemFree_v2", (void *)cuMemFree_v2 },
	{ "cuMemAllocAsync", (void *)cuMemAllocAsync },
	{ "cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz },
	{ "cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync },
	{ "cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz },
	{ "cuMemFreeAsync", (void *)cuMemFreeAsync },
	{ "cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz },
	{ "cuMemPoolCreate", (void *)cuMemPoolCreate },
	{ "cuMemPoolDestroy", (void *)cuMemPoolDestroy },
	{ "cuMemPoolTrimTo", (void *)cuMemPoolTrimTo },
	{ "cuMemCreate", (void *)cuMemCreate },
	{ "cuMemRelease", (void *)cuMemRelease },
	{ "cuArrayCreate_v2", (void *)cuArrayCreate_v2 },
	{ "cuArray3DCreate_v2", (void *)cuArray3DCreate_v2 },
	{ "cuArrayDestroy", (void *)cuArrayDestroy },
	{ "cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate },
	{ "cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy },
	{ "cuMemGetInfo_v2", (void *)cuMemGetInfo_v2 },
	{ "cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2 },
	{ "cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain },
	{ "cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2 },
	{ "cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease },
	{ "cuCtxCreate_v2", (void *)cuCtxCreate_v2 },
	{ "cuCtxCreate_v3", (void *)cuCtxCreate_v3 },
	{ "cuCtxCreate_v4", (void *)cuCtxCreate_v4 },
	{ "cuCtxDestroy_v2", (void *)cuCtxDestroy_v2 },
	{ "cuLaunchKernel", (void *)cuLaunchKernel },
	{ "cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz },
	{ "cuLaunchKernelEx", (void *)cuLaunchKernelEx },
	{ "cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz },
	{ "cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel },
	{ "cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz },
	{ "cuGraphLaunch", (void *)cuGraphLaunch },
	{ "cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz },
	{ "cuGraphUpload", (void *)cuGraphUpload },
	{ "cuGraphUpload_ptsz", (void *)cuGraphUpload_ptsz },
	{ "cuDeviceGraphMemTrim", (void *)cuDeviceGraphMemTrim },
	{ "cuGraphInstantiate", (void *)cuGraphInstantiate },
	{ "cuGraphInstantiate_v2", (void *)cuGraphInstantiate_v2 },
	{ "cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags },
	{ "cuGraphInstantiateWithParams", (void *)cuGraphInstantiateWithParams },
	{ "cuGraphInstantiateWithParams_ptsz", (void *)cuGraphInstantiateWithParams_ptsz },
	{ "cuGraphExecDestroy", (void *)cuGraphExecDestroy },
	{ "cuvidCreateDecoder", (void *)cuvidCreateDecoder },
	{ "cuvidDestroyDecoder", (void *)cuvidDestroyDecoder },
	{ "cuvidReconfigureDecoder", (void *)cuvidReconfigureDecoder },
	{ "cuvidDecodePicture", (void *)cuvidDecodePicture },
	{ "cuvidMapVideoFrame", (void *)cuvidMapVideoFrame },
	{ "cuvidMapVideoFrame64", (void *)cuvidMapVideoFrame64 },
	{ "cuvidUnmapVideoFrame", (void *)cuvidUnmapVideoFrame },
	{ "cuvidUnmapVideoFrame64", (void *)cuvidUnmapVideoFrame64 },
	{ "cuvidGetDecoderCaps", (void *)cuvidGetDecoderCaps },
	{ "cuvidCreateVideoParser", (void *)cuvidCreateVideoParser },
	{ "cuvidDestroyVideoParser", (void *)cuvidDestroyVideoParser },
	{ "nvmlDeviceGetMemoryInfo", (void *)nvmlDeviceGetMemoryInfo },
	{ "nvmlDeviceGetMemoryInfo_v2", (void *)nvmlDeviceGetMemoryInfo_v2 },
	{ "nvmlDeviceGetComputeRunningProcesses", (void *)nvmlDeviceGetComputeRunningProcesses },
	{ "nvmlDeviceGetComputeRunningProcesses_v2", (void *)nvmlDeviceGetComputeRunningProcesses_v2 },
	{ "nvmlDeviceGetComputeRunningProcesses_v3", (void *)nvmlDeviceGetComputeRunningProcesses_v3 },
	{ "nvmlDeviceGetGraphicsRunningProcesses", (void *)nvmlDeviceGetGraphicsRunningProcesses },
	{ "nvmlDeviceGetGraphicsRunningProcesses_v2", (void *)nvmlDeviceGetGraphicsRunningProcesses_v2 },
	{ "nvmlDeviceGetGraphicsRunningProcesses_v3", (void *)nvmlDeviceGetGraphicsRunningProcesses_v3 },
	{ "nvmlDeviceGetMPSComputeRunningProcesses", (void *)nvmlDeviceGetMPSComputeRunningProcesses },
	{ "nvmlDeviceGetMPSComputeRunningProcesses_v2", (void *)nvmlDeviceGetMPSComputeRunningProcesses_v2 },
	{ "nvmlDeviceGetMPSComputeRunningProcesses_v3", (void *)nvmlDeviceGetMPSComputeRunningProcesses_v3 },
	{ "nvmlDeviceGetProcessUtilization", (void *)nvmlDeviceGetProcessUtilization },
	{ "nvmlDeviceGetProcessesUtilizationInfo", (void *)nvmlDeviceGetProcessesUtilizationInfo },
	{ "nvmlDeviceGetRunningProcessDetailList", (void *)nvmlDeviceGetRunningProcessDetailList },
};

#define HOOK_COUNT (sizeof(hooks) / sizeof(hooks[0]))

static void *real_of[HOOK_COUNT];
/* Hooks that guard no limit: the parking gate's (park_gate_hooks.c), the
 * waits for the driver's own memory (driver_memory_hooks.c) and the answers
 * about memory backed for the fast park (vm_hooks.c). */
#define MAX_OTHER_HOOKS 128 /* 69 + 16 + 5 */
static const struct hami_hook *other[MAX_OTHER_HOOKS];
static void *other_real_of[MAX_OTHER_HOOKS];
static size_t other_count;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void *by_name(const struct hami_hook *table, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(table[i].name, name) == 0)
			return table[i].hook;
	return NULL;
}

void *hami_hook_by_name(const char *name)
{
	void *hook = by_name(hooks, HOOK_COUNT, name);
	if (!hook)
		hook = by_name(hami_gate_hooks, hami_gate_hook_count, name);
	if (!hook)
		hook = by_name(hami_vm_hooks, hami_vm_hook_count, name);
	return hook ? hook : by_name(hami_driver_memory_hooks, hami_driver_memory_hook_count, name);
}

static void *real_sym(const char *name)
{
	return name[0] == 'c' ? hami_cuda_sym(name) : hami_nvml_sym(name);
}

static void resolve_reals(void)
{
	for (size_t i = 0; i < HOOK_COUNT; i++)
		real_of[i] = real_sym(hooks[i].name);
	for (size_t i = 0; i < hami_gate_hook_count && other_count < MAX_OTHER_HOOKS; i++)
		other[other_count++] = &hami_gate_hooks[i];
	for (size_t i = 0; i < hami_driver_memory_hook_count && other_count < MAX_OTHER_HOOKS; i++)
		other[other_count++] = &hami_driver_memory_hooks[i];
	for (size_t i = 0; i < hami_vm_hook_count && other_count < MAX_OTHER_HOOKS; i++)
		other[other_count++] = &hami_vm_hooks[i];
	for (size_t i = 0; i < other_count; i++)
		other_real_of[i] = real_sym(other[i]->name);
}

void *hami_hook_for_real(void *real_fn)
{
	if (!real_fn)
		return NULL;
	pthread_once(&real_once, resolve_reals);
	for (size_t i = 0; i < HOOK_COUNT; i++)
		if (real_of[i] == real_fn)
			return hooks[i].hook;
	for (size_t i = 0; i < other_count; i++)
		if (other_real_of[i] == real_fn)
			return other[i]->hook;
	return real_fn;
}

/* Length of *name* without its per-thread-stream and version suffixes
 * ("cuMemAllocAsync_ptsz" -> "cuMemAllocAsync", "cuCtxCreate_v4" -> "cuCtxCreate"). */
static size_t base_length(const char *name)
{
	size_t n = strlen(name);
	if (n > 5 && (strcmp(name + n - 5, "_ptsz") == 0 || strcmp(name + n - 5, "_ptds") == 0))
		n -= 5;
	size_t d = n;
	while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9')
		d--;
	if (d < n && d >= 2 && name[d - 1] == 'v' && name[d - 2] == '_')
		n = d - 2;
	return n;
}

/* Whether cuGetProcAddress's *symbol* (a base name) names an entry point that guards
 * the slice, in any version. */
int hami_hooked_base(const char *symbol)
{
	size_t want = strlen(symbol);
	for (size_t i = 0; i < HOOK_COUNT; i++)
		if (base_length(hooks[i].name) == want && strncmp(hooks[i].name, symbol, want) == 0)
			return 1;
	return 0;
}
