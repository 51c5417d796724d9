/*
 * cuInit and cuGetProcAddress, and the one-time set-up that follows the real
 * cuInit: read the settings, learn the GPUs (by UUID), attach the slice file.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "hami.h"
#include "hook_api.h"

typedef CUresult (*cuInit_fn)(unsigned int);
typedef CUresult (*cuGetProcAddress_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*cuGetProcAddress_v2_fn)(const char *, void **, int, cuuint64_t,
					   CUdriverProcAddressQueryResult *);
typedef CUresult (*cuDeviceGetCount_fn)(int *);
typedef CUresult (*cuDeviceGet_fn)(CUdevice *, int);
typedef CUresult (*cuDeviceGetUuid_fn)(CUuuid *, CUdevice);
typedef CUresult (*cuDeviceTotalMem_fn)(size_t *, CUdevice);
typedef CUresult (*cuDeviceGetAttribute_fn)(int *, int, CUdevice);
typedef CUresult (*cuCtxGetDevice_fn)(CUdevice *);

enum { SETUP_NOT_YET, SETUP_DONE };

pthread_mutex_t hami_setup_lock = PTHREAD_MUTEX_INITIALIZER;
#define setup_lock hami_setup_lock
static int setup_state = SETUP_NOT_YET;
static CUresult setup_result;
static int ordinal_count;
static int ordinal_device[HAMI_MAX_CUDA_DEVICES]; /* CUDA ordinal -> slice device index */

static void format_uuid(const CUuuid *u, char out[HAMI_SLICE_UUID_LEN])
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, HAMI_SLICE_UUID_LEN,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
}

