/*
 * slow_locks: a test-only LD_PRELOAD shim, loaded before the preload library,
 * that makes every OFD lock call (F_OFD_SETLK) take a fraction of a
 * millisecond longer. Races between a process's own threads over the slot
 * locks then show within seconds rather than once in thousands of kills.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <time.h>

typedef int (*fcntl_fn)(int, int, ...);

int fcntl(int fd, int cmd, ...)
{
	static fcntl_fn real;
	va_list ap;
	va_start(ap, cmd);
	uintptr_t arg = va_arg(ap, uintptr_t);
	va_end(ap);
	if (!real)
		real = (fcntl_fn)dlsym(RTLD_NEXT, "fcntl");
	if (cmd == F_OFD_SETLK) {
		/* Longest between taking a lock and what follows: where a thread
		 * looks at what it believes it holds. */
		const struct flock *fl = (const struct flock *)arg;
		struct timespec before = { 0, 200000 }, after = { 0, fl->l_type == F_UNLCK ? 200000 : 2000000 };
		nanosleep(&before, NULL);
		int rc = real(fd, cmd, arg);
		nanosleep(&after, NULL);
		return rc;
	}
	return real(fd, cmd, arg);
}
