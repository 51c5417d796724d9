/*
 * The true-up: the slice's charge follows what the device really holds for
 * this process. The hooks charge what programs ask for; the driver also takes
 * memory by itself (modules and kernels loaded lazily, local memory growing
 * with the kernels that run, library handles), which no hook sees. Once a
 * second the housekeeper asks NVML what the process really holds on each GPU
 * and charges the difference (slot.driver_bytes), forced: the bytes are
 * already taken, so it is the next allocation past the cap that is refused.
 *
 * Only upward of what the hooks charged: a charge is made before its
 * allocation and a credit after its free, so an allocation or free in flight
 * makes the real figure look smaller for a moment, never larger, provided the
 * hooks' figure compared is the larger of the ones read just before and just
 * after NVML's. A higher or lower figure is believed when two readings in a
 * row agree (the smaller of the two is taken when higher).
 *
 * NVML lists host PIDs: in a container with its own PID namespace this
 * process is not found, and nothing is trued up (the host's guard sees it).
 * It is not asked while the process is parked: a locked process's NVML calls
 * block.
 */
#include <unistd.h>

#include "hami.h"

#define TRUE_UP_TICKS 20              /* housekeeper ticks (50 ms) between readings */
#define NOISE_BYTES (2ull << 20)      /* differences below this are left alone */
#define MAX_PROCESSES 256
#define NVML_NOT_AVAILABLE (~0ull)    /* usedGpuMemory when NVML cannot tell */

typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

static uint64_t lower_seen[HAMI_SLICE_MAX_DEVICES]; /* housekeeper only: last lower target, +1 */
static uint64_t higher_seen[HAMI_SLICE_MAX_DEVICES]; /* housekeeper only: last higher target, or 0 */
static int told_not_listed;

int hami_nvml_process_used(int sdev, uint64_t *used)
{
	procs_fn compute = HAMI_REAL(procs_fn, "nvmlDeviceGetComputeRunningProcesses_v3");
	procs_fn graphics = HAMI_REAL(procs_fn, "nvmlDeviceGetGraphicsRunningProcesses_v3");
	nvmlDevice_t dev = hami_nvml_device(sdev);
	nvmlProcessInfo_t info[MAX_PROCESSES]; /* 6 KiB of stack */
	procs_fn lists[2] = { compute, graphics };
	int found = 0;
	uint64_t sum = 0;
	if (!dev || !compute)
		return -1;
	for (int l = 0; l < 2; l++) {
		unsigned int n = MAX_PROCESSES;
		if (!lists[l] || lists[l](dev, &n, info) != NVML_SUCCESS)
			continue;
		for (unsigned int i = 0; i < n && i < MAX_PROCESSES; i++) {
			if (info[i].pid != (unsigned int)getpid())
				continue;
			if (info[i].usedGpuMemory == NVML_NOT_AVAILABLE)
				return -1;
			/* A process that is both is listed twice with the same figure. */
			if (!found || info[i].usedGpuMemory > sum)
				sum = info[i].usedGpuMemory;
			found = 1;
		}
	}
	if (!found)
		return -1;
	*used = sum;
	return 0;
}

/* What the hooks have charged the process on sdev (its charge less the driver's part). */
static uint64_t hooks_charged(struct hami_slot *s, int sdev)
{
	uint64_t charged = __atomic_load_n(&s->memory_used[sdev], __ATOMIC_ACQUIRE);
	uint64_t driver = __atomic_load_n(&s->driver_bytes[sdev], __ATOMIC_ACQUIRE);
	return charged > driver ? charged - driver : 0;
}

static void true_up_device(struct hami_slot *s, int sdev)
{
	uint64_t real;
	/* The hooks' figure before and after the reading, the larger: a free
	 * between them was still in the reading, an allocation maybe already. */
	uint64_t hooks = hooks_charged(s, sdev);
	if (hami_nvml_process_used(sdev, &real) < 0) {
		if (!told_not_listed++)
			hami_log(HAMI_LOG_INFO, "NVML does not list this process (another PID namespace?): "
				 "the driver's own memory is not charged to the slice here");
		return;
	}
	uint64_t after = hooks_charged(s, sdev);
	uint64_t driver = __atomic_load_n(&s->driver_bytes[sdev], __ATOMIC_ACQUIRE);
	if (after > hooks)
		hooks = after;
	uint64_t target = real > hooks ? real - hooks : 0;
	if (target >= driver + NOISE_BYTES) {
		/* Believed when two readings in a row agree, as a lower one is: a
		 * pool that grows by more than it was asked is charged by its hook
		 * just after the driver grew it, and one reading may fall between. */
		lower_seen[sdev] = 0;
		if (!higher_seen[sdev]) {
			higher_seen[sdev] = target;
			return;
		}
		uint64_t higher = target < higher_seen[sdev] ? target : higher_seen[sdev];
		higher_seen[sdev] = 0;
		if (higher >= driver + NOISE_BYTES) {
			hami_charge_force(sdev, higher - driver);
			__atomic_store_n(&s->driver_bytes[sdev], higher, __ATOMIC_RELEASE);
		}
	} else if (target + NOISE_BYTES <= driver) {
		higher_seen[sdev] = 0;
		if (!lower_seen[sdev]) {
			lower_seen[sdev] = target + 1; /* believed at the next reading */
			return;
		}
		uint64_t lower = target > lower_seen[sdev] - 1 ? target : lower_seen[sdev] - 1;
		lower_seen[sdev] = 0;
		if (lower < driver) {
			hami_credit(sdev, driver - lower);
			__atomic_store_n(&s->driver_bytes[sdev], lower, __ATOMIC_RELEASE);
		}
	} else {
		lower_seen[sdev] = higher_seen[sdev] = 0;
	}
}

void hami_true_up_tick(void)
{
	static unsigned int ticks;
	if (ticks++ % TRUE_UP_TICKS != 0)
		return;
	struct hami_slice_file *f = hami_slice();
	int slot = hami_slot();
	if (!f || slot < 0)
		return;
	struct hami_slot *s = &f->slot[slot];
	if (__atomic_load_n(&s->park_state, __ATOMIC_ACQUIRE) != HAMI_PARK_RUNNING)
		return;
	for (int o = 0; o < hami_ordinal_count(); o++) {
		int sdev = hami_ordinal_device(o);
		if (sdev >= 0)
			true_up_device(s, sdev);
	}
}

void hami_true_up_after_fork(void)
{
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		lower_seen[d] = higher_seen[d] = 0;
	told_not_listed = 0;
}
