/*
 * NVML memory answers sized to the slice, so nvidia-smi and pynvml inside a
 * slice show the slice: total = min(limit, physical), used = the slice's
 * usage on that GPU, free = the rest (clamped, never wrapped).
 */
#include <string.h>

#include "hami.h"
#include "hook_api.h"

typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*mem2_fn)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*uuid_fn)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*index_fn)(nvmlDevice_t, unsigned int *);

/* The slice's view of an NVML device: its limit and usage, or 0 if none applies. */
static int slice_view(nvmlDevice_t device, uint64_t *limit, uint64_t *used)
{
	uuid_fn get_uuid = HAMI_REAL(uuid_fn, "nvmlDeviceGetUUID");
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	if (!get_uuid || get_uuid(device, uuid, sizeof(uuid)) != NVML_SUCCESS)
		return 0;
	*limit = 0;
	*used = 0;
	if (hami_slice() || hami_slice_open_existing() == 0) {
		int sdev = hami_slice_device(uuid, NULL);
		if (sdev >= 0) {
			*limit = hami_device_limit_bytes(sdev);
			*used = hami_slice_live_used(sdev);
			return *limit != 0;
		}
		/* A GPU no process of the slice has met yet: the slice's fallback limit. */
		struct hami_device_limit fallback;
		if (hami_slice_limit(-1, &fallback) == 0 && (fallback.flags & HAMI_LIMIT_SET)) {
			*limit = fallback.memory_limit;
			return *limit != 0;
		}
	}
	/* No slice file entry for this GPU yet: the environment's limit applies. */
	index_fn get_index = HAMI_REAL(index_fn, "nvmlDeviceGetIndex");
	unsigned int index;
	if (!get_index || get_index(device, &index) != NVML_SUCCESS)
		return 0;
	int ordinal = hami_config_ordinal_of(uuid, (int)index);
	return ordinal >= 0 && hami_config_memory_limit(ordinal, limit);
}

/* Rewrite one NVML memory answer to the slice's view, if a limit applies. */
static void slice_sized(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
			unsigned long long *used)
{
	uint64_t limit, slice_used;
	if (hami_config()->error || !slice_view(device, &limit, &slice_used))
		return;
	uint64_t t = limit < *total ? limit : *total;
	uint64_t left = t > slice_used ? t - slice_used : 0;
	*total = t;
	*used = slice_used;
	*free = left < *free ? left : *free;
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	mem_fn fn = HAMI_REAL(mem_fn, "nvmlDeviceGetMemoryInfo");
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	nvmlReturn_t rc = fn(device, memory);
	if (rc == NVML_SUCCESS)
		slice_sized(device, &memory->total, &memory->free, &memory->used);
	return rc;
}

HAMI_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	mem2_fn fn = HAMI_REAL(mem2_fn, "nvmlDeviceGetMemoryInfo_v2");
	if (!memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!fn)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	nvmlReturn_t rc = fn(device, memory);
	if (rc == NVML_SUCCESS) {
		unsigned long long total = memory->total;
		slice_sized(device, &memory->total, &memory->free, &memory->used);
		if (memory->total != total)
			memory->reserved = 0; /* the driver's reservation is outside the slice */
	}
	return rc;
}
