/*
 * The work a busy second buys.
 *
 * A power-limited GPU that is busy only part of the time runs its SMs at a
 * higher clock than under full load, so a time share alone on the GPU does
 * more than that share of the GPU's full-load work (H100, driver 580, a bf16
 * matmul loop: 29.6 % of the full-load throughput at a 25 % time share, the SM
 * clock at 1965 MHz against 1335 MHz at full load). A hard share is a share of
 * the work: the controller counts each busy percent of the slice as speed-up
 * times that percent, the speed-up being how much faster the GPU runs the
 * present work now than it would at full load.
 *
 * The estimate reads the power NVML reports. Busy a fraction b of the time,
 * with idle power Pi and power P now, the GPU running the same work all the
 * time at today's clocks would draw Pi + (P - Pi) / b. Past the power cap Pc
 * the GPU would lower its clocks until the cap holds: r = (that power - Pi) /
 * (Pc - Pi) says by how much too much, and the speed-up is r^0.45. Fitted on
 * the H100 (matmul at 25 / 50 / 75 % time: r = 1.44 / 1.39 / 1.27, measured
 * speed-ups 1.18 / 1.16 / 1.10); the H200's 50 % figure (r = 1.43, 1.20)
 * agrees. Work the cap would not bind (memory-bound, launch-bound: lower
 * power) has r <= 1, a speed-up of 1: its share is its time.
 *
 * The model itself is in sm_work_model.c. The idle power is the lowest power
 * seen while the GPU was idle; until one is seen, 17.5 % of the cap (an H100
 * at 700 W idles at 123 W).
 */
#include <stdlib.h>
#include <string.h>

#include "hami.h"
#include "sm_work.h"

#define IDLE_BUSY_PCT 2         /* at or below: a reading of the idle power */
#define DEFAULT_IDLE_PERMILLE 175

typedef nvmlReturn_t (*power_fn)(nvmlDevice_t, unsigned int *);

static struct {
	uint32_t cap_mw, idle_mw, milli;
	int cap_read;
} gpu[HAMI_SLICE_MAX_DEVICES];

/* Read the power of slice device sdev's GPU, busy busy_pct % of the last
 * sample; returns the smoothed speed-up (x1000). Housekeeper only. */
uint32_t hami_sm_work_update(int sdev, nvmlDevice_t dev, uint32_t busy_pct)
{
	power_fn usage = HAMI_REAL(power_fn, "nvmlDeviceGetPowerUsage");
	power_fn cap = HAMI_REAL(power_fn, "nvmlDeviceGetEnforcedPowerLimit");
	unsigned int mw = 0;
	if (sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return HAMI_SM_WORK_ONE;
	if (!gpu[sdev].cap_read) {
		unsigned int c = 0;
		gpu[sdev].cap_read = 1;
		if (cap && cap(dev, &c) == NVML_SUCCESS)
			gpu[sdev].cap_mw = c;
		gpu[sdev].idle_mw = gpu[sdev].cap_mw / 1000 * DEFAULT_IDLE_PERMILLE;
		__atomic_store_n(&gpu[sdev].milli, HAMI_SM_WORK_ONE, __ATOMIC_RELAXED);
	}
	if (!gpu[sdev].cap_mw || !usage || usage(dev, &mw) != NVML_SUCCESS)
		return __atomic_load_n(&gpu[sdev].milli, __ATOMIC_RELAXED);
	if (busy_pct <= IDLE_BUSY_PCT && mw < gpu[sdev].idle_mw)
		gpu[sdev].idle_mw = mw;
	uint32_t now = hami_sm_speedup_model(mw, gpu[sdev].cap_mw, gpu[sdev].idle_mw, busy_pct);
	uint32_t milli = __atomic_load_n(&gpu[sdev].milli, __ATOMIC_RELAXED);
	if (busy_pct >= HAMI_SM_WORK_MIN_BUSY) { /* smoothed over about three samples */
		milli = (2 * milli + now + 1) / 3;
		__atomic_store_n(&gpu[sdev].milli, milli, __ATOMIC_RELAXED);
	}
	return milli;
}

/* The last speed-up of sdev's GPU; any thread (the launch path reads it). */
uint32_t hami_sm_work_last(int sdev)
{
	if (sdev < 0 || sdev >= HAMI_SLICE_MAX_DEVICES)
		return HAMI_SM_WORK_ONE;
	uint32_t milli = __atomic_load_n(&gpu[sdev].milli, __ATOMIC_RELAXED);
	return milli ? milli : HAMI_SM_WORK_ONE;
}

/* A hard share is of the GPU's busy time (the default: what the share
 * promises, docs/sm-share.md); HAMI_SM_SHARE_OF=work weighs each busy
 * second by the model's speed-up instead. The speed-up is read from power,
 * and held slices below their share of the GPU's time wherever power
 * misjudged their work; with a time share a slice that the GPU's boost
 * serves better than its share keeps that. */
int hami_sm_share_of_time(void)
{
	static int cached = -1; /* any thread: read and set atomically */
	int known = __atomic_load_n(&cached, __ATOMIC_RELAXED);
	if (known < 0) {
		const char *v = getenv("HAMI_SM_SHARE_OF");
		known = !(v && strcmp(v, "work") == 0);
		int unset = -1;
		if (__atomic_compare_exchange_n(&cached, &unset, known, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
		    v && known && *v && strcmp(v, "time") != 0)
			hami_log(HAMI_LOG_WARN, "HAMI_SM_SHARE_OF=%s is neither time nor work: time it is", v);
	}
	return known;
}
