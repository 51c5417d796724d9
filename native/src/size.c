/*
 * Sizes as HAMi and Kubernetes users write them: plain bytes, or a decimal
 * number with a binary unit: 4g, 4096m, 4Gi, 1.5g, 1536MiB. Every unit is a
 * power of 1024 (HAMi's meaning of "g"). Zero is a size; whether it makes
 * sense (not as a memory limit) is the caller's call. hami_jupyter/slice/size.py
 * mirrors this.
 */
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "hami.h"

static int unit_shift(const char *u, unsigned *shift)
{
	static const char letters[] = "kmgt";
	if (!*u) {
		*shift = 0;
		return 0;
	}
	if ((u[0] == 'b' || u[0] == 'B') && !u[1]) {
		*shift = 0;
		return 0;
	}
	const char *p = strchr(letters, tolower((unsigned char)u[0]));
	if (!p || !u[0])
		return -1;
	*shift = 10u * (unsigned)(p - letters + 1);
	u++;
	/* optional "i", then optional "b": k, ki, kb, kib */
	if (*u == 'i' || *u == 'I')
		u++;
	if (*u == 'b' || *u == 'B')
		u++;
	return *u ? -1 : 0;
}

int hami_parse_size(const char *text, uint64_t *out)
{
	if (!text || !out)
		return -1;
	const char *s = text;
	uint64_t whole = 0, frac = 0, frac_scale = 1;
	int digits = 0;
	while (isdigit((unsigned char)*s)) {
		unsigned d = (unsigned)(*s - '0');
		if (whole > (UINT64_MAX - d) / 10)
			return -1;
		whole = whole * 10 + d;
		s++;
		digits++;
	}
	if (*s == '.') {
		s++;
		int fd = 0;
		while (isdigit((unsigned char)*s)) {
			if (fd < 9) { /* nanobyte precision is plenty */
				frac = frac * 10 + (uint64_t)(*s - '0');
				frac_scale *= 10;
			}
			s++;
			fd++;
		}
		if (fd == 0)
			return -1;
		digits += fd;
	}
	if (digits == 0)
		return -1;
	unsigned shift;
	if (unit_shift(s, &shift) < 0)
		return -1;
	if (shift == 0 && frac != 0)
		return -1; /* "1.5" bytes */
	if (shift && whole > (UINT64_MAX >> shift))
		return -1;
	uint64_t bytes = whole << shift;
	uint64_t part = (uint64_t)(((unsigned __int128)frac << shift) / frac_scale);
	if (bytes > UINT64_MAX - part)
		return -1;
	bytes += part;
	*out = bytes;
	return 0;
}
