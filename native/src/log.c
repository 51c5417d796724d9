/* Logging to stderr: one line per event, prefixed "hami:". Never exits. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hami.h"

static int log_level = -1;

/* LIBCUDA_LOG_LEVEL (HAMi's name) or HAMI_LOG_LEVEL: 0 errors .. 4 trace. */
static int read_level(void)
{
	const char *names[] = { "HAMI_LOG_LEVEL", "LIBCUDA_LOG_LEVEL" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *v = getenv(names[i]);
		if (!v || !*v)
			continue;
		char *end;
		long n = strtol(v, &end, 10);
		if (*end || n < 0 || n > 4) {
			fprintf(stderr, "hami: %s=\"%s\" is not a log level 0..4; using 1 (warnings)\n",
				names[i], v);
			return HAMI_LOG_WARN;
		}
		return (int)n;
	}
	return HAMI_LOG_WARN;
}

int hami_log_enabled(int level)
{
	int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
	if (l < 0) {
		l = read_level();
		__atomic_store_n(&log_level, l, __ATOMIC_RELAXED);
	}
	return level <= l;
}

void hami_log(int level, const char *fmt, ...)
{
	if (!hami_log_enabled(level))
		return;
	char line[1024];
	int n = snprintf(line, sizeof(line), "hami: ");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = strlen(line);
	line[len++] = '\n';
	/* One write(2): lines of concurrent processes do not interleave. */
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
}

const char *hami_human(uint64_t bytes, char buf[32])
{
	const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024.0 && u < 4) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, 32, "%.1f %s", v, unit[u]);
	return buf;
}

uint64_t hami_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t hami_monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int hami_report_due(uint64_t *last, uint64_t interval_ns)
{
	uint64_t now = hami_monotonic_ns();
	uint64_t seen = __atomic_load_n(last, __ATOMIC_RELAXED);
	if (seen && now - seen < interval_ns)
		return 0;
	return __atomic_compare_exchange_n(last, &seen, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
