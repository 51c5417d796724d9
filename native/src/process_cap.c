/*
 * A process's own cap inside its slice (HAMI_PROCESS_MEMORY_LIMIT, per GPU).
 * Under the hub every kernel of a server runs in the hub's slice; a kernel
 * that asks for less gets that cap for each of its processes, nested inside
 * the slice's cap, which still holds for everyone. What a process holds is
 * its own business, so the counters are process-local: one compare-and-swap
 * makes the cap exact between this process's threads.
 */
#include "hami.h"

static uint64_t held[HAMI_SLICE_MAX_DEVICES];

uint64_t hami_process_limit(void)
{
	const struct hami_config *c = hami_config();
	return c->has_process_limit ? c->process_limit : 0;
}

uint64_t hami_process_held(int sdev)
{
	return sdev >= 0 && sdev < HAMI_SLICE_MAX_DEVICES ? __atomic_load_n(&held[sdev], __ATOMIC_ACQUIRE) : 0;
}

/* Take bytes under the cap: 0, or -1 (refused; *now: what the process holds). */
int hami_process_take(int sdev, uint64_t bytes, uint64_t *now)
{
	uint64_t cap = hami_process_limit();
	uint64_t have = __atomic_load_n(&held[sdev], __ATOMIC_ACQUIRE);
	do {
		*now = have;
		if ((cap && (bytes > cap || have > cap - bytes)) || bytes >= UINT64_MAX - have)
			return -1;
	} while (!__atomic_compare_exchange_n(&held[sdev], &have, have + bytes, 1, __ATOMIC_ACQ_REL,
					      __ATOMIC_ACQUIRE));
	return 0;
}

/* Memory the driver already handed out: counted, whatever the cap. */
void hami_process_force(int sdev, uint64_t bytes)
{
	__atomic_add_fetch(&held[sdev], bytes, __ATOMIC_ACQ_REL);
}

void hami_process_give(int sdev, uint64_t bytes)
{
	uint64_t have = __atomic_load_n(&held[sdev], __ATOMIC_ACQUIRE);
	while (!__atomic_compare_exchange_n(&held[sdev], &have, have > bytes ? have - bytes : 0, 1,
					    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		;
}

/* A forked child holds nothing yet (CUDA does not cross fork). */
void hami_process_after_fork(void)
{
	for (int d = 0; d < HAMI_SLICE_MAX_DEVICES; d++)
		__atomic_store_n(&held[d], 0, __ATOMIC_RELEASE);
}
