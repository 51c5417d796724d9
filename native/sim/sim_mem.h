/*
 * Device memory contents (sim_mem.c): the owning process's backing store
 * (callers serialize), and the checkpoint calls another process makes on it.
 * libcuda.so.1 only.
 */
#ifndef HAMI_SIM_MEM_H
#define HAMI_SIM_MEM_H

#include <stdint.h>

#include "sim_state.h"

/* An extent of SIZE bytes in our backing file: 0, or -1 when none is left. */
SIM_HIDDEN int sim_mem_reserve(uint64_t size, uint64_t *off);
/* The extent mapped read-write (the file is created at the first call); NULL
 * on failure, printed once. */
SIM_HIDDEN void *sim_mem_map(uint64_t off, uint64_t size);
/* Unmap HOST (if mapped) and free the extent; DIRTY: something was written. */
SIM_HIDDEN void sim_mem_release(uint64_t off, uint64_t size, void *host, int dirty);
/* Forget the parent's file and extents (a forked child). */
SIM_HIDDEN void sim_mem_forget(void);

/* The checkpoint calls on process PID: SIM_OK, SIM_ENOENT (no such CUDA
 * process), SIM_EPERM (the caller may not act on it: sim_mem.c says who may),
 * SIM_ESTATE (not in the state the call needs; nothing changed),
 * SIM_ETIMEDOUT (lock), SIM_ENOMEM (restore: no room on a device) or SIM_EIO. */
SIM_HIDDEN int sim_ckpt_lock(int pid, uint64_t timeout_ms); /* 0: no timeout */
SIM_HIDDEN int sim_ckpt_checkpoint(int pid);
SIM_HIDDEN int sim_ckpt_restore(int pid);
SIM_HIDDEN int sim_ckpt_unlock(int pid);
/* *STATE: a CUprocessState value. */
SIM_HIDDEN int sim_ckpt_state(int pid, unsigned *state);

#endif
