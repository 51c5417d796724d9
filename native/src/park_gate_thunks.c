/*
 * The parking gate in front of every other driver entry point (docs/parking.md).
 *
 * A parked process is locked by the driver: any CUDA call blocks inside it,
 * not only the ones this library hooks. The CUDA runtime (PyTorch, CuPy, JAX)
 * gets every driver function through cuGetProcAddress, and often its first
 * call after a quiet spell is one nobody hooks (cuCtxGetCurrent, say): blocked
 * silently there, it would never ask for its GPU state back. So each entry
 * point cuGetProcAddress or dlsym hands out that has no hook of its own gets
 * a thunk: a few instructions that pass the gate (hami_call_begin: wait while
 * parked, asking for a resume; count the call as GPU activity) and then jump
 * to the real function with every argument register and the stack untouched,
 * whatever its prototype. Thunks are handed out once per real function, from
 * a fixed pool; when it runs out, or on a machine without thunks, the real
 * function is handed out as before.
 *
 * A thunk jumps, it does not return through here: its call is not marked as
 * inside the driver. A call that passed the gate just before a park started
 * reaches the driver before the park's lock (hami-park waits a moment first).
 */
#include <pthread.h>
#include <string.h>

#include "hami.h"

#define MAX_THUNKS 1024 /* the driver has about 600 entry points; ".rept 1024" below */
#define THUNK_BYTES 16

/* Read by the thunks (index in %r11): the real function each one jumps to. */
void *hami_thunk_real[MAX_THUNKS] __attribute__((visibility("hidden")));
static int thunks_used;
pthread_mutex_t hami_thunks_lock = PTHREAD_MUTEX_INITIALIZER;
#define thunks_lock hami_thunks_lock

/* Called by every thunk before its jump: the gate, and the call counted. */
__attribute__((visibility("hidden"))) void hami_gate_pass(void)
{
	hami_call_end(hami_call_begin());
}

#if defined(__x86_64__)
/*
 * hami_gate_common saves what a call may carry in registers (the six integer
 * argument registers, %rax for a varargs call's vector count, xmm0-7), calls
 * hami_gate_pass with the stack 16-byte aligned, restores them and jumps to
 * hami_thunk_real[%r11]. %r10 and %r11 are scratch at a call in the SysV ABI.
 * Each thunk is endbr64 (for CET), "movl $i, %r11d", "jmp hami_gate_common",
 * padded to 16 bytes.
 */
__asm__(".text\n"
	".balign 16\n"
	".type hami_gate_common, @function\n"
	"hami_gate_common:\n"
	"	pushq %rdi\n"
	"	pushq %rsi\n"
	"	pushq %rdx\n"
	"	pushq %rcx\n"
	"	pushq %r8\n"
	"	pushq %r9\n"
	"	pushq %rax\n"
	"	pushq %r11\n"
	"	subq $136, %rsp\n"
	"	movdqu %xmm0, 0(%rsp)\n"
	"	movdqu %xmm1, 16(%rsp)\n"
	"	movdqu %xmm2, 32(%rsp)\n"
	"	movdqu %xmm3, 48(%rsp)\n"
	"	movdqu %xmm4, 64(%rsp)\n"
	"	movdqu %xmm5, 80(%rsp)\n"
	"	movdqu %xmm6, 96(%rsp)\n"
	"	movdqu %xmm7, 112(%rsp)\n"
	"	call hami_gate_pass\n"
	"	movdqu 0(%rsp), %xmm0\n"
	"	movdqu 16(%rsp), %xmm1\n"
	"	movdqu 32(%rsp), %xmm2\n"
	"	movdqu 48(%rsp), %xmm3\n"
	"	movdqu 64(%rsp), %xmm4\n"
	"	movdqu 80(%rsp), %xmm5\n"
	"	movdqu 96(%rsp), %xmm6\n"
	"	movdqu 112(%rsp), %xmm7\n"
	"	addq $136, %rsp\n"
	"	popq %r11\n"
	"	popq %rax\n"
	"	popq %r9\n"
	"	popq %r8\n"
	"	popq %rcx\n"
	"	popq %rdx\n"
	"	popq %rsi\n"
	"	popq %rdi\n"
	"	leaq hami_thunk_real(%rip), %r10\n"
	"	jmpq *(%r10,%r11,8)\n"
	".size hami_gate_common, .-hami_gate_common\n"
	".balign 16\n"
	".type hami_gate_thunks, @function\n"
	"hami_gate_thunks:\n"
	"	.set thunk_index, 0\n"
	"	.rept 1024\n"
	"	endbr64\n"
	"	movl $thunk_index, %r11d\n"
	"	jmp hami_gate_common\n"
	"	.balign 16, 0xcc\n"
	"	.set thunk_index, thunk_index + 1\n"
	"	.endr\n"
	".size hami_gate_thunks, .-hami_gate_thunks\n");

extern char hami_gate_thunks[];
#define HAVE_THUNKS 1
#else
#define HAVE_THUNKS 0 /* aarch64: calls this library does not hook pass ungated */
#endif

#if HAVE_THUNKS
/* Entry points a thunk must not stand in front of: the checkpoint API (a parker
 * in this process would wait for itself) and calls that never touch a context. */
static int never_gated(const char *name)
{
	static const char *const names[] = { "cuCheckpoint", "cuGetErrorString", "cuGetErrorName",
					     "cuDriverGetVersion", "cuGetExportTable", NULL };
	for (int i = 0; names[i]; i++)
		if (strncmp(name, names[i], strlen(names[i])) == 0)
			return 1;
	return 0;
}

#endif

int hami_gate_thunks_available(void)
{
	return HAVE_THUNKS;
}

/* The thunk in front of the real driver function *real* named *name*, or *real*
 * itself (no thunks here, the pool spent, or a name never gated). */
void *hami_gate_thunk(const char *name, void *real)
{
#if HAVE_THUNKS
	if (!real || !name || never_gated(name))
		return real;
	void *thunk = real;
	pthread_mutex_lock(&thunks_lock);
	int i = 0;
	while (i < thunks_used && hami_thunk_real[i] != real)
		i++;
	if (i == thunks_used && i < MAX_THUNKS)
		__atomic_store_n(&hami_thunk_real[thunks_used++], real, __ATOMIC_RELEASE);
	if (i < thunks_used)
		thunk = hami_gate_thunks + (size_t)i * THUNK_BYTES;
	pthread_mutex_unlock(&thunks_lock);
	return thunk;
#else
	(void)name;
	return real;
#endif
}
