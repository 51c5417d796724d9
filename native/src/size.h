/*
 * The size grammar (size.c), shared by the preload library, the simulated GPU
 * and cudrive so that all three read "4g" the same way.
 */
#ifndef HAMI_SIZE_H
#define HAMI_SIZE_H

#include <stdint.h>

/* 0 and *out set, or -1 for anything that is not a size. Zero is a size. */
int hami_parse_size(const char *text, uint64_t *out);

#endif
