/*
 * A GPU "busy or unavailable" while another process's GPU state moves
 * (docs/preload.md, "When the GPU is full"). While the driver checkpoints or
 * restores one process, it refuses other processes' calls on that GPU with
 * CUDA_ERROR_DEVICE_UNAVAILABLE: on an H100 a PyTorch session's first
 * context, on an H200 its stream creation (initGlobalStreamState) failed so
 * while the node agent parked another session. Such a refusal is a moment's
 * wait, not an error: the call is made again every BUSY_POLL_NS, bounded by
 * HAMI_ROOM_WAIT (0: never wait), and Jupyter's interrupt ends the wait.
 *
 * Not every such refusal is a move. A GPU in exclusive-process or
 * prohibited compute mode refuses a second process for good: passed on at
 * once. With the node agent's room ledger, the wait goes on only while the
 * ledger says a process's state moves on that GPU, or for BUSY_GRACE_NS
 * after the first refusal (a move that began after the agent's last look);
 * without a ledger, until HAMI_ROOM_WAIT runs out.
 */
#include <stdio.h>

#include "hami.h"

#define BUSY_POLL_NS 100000000ull   /* the call is made again this often */
#define BUSY_GRACE_NS 2000000000ull /* a move the agent has not seen yet */

typedef CUresult (*attribute_fn)(int *, int, CUdevice);

/* The compute mode's word, when it explains the refusal; NULL when it does not. */
static const char *compute_mode_refuses(int ordinal)
{
	attribute_fn attr = HAMI_REAL(attribute_fn, "cuDeviceGetAttribute");
	int mode = CU_COMPUTEMODE_DEFAULT;
	if (!attr || ordinal < 0 || attr(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, (CUdevice)ordinal) != CUDA_SUCCESS)
		return NULL;
	if (mode == CU_COMPUTEMODE_PROHIBITED)
		return "prohibited (no process may use it)";
	if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS)
		return "exclusive-process (one process at a time)";
	return NULL;
}

/* Whether the room ledger says a process's state moves on sdev's GPU now:
 * 1 yes, 0 no, -1 no ledger believed. */
static int ledger_says_moving(int sdev)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_ledger_gpu g;
	if (!f || sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES || hami_ledger_gpu(f->device[sdev].uuid, &g) < 0)
		return -1;
	return g.moving_until_unix_ns > hami_now_ns();
}

int hami_busy_wait(struct hami_busy *b, int sdev, int ordinal, const char *what)
{
	uint32_t wait_s = hami_config()->room_wait_s;
	char gpu[HAMI_SLICE_UUID_LEN + 8];
	if (!wait_s)
		return 0;
	if (ordinal < 0)
		ordinal = sdev >= 0 ? hami_device_ordinal(sdev) : -1;
	if (ordinal < 0)
		hami_current_device(&ordinal);
	if (sdev < 0)
		sdev = hami_ordinal_device(ordinal);
	const char *mode = compute_mode_refuses(ordinal);
	if (mode) {
		if (!b->told) {
			b->told = 1;
			hami_gpu_name(sdev, gpu, sizeof(gpu));
			hami_log(HAMI_LOG_ERROR, "%s refused %s: it is busy or unavailable, and its compute mode "
				 "is %s; nothing to wait for", gpu, what, mode);
		}
		return 0;
	}
	uint64_t now = hami_monotonic_ns();
	if (!b->since)
		b->since = now;
	uint64_t waited = now - b->since;
	if (waited >= (uint64_t)wait_s * 1000000000ull)
		return 0;
	int moving = ledger_says_moving(sdev);
	if (moving == 0 && waited >= BUSY_GRACE_NS)
		return 0; /* no park or resume under way: the driver's error stands */
	if (!b->told) {
		b->told = 1;
		hami_gpu_name(sdev, gpu, sizeof(gpu));
		hami_log(HAMI_LOG_WARN, "%s is busy (another process's GPU state is being moved to or from host "
			 "memory): %s waits, up to %u s", gpu, what, wait_s);
	}
	if (hami_pause_ns(BUSY_POLL_NS, b->since + (uint64_t)wait_s * 1000000000ull) < 0) {
		hami_gpu_name(sdev, gpu, sizeof(gpu));
		hami_log(HAMI_LOG_WARN, "the wait for busy %s was interrupted: %s fails", gpu, what);
		return 0;
	}
	return 1;
}
