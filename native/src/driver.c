/*
 * The real libraries underneath the hooks: glibc's dlsym, libcuda.so.1 and
 * libnvidia-ml.so.1. Lookups are cached by the callers; this file only loads.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "hami.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym_fn;
/* glibc's dlsym, for the trampoline below (which cannot call a function to get it). */
__attribute__((visibility("hidden"), used)) dlsym_fn hami_dlsym_next;
static void *cuda_handle;
static void *nvml_handle;
static void *cuvid_handle;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuvid_once = PTHREAD_ONCE_INIT;

/*
 * dlsym and the path to glibc's are not instrumented by the sanitizers: the
 * AddressSanitizer runtime looks its own symbols up through dlsym before it
 * is initialised, and so reaches this code first.
 */
#define UNINSTRUMENTED __attribute__((no_sanitize_address, no_sanitize_undefined))

UNINSTRUMENTED static dlsym_fn find_real_dlsym(void)
{
	dlsym_fn f = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
	if (f)
		return f;
	/* dlvsym is not hooked: ask for glibc's dlsym by version (2.34+, then older). */
	f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!f)
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	__atomic_store_n(&real_dlsym_fn, f, __ATOMIC_RELEASE);
	return f;
}

UNINSTRUMENTED void *hami_real_dlsym(void *handle, const char *name)
{
	dlsym_fn f = find_real_dlsym();
	return f ? f(handle, name) : NULL;
}

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
	static void *init_cache, *uuid_cache;
	struct hami_slice_file *f = hami_slice();
	if (!f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return NULL;
	if (handle[sdev])
		return handle[sdev];
	nvml_init_fn init = (nvml_init_fn)hami_cached_sym(&init_cache, "nvmlInit_v2");
	nvml_by_uuid_fn by_uuid = (nvml_by_uuid_fn)hami_cached_sym(&uuid_cache, "nvmlDeviceGetHandleByUUID");
	if (!init || !by_uuid || (!ready && init() != NVML_SUCCESS))
		return NULL;
	ready = 1;
	nvmlDevice_t dev;
	if (by_uuid(f->device[sdev].uuid, &dev) != NVML_SUCCESS)
		return NULL;
	handle[sdev] = dev;
	return dev;
}

/*
 * Hooks are resolved by what the real library would hand out: a symbol the
 * caller found in libcuda/libnvidia-ml is swapped for our hook of that name.
 * Returns the hook, or NULL: "ask glibc's dlsym".
 */
UNINSTRUMENTED __attribute__((no_sanitize("thread"))) void *hami_dlsym_hook(void *handle, const char *name)
{
	hami_dlsym_next = find_real_dlsym();
	if (!name || handle == RTLD_NEXT)
		return NULL;
	int cuda = name[0] == 'c' && name[1] == 'u';
	int cuvid = cuda && strncmp(name, "cuvid", 5) == 0;
	int nvml = strncmp(name, "nvml", 4) == 0;
	if (!cuda && !nvml)
		return NULL;
	void *hook = hami_hook_by_name(name);
	if (!hook)
		return NULL;
	void *found = hami_real_dlsym(handle, name);
	void *real = cuvid ? hami_cuvid_sym(name) : cuda ? hami_cuda_sym(name) : hami_nvml_sym(name);
	return found && found == real ? hook : NULL;
}

/*
 * dlsym itself. glibc resolves RTLD_NEXT (and the scope of RTLD_DEFAULT)
 * relative to the object its caller's return address lies in, so the real
 * dlsym must be entered with the caller's return address, not ours. A C
 * function can only promise that through a tail call the optimiser may or may
 * not make; this trampoline makes it at every optimisation level: it asks
 * hami_dlsym_hook, and when that has no hook it jumps to glibc's dlsym with
 * the caller's arguments and return address untouched.
 */
#if defined(__x86_64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	pushq %rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	pushq %rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	subq $8, %rsp\n" /* 16-byte alignment at the call */
	"	.cfi_adjust_cfa_offset 8\n"
	"	call hami_dlsym_hook\n"
	"	addq $8, %rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	testq %rax, %rax\n"
	"	jnz 1f\n"
	"	jmpq *hami_dlsym_next(%rip)\n"
	"1:	ret\n"
	"	.cfi_endproc\n"
	".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, %function\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	stp x29, x30, [sp, #-32]!\n"
	"	.cfi_def_cfa_offset 32\n"
	"	.cfi_offset 29, -32\n"
	"	.cfi_offset 30, -24\n"
	"	mov x29, sp\n"
	"	stp x0, x1, [sp, #16]\n"
	"	bl hami_dlsym_hook\n"
	"	cbnz x0, 1f\n"
	"	ldp x0, x1, [sp, #16]\n"
	"	ldp x29, x30, [sp], #32\n"
	"	.cfi_def_cfa_offset 0\n"
	"	adrp x16, hami_dlsym_next\n"
	"	ldr x16, [x16, :lo12:hami_dlsym_next]\n"
	"	br x16\n"
	"1:	ldp x29, x30, [sp], #32\n"
	"	ret\n"
	"	.cfi_endproc\n"
	".size dlsym, .-dlsym\n");
#else
#error "dlsym trampoline: only x86-64 and aarch64 are supported"
#endif
