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

static uint64_t seen[HAMI_SLICE_MAX_DEVICES]; /* housekeeper only: last differing target + 1, or 0 */
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

static void true_up_device(struct hami_slot *s, int sdev)
{
	uint64_t real, low, high;
	/* The hooks' figure moves while NVML reads: an allocation made and freed
	 * again in that time may be in the reading, a free and a new allocation
	 * may have hidden memory the process holds. So the least and the most the
	 * slot held from just before the reading to just after it bound what the
	 * reading can say: more than the most is the driver's memory, less than
	 * the least is the driver giving some back. (Seen on the simulated GPU:
	 * 16 processes allocating and freeing as fast as they could were
	 * charged driver memory they did not have, 23 MB past the slice's cap;
	 * on an H100 a PyTorch loop doing the same had 32 of its 102 MiB of
	 * driver memory credited while the driver still held them.) */
	hami_slot_watch_start(sdev);
	if (hami_nvml_process_used(sdev, &real) < 0) {
		if (!told_not_listed++)
			hami_log(HAMI_LOG_INFO, "NVML does not list this process (another PID namespace?): "
				 "the driver's own memory is not charged to the slice here");
		return;
	}
	uint64_t driver = __atomic_load_n(&s->driver_bytes[sdev], __ATOMIC_ACQUIRE);
	hami_slot_watched(sdev, &low, &high);
	low = low > driver ? low - driver : 0; /* the hooks' part of the slot */
	high = high > driver ? high - driver : 0;
	uint64_t over = real > high ? real - high : 0;  /* at least this is the driver's */
	uint64_t under = real > low ? real - low : 0;   /* at most this is the driver's */
	int higher = over >= driver + NOISE_BYTES, lower = under + NOISE_BYTES <= driver;
	uint64_t target = higher ? over : under;
	uint64_t before = seen[sdev];
	if (!higher && !lower) {
		seen[sdev] = 0;
		return;
	}
	/* Believed when two readings in a row agree, higher or lower: a pool
	 * that grows by more than it was asked, charged by its hook just after
	 * the driver grew it, reads higher once. */
	if (!before || (before - 1 > driver) != higher) {
		seen[sdev] = target + 1; /* believed at the next reading */
		return;
	}
	seen[sdev] = 0;
	uint64_t agreed = before - 1;
	if (higher ? target < agreed : target > agreed)
		agreed = target; /* the one nearer what is charged */
	if (higher)
		hami_charge_force(sdev, agreed - driver);
	else
		hami_credit(sdev, driver - agreed);
	__atomic_store_n(&s->driver_bytes[sdev], agreed, __ATOMIC_RELEASE);
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
		seen[d] = 0;
	told_not_listed = 0;
}
