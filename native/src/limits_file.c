/*
 * The companion limits file ("<name>.limits" beside "<name>.slice"): limits a
 * hub or administrator owns, which the slice's processes may read but not
 * write. When it exists it is the authority; otherwise the slice file's own
 * limits block is. docs/slice-file.md has the rules.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hami.h"

static const struct hami_limits_file *mapped;

/* "<dir>/<name>.slice" -> "<dir>/<name>.limits"; any other path gets ".limits" added. */
static int limits_path(const char *slice_path, char *out, size_t cap)
{
	size_t n = strlen(slice_path);
	const size_t suffix = sizeof(HAMI_SLICE_SUFFIX) - 1;
	if (n > suffix && strcmp(slice_path + n - suffix, HAMI_SLICE_SUFFIX) == 0)
		n -= suffix;
	int w = snprintf(out, cap, "%.*s" HAMI_LIMITS_SUFFIX, (int)n, slice_path);
	return w > 0 && (size_t)w < cap ? 0 : -1;
}

static int check(const struct hami_limits_file *h, off_t size, const char *path)
{
	if ((size_t)size < sizeof(*h) || memcmp(h->magic, HAMI_LIMITS_MAGIC, 8) != 0) {
		hami_log(HAMI_LOG_ERROR, "%s is not a hami limits file (bad magic or %lld bytes); "
			 "ask whoever manages the slices to recreate it", path, (long long)size);
		return -1;
	}
	if (h->version_major != HAMI_LIMITS_VERSION_MAJOR) {
		hami_log(HAMI_LOG_ERROR, "limits file %s has layout version %u.%u; this library reads "
			 "version %u: upgrade hami-jupyter in this environment",
			 path, h->version_major, h->version_minor, HAMI_LIMITS_VERSION_MAJOR);
		return -1;
	}
	if (h->file_size < sizeof(*h) || (uint64_t)size < h->file_size) {
		hami_log(HAMI_LOG_ERROR, "limits file %s is truncated", path);
		return -1;
	}
	return 0;
}

/*
 * 0: no limits file (the slice file's block applies); 1: mapped; -1: present
 * but unusable, or it could not be looked for. Every doubt fails closed: a
 * slice whose hub-owned limits cannot be read must not fall back on the
 * user-owned block in the slice file.
 */
int hami_limits_file_map(const char *slice_path)
{
	char path[PATH_MAX];
	if (__atomic_load_n(&mapped, __ATOMIC_ACQUIRE))
		return 1; /* a read-only (NVML) attach came first; the file stays the same */
	if (!slice_path)
		return 0;
	if (limits_path(slice_path, path, sizeof(path)) < 0) {
		hami_log(HAMI_LOG_ERROR, "the limits file of a slice cannot be looked for: its path would be "
			 "longer than %d bytes, so CUDA is disabled; use a shorter slice path than %s",
			 PATH_MAX - 1, slice_path);
		return -1;
	}
	struct stat folder, st;
	if (hami_check_folder(path, &folder) < 0)
		return -1;
	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return hami_stat_missing(path, "limits file") < 0 ? -1 : 0;
		hami_log(HAMI_LOG_ERROR, "cannot look at limits file %s: %s", path, strerror(errno));
		return -1;
	}
	if (hami_check_file(path, &st, &folder, 1) < 0)
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		hami_log(HAMI_LOG_ERROR, "cannot open limits file %s: %s", path, strerror(errno));
		return -1;
	}
	struct stat opened;
	struct hami_limits_file h;
	memset(&h, 0, sizeof(h));
	if (fstat(fd, &opened) < 0 || pread(fd, &h, sizeof(h), 0) < 0) {
		hami_log(HAMI_LOG_ERROR, "cannot read limits file %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	if ((opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) &&
	    hami_check_file(path, &opened, &folder, 1) < 0) {
		close(fd);
		return -1;
	}
	if (check(&h, opened.st_size, path) < 0) {
		close(fd);
		return -1;
	}
	void *m = mmap(NULL, sizeof(struct hami_limits_file), PROT_READ, MAP_SHARED, fd, 0);
	close(fd); /* the mapping keeps the file */
	if (m == MAP_FAILED) {
		hami_log(HAMI_LOG_ERROR, "cannot map limits file %s: %s", path, strerror(errno));
		return -1;
	}
	__atomic_store_n(&mapped, (const struct hami_limits_file *)m, __ATOMIC_RELEASE);
	hami_log(HAMI_LOG_INFO, "limits of slice \"%s\" come from %s", hami_slice_name(), path);
	return 1;
}

int hami_limits_file_in_force(void)
{
	return __atomic_load_n(&mapped, __ATOMIC_ACQUIRE) != NULL;
}

/*
 * Whether an administrator's limits are in force: the hub keeps a marker
 * "<name>.limits.admin" beside the limits file while they are (written by
 * root, hami_jupyter/admin/marks.py), and believed only as root's regular
 * file that nobody else may write. For the out-of-memory line only: it says
 * who set the cap, nothing is enforced by it.
 */
int hami_limits_set_by_admin(void)
{
	char path[PATH_MAX];
	const char *slice_path = hami_config()->slice_path;
	struct stat st;
	if (!hami_limits_file_in_force() || !slice_path || limits_path(slice_path, path, sizeof(path)) < 0 ||
	    strlen(path) + sizeof(".admin") > sizeof(path))
		return 0;
	strcat(path, ".admin");
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && !(st.st_mode & 022);
}

const struct hami_slice_limits *hami_limits_block(const struct hami_slice_file *f)
{
	const struct hami_limits_file *l = __atomic_load_n(&mapped, __ATOMIC_ACQUIRE);
	return l ? &l->limits : &f->limits;
}