/* Learn every visible GPU. Returns a CUresult; NOT_INITIALIZED means "try later". */
static CUresult learn_devices(struct hami_device_info *info, int *count)
{
	cuDeviceGetCount_fn get_count = HAMI_REAL(cuDeviceGetCount_fn, "cuDeviceGetCount");
	cuDeviceGet_fn get = HAMI_REAL(cuDeviceGet_fn, "cuDeviceGet");
	cuDeviceGetUuid_fn get_uuid = HAMI_REAL(cuDeviceGetUuid_fn, "cuDeviceGetUuid_v2");
	cuDeviceTotalMem_fn total = HAMI_REAL(cuDeviceTotalMem_fn, "cuDeviceTotalMem_v2");
	cuDeviceGetAttribute_fn attr = HAMI_REAL(cuDeviceGetAttribute_fn, "cuDeviceGetAttribute");
	if (!get_uuid)
		get_uuid = HAMI_REAL(cuDeviceGetUuid_fn, "cuDeviceGetUuid");
	if (!get_count || !get || !get_uuid || !total || !attr) {
		hami_log(HAMI_LOG_ERROR, "the CUDA driver lacks device queries this library needs");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	int n = 0;
	CUresult rc = get_count(&n);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (n > HAMI_MAX_CUDA_DEVICES)
		n = HAMI_MAX_CUDA_DEVICES;
	for (int i = 0; i < n; i++) {
		CUdevice dev;
		CUuuid uuid;
		size_t bytes = 0;
		int sms = 0;
		if ((rc = get(&dev, i)) != CUDA_SUCCESS || (rc = get_uuid(&uuid, dev)) != CUDA_SUCCESS ||
		    (rc = total(&bytes, dev)) != CUDA_SUCCESS)
			return rc;
		attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
		format_uuid(&uuid, info[i].uuid);
		info[i].memory_total = bytes;
		info[i].sm_count = (uint32_t)sms;
	}
	*count = n;
	return CUDA_SUCCESS;
}

/*
 * A limit in this process's environment that the slice file overrides: say so
 * once, with both values. The file is the slice's authority (an admin may
 * have changed it live); the environment only seeds a new file.
 */
static void warn_if_environment_differs(int ordinal, int sdev)
{
	struct hami_device_limit in_force;
	uint64_t asked;
	uint32_t share;
	char a[32], b[32];
	if (hami_slice_limit(sdev, &in_force) < 0)
		return;
	const char *authority = hami_limits_file_in_force() ? "the hub's limits file" : "the slice file";
	if (hami_config_memory_limit(ordinal, &asked) && asked != in_force.memory_limit)
		hami_log(HAMI_LOG_WARN, "slice \"%s\" GPU %d: this process's environment asks for a %s "
			 "memory limit, %s holds %s; %s applies", hami_slice_name(), ordinal,
			 hami_human(asked, a), authority,
			 in_force.memory_limit ? hami_human(in_force.memory_limit, b) : "no limit", authority);
	if (hami_config_sm_share(ordinal, &share) && share % 100 != in_force.sm_share % 100)
		hami_log(HAMI_LOG_WARN, "slice \"%s\" GPU %d: this process's environment asks for an SM "
			 "share of %u %%, %s holds %u %%; %s applies", hami_slice_name(), ordinal,
			 share % 100, authority, in_force.sm_share % 100, authority);
}

static CUresult run_setup(void)
{
	if (hami_config()->error)
		return CUDA_ERROR_INVALID_VALUE;
	struct hami_device_info info[HAMI_MAX_CUDA_DEVICES];
	int n = 0;
	CUresult rc = learn_devices(info, &n);
	if (rc == CUDA_ERROR_NOT_INITIALIZED)
		return rc;
	if (rc != CUDA_SUCCESS) {
		hami_log(HAMI_LOG_ERROR, "cannot list the GPUs (CUDA error %d)", rc);
		return rc;
	}
	rc = hami_slice_attach(info, n < HAMI_SLICE_MAX_DEVICES ? n : HAMI_SLICE_MAX_DEVICES);
	if (rc != CUDA_SUCCESS)
		return rc;
	for (int i = 0; i < n; i++) {
		ordinal_device[i] = hami_slice_device(info[i].uuid, &info[i]);
		if (ordinal_device[i] == -2) {
			hami_log(HAMI_LOG_ERROR, "slice \"%s\": another process has been entering GPU %d (%s) "
				 "for over 100 ms; CUDA is disabled in this process rather than leave that GPU "
				 "unlimited: start it again", hami_slice_name(), i, info[i].uuid);
			return CUDA_ERROR_NOT_READY;
		}
		if (ordinal_device[i] < 0) {
			hami_log(HAMI_LOG_ERROR, "slice \"%s\" already holds the %d GPUs a slice can hold and "
				 "has no room for GPU %d (%s); CUDA is disabled in this process rather than leave "
				 "that GPU unlimited: list at most %d GPUs in CUDA_VISIBLE_DEVICES, or use "
				 "another slice", hami_slice_name(), HAMI_SLICE_MAX_DEVICES, i, info[i].uuid,
				 HAMI_SLICE_MAX_DEVICES);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		warn_if_environment_differs(i, ordinal_device[i]);
	}
	ordinal_count = n;
	hami_sm_refresh();
	hami_slot(); /* every CUDA process shows in the slice, and keeps it tidy */
	return CUDA_SUCCESS;
}

/* CUDA_SUCCESS when ready, the error to fail with, or -1: driver not initialised. */
int hami_setup(void)
{
	if (__atomic_load_n(&setup_state, __ATOMIC_ACQUIRE) == SETUP_DONE)
		return setup_result;
	pthread_mutex_lock(&setup_lock);
	if (setup_state != SETUP_DONE) {
		CUresult rc = run_setup();
		if (rc == CUDA_ERROR_NOT_INITIALIZED) {
			pthread_mutex_unlock(&setup_lock);
			return -1;
		}
		setup_result = rc;
		__atomic_store_n(&setup_state, SETUP_DONE, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&setup_lock);
	return setup_result;
}

int hami_ordinal_count(void)
{
	return ordinal_count;
}

int hami_ordinal_device(int ordinal)
{
	if (ordinal < 0 || ordinal >= ordinal_count)
		return -1;
	return ordinal_device[ordinal];
}

int hami_device_ordinal(int sdev)
{
	for (int o = 0; sdev >= 0 && o < ordinal_count; o++)
		if (ordinal_device[o] == sdev)
			return o;
	return -1;
}

/* "GPU 1" by the CUDA ordinal the program knows (what torch.device("cuda:1")
 * names), else by the slice's UUID of it: the index people read, after
 * CUDA_VISIBLE_DEVICES. */
void hami_gpu_name(int sdev, char *out, size_t cap)
{
	int o = hami_device_ordinal(sdev);
	struct hami_slice_file *f = hami_slice();
	if (o >= 0)
		snprintf(out, cap, "GPU %d", o);
	else if (f && sdev >= 0 && sdev < HAMI_SLICE_MAX_DEVICES && f->device[sdev].uuid[0])
		snprintf(out, cap, "GPU %.*s", HAMI_SLICE_UUID_LEN - 1, f->device[sdev].uuid);
	else
		snprintf(out, cap, "GPU ?");
}

int hami_current_device(int *ordinal)
{
	cuCtxGetDevice_fn get_device = HAMI_REAL(cuCtxGetDevice_fn, "cuCtxGetDevice");
	CUdevice dev;
	if (!get_device || get_device(&dev) != CUDA_SUCCESS)
		return -1;
	if (ordinal)
		*ordinal = dev;
	return hami_ordinal_device(dev);
}

HAMI_EXPORT CUresult cuInit(unsigned int flags)
{
	cuInit_fn real = HAMI_REAL(cuInit_fn, "cuInit");
	if (!real)
		return CUDA_ERROR_NO_DEVICE;
	if (hami_config()->error)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = real(flags);
	if (rc != CUDA_SUCCESS)
		return rc;
	int s = hami_setup();
	return s < 0 ? CUDA_ERROR_NOT_INITIALIZED : (CUresult)s;
}

/*
 * What cuGetProcAddress hands out: our hook for an entry point we hook. A
 * pointer the driver gives for a name we hook (in some version) but that is
 * none of the entry points we know (an old version we do not charge, or a
 * driver that hands out internal addresses) would bypass the slice: refused,
 * and said, rather than passed on.
 */
static CUresult hooked_proc(const char *symbol, void **pfn, int version, CUdriverProcAddressQueryResult *status)
{
	void *hook = hami_hook_for_real(*pfn);
	if (hook != *pfn || !*pfn) {
		*pfn = hook;
		return CUDA_SUCCESS;
	}
	if (!hami_hooked_base(symbol)) { /* not ours to charge: it passes the parking gate */
		*pfn = hami_gate_thunk(symbol, *pfn);
		return CUDA_SUCCESS;
	}
	hami_log(HAMI_LOG_ERROR, "cuGetProcAddress(\"%s\", version %d) returned an entry point this "
		 "library does not know, which would escape the slice's limits: refused (is the "
		 "driver newer than hami-jupyter, or the program asking for a CUDA version older "
		 "than 3.2?)", symbol, version);
	*pfn = NULL;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}

HAMI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	cuGetProcAddress_fn real = HAMI_REAL(cuGetProcAddress_fn, "cuGetProcAddress");
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE; /* the real driver crashes on these */
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real(symbol, pfn, cudaVersion, flags);
	return rc == CUDA_SUCCESS ? hooked_proc(symbol, pfn, cudaVersion, NULL) : rc;
}

HAMI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
					 CUdriverProcAddressQueryResult *status)
{
	cuGetProcAddress_v2_fn real = HAMI_REAL(cuGetProcAddress_v2_fn, "cuGetProcAddress_v2");
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE; /* the real driver crashes on these */
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real(symbol, pfn, cudaVersion, flags, status);
	return rc == CUDA_SUCCESS ? hooked_proc(symbol, pfn, cudaVersion, status) : rc;
}
