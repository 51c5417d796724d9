/*
 * Whether a slice folder or file may be trusted before it is used. Another
 * local user must not be able to make our slice folder first (the fallback
 * /tmp/hami-jupyter-<uid> is guessable), plant a slice file with a tiny cap,
 * read our slots, or swap a file under us. hami_jupyter/slice/paths.py holds
 * the same rule for the Python side:
 *
 *  - a folder is owned by this user or root, and is not writable by others
 *    unless sticky (as /tmp, where nobody can remove or rename our files);
 *  - a file is a regular file, not writable by others, owned by this user or
 *    root, or lies in a root-owned folder nobody else may write (the hub's,
 *    where the hub hands each user their own files).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hami.h"

const char *hami_file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG: return "a regular file";
	case S_IFDIR: return "a directory";
	case S_IFIFO: return "a FIFO (named pipe)";
	case S_IFSOCK: return "a socket";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFLNK: return "a symbolic link";
	default: return "not a regular file";
	}
}

static int trusted_owner(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

int hami_check_folder(const char *file_path, struct stat *folder)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(file_path, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == file_path)
		snprintf(dir, sizeof(dir), "/");
	else if (snprintf(dir, sizeof(dir), "%.*s", (int)(slash - file_path), file_path) >= (int)sizeof(dir)) {
		hami_log(HAMI_LOG_ERROR, "slice path %s is too long", file_path);
		return -1;
	}
	if (stat(dir, folder) < 0) {
		if (errno == ENOENT)
			return -ENOENT; /* not made yet: the caller makes it, or has nothing to read */
		hami_log(HAMI_LOG_ERROR, "cannot check slice folder %s: %s", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(folder->st_mode)) {
		hami_log(HAMI_LOG_ERROR, "slice folder %s is %s, not a directory", dir,
			 hami_file_kind(folder->st_mode));
		return -1;
	}
	if (!trusted_owner(folder->st_uid)) {
		hami_log(HAMI_LOG_ERROR, "slice folder %s belongs to uid %u, not to you (uid %u) or root: "
			 "another user may have made it to plant slice files; remove it, or set "
			 "HAMI_SLICE_ROOT to a folder you own", dir, (unsigned)folder->st_uid,
			 (unsigned)geteuid());
		return -1;
	}
	if ((folder->st_mode & S_IWOTH) && !(folder->st_mode & S_ISVTX)) {
		hami_log(HAMI_LOG_ERROR, "slice folder %s is writable by every user (mode %03o): anyone "
			 "could swap slice files there; run chmod o-w on it, or set HAMI_SLICE_ROOT to a "
			 "folder only you can write", dir, (unsigned)(folder->st_mode & 07777));
		return -1;
	}
	return 0;
}

int hami_check_file(const char *path, const struct stat *st, const struct stat *folder, int owner_only)
{
	if (!S_ISREG(st->st_mode)) {
		hami_log(HAMI_LOG_ERROR, "%s is %s, not a slice file: refused; remove it or point "
			 "HAMI_SLICE at a slice file", path, hami_file_kind(st->st_mode));
		return -1;
	}
	int hub_folder = folder->st_uid == 0 && !(folder->st_mode & S_IWOTH);
	if (!trusted_owner(st->st_uid) && (owner_only || !hub_folder)) {
		hami_log(HAMI_LOG_ERROR, "%s belongs to uid %u, not to you (uid %u) or root: another "
			 "user may have planted it; remove it, or set HAMI_SLICE_ROOT to a folder you own",
			 path, (unsigned)st->st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st->st_mode & S_IWOTH) {
		hami_log(HAMI_LOG_ERROR, "%s is writable by every user (mode %03o): refused; run "
			 "chmod o-w on it", path, (unsigned)(st->st_mode & 07777));
		return -1;
	}
	return 0;
}

int hami_stat_missing(const char *path, const char *what)
{
	struct stat link;
	if (lstat(path, &link) == 0 && S_ISLNK(link.st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = '\0';
		hami_log(HAMI_LOG_ERROR, "%s %s is a symbolic link to %s, which does not exist: refused; "
			 "remove the link or make its target", what, path, n > 0 ? target : "(unreadable)");
		return -1;
	}
	return 0;
}
