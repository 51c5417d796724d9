/*
 * The work a busy second buys: the model (sm_work_model.c, no NVML, so that
 * a test can hold it to the figures it was fitted on) and its use (sm_work.c).
 */
#ifndef HAMI_SM_WORK_H
#define HAMI_SM_WORK_H

#include <stdint.h>

#define HAMI_SM_WORK_ONE 1000u     /* speed-up 1.000 */
#define HAMI_SM_WORK_MIN_BUSY 5u /* percent busy below which nothing is told */

/* How much faster (x1000) the GPU runs its present work than it would at full
 * load, from its power draw now, its power cap, its idle power (milliwatts)
 * and the percent of time it is busy. HAMI_SM_WORK_ONE when the cap would not
 * bind at full load, or nothing is known. */
uint32_t hami_sm_speedup_model(uint32_t power_mw, uint32_t cap_mw, uint32_t idle_mw, uint32_t busy_pct);

#endif
