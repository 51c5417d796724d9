/*
 * dlsym itself, and the way to glibc's. Programs find CUDA's entry points by
 * name; handing out our hook for a name the real library would have answered
 * is what puts every path under the slice's limits.
 *
 * Nothing here is instrumented by a sanitizer: the sanitizer runtimes look
 * their own interceptors up through dlsym before they are initialised, and so
 * reach this file first (the TSan build compiles it with -fno-sanitize=thread).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "hami.h"

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn real_dlsym_fn;
/* glibc's dlsym, for the trampoline below (which cannot call a function to get it). */
__attribute__((visibility("hidden"), used)) dlsym_fn hami_dlsym_next;

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

/*
 * Hooks are resolved by what the real library would hand out: a symbol the
 * caller found in libcuda/libnvidia-ml is swapped for our hook of that name.
 * Returns the hook, or NULL: "ask glibc's dlsym".
 */
UNINSTRUMENTED void *hami_dlsym_hook(void *handle, const char *name)
{
	__atomic_store_n(&hami_dlsym_next, find_real_dlsym(), __ATOMIC_RELAXED);
	if (!name || handle == RTLD_NEXT)
		return NULL;
	int cuda = name[0] == 'c' && name[1] == 'u';
	int cuvid = cuda && strncmp(name, "cuvid", 5) == 0;
	int nvml = strncmp(name, "nvml", 4) == 0;
	if (!cuda && !nvml)
		return NULL;
	void *hook = hami_hook_by_name(name);
	/* Driver API names are cu + a capital (cuCtxGetCurrent); cublas*, cudnn*, curl*... are not. */
	int driver_api = cuda && name[2] >= 'A' && name[2] <= 'Z';
	if (!hook && !driver_api)
		return NULL;
	void *found = hami_real_dlsym(handle, name);
	void *real = cuvid ? hami_cuvid_sym(name) : cuda ? hami_cuda_sym(name) : hami_nvml_sym(name);
	if (!found || found != real)
		return NULL;
	/* A driver function we do not hook passes the parking gate (park_gate_thunks.c). */
	return hook ? hook : hami_gate_thunk(name, real);
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
