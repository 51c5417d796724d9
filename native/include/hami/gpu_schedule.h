/*
 * The GPU schedule, layout version 1: one small file per physical GPU, shared
 * by every slice that has an SM share on it, so that their launch windows lie
 * side by side instead of on top of each other (where the GPU's own
 * time-slicing between processes would favour the larger slice).
 *
 * Each slice with a share on the GPU owns one entry, found by its key. Every
 * process of that slice holds an OFD *read* lock on the entry's first byte
 * for as long as it uses the entry; an entry nobody holds a lock on is free,
 * whatever its state says. A slice's window starts where the windows of the
 * live entries before it end. Each slice also says when it last launched,
 * so that the others know it is busy even where NVML does not show it.
 * Path: $HAMI_SCHEDULE_DIR (default /dev/shm)/hami-gpu-<GPU UUID>, created
 * readable and writable by everyone: slices of different users meet here
 * (the schedule is as cooperative as the preload).
 */
#ifndef HAMI_GPU_SCHEDULE_H
#define HAMI_GPU_SCHEDULE_H

#include <stdint.h>

#define HAMI_SCHEDULE_MAGIC "HAMISCHD"
#define HAMI_SCHEDULE_VERSION 1u
#define HAMI_SCHEDULE_ENTRIES 32

struct hami_schedule_entry {
	uint64_t key;       /* the slice: hash of its name and creation time */
	uint32_t open_ppm;  /* the slice's window, parts per million of the period */
	uint32_t state;     /* 1: claimed (live only while someone holds its lock) */
	uint64_t active_ns; /* CLOCK_MONOTONIC of the slice's latest launch, as of a
			     * tick; 1: none yet; 0: not told (an older library) */
	uint8_t reserved[40];
};

struct hami_schedule_file {
	char magic[8];
	uint32_t version;
	uint32_t entries; /* HAMI_SCHEDULE_ENTRIES */
	uint8_t reserved[48];
	struct hami_schedule_entry entry[HAMI_SCHEDULE_ENTRIES];
};

_Static_assert(sizeof(struct hami_schedule_entry) == 64, "schedule entry size");
_Static_assert(sizeof(struct hami_schedule_file) == 64 + 64 * HAMI_SCHEDULE_ENTRIES, "schedule size");

#endif
