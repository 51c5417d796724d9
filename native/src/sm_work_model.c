/*
 * The model of sm_work.c, alone: the speed-up of a busy second from the GPU's
 * power, its cap, its idle power and how busy it is. No NVML here, so that a
 * test can build this file by itself and hold it to the measured figures.
 */
#include <math.h>

#include "sm_work.h"

#define EXPONENT 0.45
#define MAX_SPEEDUP 1.5 /* fitted up to r = 1.5; no more is believed beyond */

uint32_t hami_sm_speedup_model(uint32_t power_mw, uint32_t cap_mw, uint32_t idle_mw, uint32_t busy_pct)
{
	if (!cap_mw || busy_pct < HAMI_SM_WORK_MIN_BUSY || busy_pct > 100 || idle_mw >= cap_mw || power_mw <= idle_mw)
		return HAMI_SM_WORK_ONE;
	double full = (double)(power_mw - idle_mw) * 100.0 / busy_pct; /* dynamic power at full duty */
	double r = full / (double)(cap_mw - idle_mw);
	if (r <= 1.0)
		return HAMI_SM_WORK_ONE;
	double s = pow(r, EXPONENT);
	if (s > MAX_SPEEDUP)
		s = MAX_SPEEDUP;
	return (uint32_t)(s * HAMI_SM_WORK_ONE + 0.5);
}
