/*
 * The real libraries underneath the hooks: libcuda.so.1, libnvidia-ml.so.1 and
 * libnvcuvid.so.1, loaded once; their entry points are looked up through
 * glibc's dlsym (dlsym.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "hami.h"

static void *cuda_handle;
static void *nvml_handle;
static void *cuvid_handle;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuvid_once = PTHREAD_ONCE_INIT;

static void open_cuda(void)
{
	cuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cuda_handle)
		hami_log(HAMI_LOG_WARN, "cannot load libcuda.so.1 (%s): is the NVIDIA driver installed?",
			 dlerror());
}

static void open_nvml(void)
{
	nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!nvml_handle)
		hami_log(HAMI_LOG_DEBUG, "cannot load libnvidia-ml.so.1 (%s)", dlerror());
}

static void open_cuvid(void)
{
	cuvid_handle = dlopen("libnvcuvid.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cuvid_handle)
		hami_log(HAMI_LOG_DEBUG, "cannot load libnvcuvid.so.1 (%s)", dlerror());
}

/* NVDEC's entry points (libnvcuvid.so.1), for the cuvid hooks. */
void *hami_cuvid_sym(const char *name)
{
	pthread_once(&cuvid_once, open_cuvid);
	return cuvid_handle ? hami_real_dlsym(cuvid_handle, name) : NULL;
}

void *hami_cuda_sym(const char *name)
{
	pthread_once(&cuda_once, open_cuda);
	return cuda_handle ? hami_real_dlsym(cuda_handle, name) : NULL;
}

void *hami_nvml_sym(const char *name)
{
	pthread_once(&nvml_once, open_nvml);
	return nvml_handle ? hami_real_dlsym(nvml_handle, name) : NULL;
}

/* A real entry point looked up once into *cache (libnvcuvid for cuvid*, libcuda
 * for cu*, else NVML); NULL if absent. */
void *hami_cached_sym(void **cache, const char *name)
{
	void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
	if (!f) {
		f = strncmp(name, "cuvid", 5) == 0 ? hami_cuvid_sym(name)
	    : name[0] == 'c'               ? hami_cuda_sym(name)
					   : hami_nvml_sym(name);
		__atomic_store_n(cache, f, __ATOMIC_RELEASE);
	}
	return f;
}

typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_by_uuid_fn)(const char *, nvmlDevice_t *);

/*
 * The real NVML's handle of a slice GPU, looked up by UUID once. NVML stays
 * initialised for the life of the process (it counts its users).
 */
nvmlDevice_t hami_nvml_device(int sdev)
{
	static nvmlDevice_t handle[HAMI_SLICE_MAX_DEVICES];
	static int ready;
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return NULL;
	nvmlDevice_t known = __atomic_load_n(&handle[sdev], __ATOMIC_ACQUIRE);
	if (known)
		return known;
	nvml_init_fn init = HAMI_REAL(nvml_init_fn, "nvmlInit_v2");
	nvml_by_uuid_fn by_uuid = HAMI_REAL(nvml_by_uuid_fn, "nvmlDeviceGetHandleByUUID");
	/* Two threads may both initialise: NVML counts its users, and we never shut it down. */
	if (!init || !by_uuid || (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE) && init() != NVML_SUCCESS))
		return NULL;
	__atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
	nvmlDevice_t dev;
	if (by_uuid(f->device[sdev].uuid, &dev) != NVML_SUCCESS)
		return NULL;
	__atomic_store_n(&handle[sdev], dev, __ATOMIC_RELEASE);
	return dev;
}

typedef nvmlReturn_t (*nvml_memory_fn)(nvmlDevice_t, nvmlMemory_t *);

/* The real NVML's memory figures of a slice GPU (the physical device, not the
 * slice's view the hooks answer): 0, or -1 when NVML cannot say. */
int hami_nvml_memory(int sdev, nvmlMemory_t *out)
{
	nvml_memory_fn mem = HAMI_REAL(nvml_memory_fn, "nvmlDeviceGetMemoryInfo");
	nvmlDevice_t dev = hami_nvml_device(sdev);
	return mem && dev && mem(dev, out) == NVML_SUCCESS ? 0 : -1;
}
