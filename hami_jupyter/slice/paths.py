"""Where slices live: names, the slice root, paths, and whether they may be trusted.

A slice is named (by default after the user) and lives at
``<slice root>/<name>.slice``. Every tool accepts a slice by name or by path,
and a value containing ``/`` is a path. The root is, in order:

1. ``$HAMI_SLICE_ROOT``;
2. ``/run/hami-jupyter`` when it exists (the hub manages slices there);
3. ``$XDG_RUNTIME_DIR/hami-jupyter``;
4. ``/tmp/hami-jupyter-<uid>``.

The order and the names are the C header's (``slice_file.h``, mirrored in
:mod:`.layout`), and ``native/src/config.c`` resolves a bare ``HAMI_SLICE``
name by them, so a kernel and this module agree on the file whichever way it
was named (``tests/test_slice_root.py`` runs both).

Who owns what (docs/slice-file.md, "Who owns what"). Another local user must
not be able to make our slice folder first (``/tmp/hami-jupyter-<uid>`` is
easy to guess), plant a slice file with a tiny cap, read our slots, or swap a
file in. Before anything under a slice root is opened, created or listed,
this module checks the rule ``native/src/trust.c`` checks, and raises
:class:`UntrustedPath` (a :class:`PermissionError`) naming the path, the
owner found and the fix:

- a folder is owned by this user or root, and is not writable by other users
  unless it is sticky (as ``/tmp``);
- a slice file, limits file or registry entry is a regular file (a kernel
  registry is a folder), not writable by other users, and owned by this user
  or root, or lies in a root-owned folder nobody else may write (the hub's,
  where the hub hands each user their own files). A limits file must be
  owned by this user or root wherever it lies.
- the entries of a kernel registry may also belong to the registry folder's
  owner: in the hub's folder that is the user the hub gave the slice to.

A path is looked at (``stat``) before it is opened, so a FIFO never blocks
an open, and what was opened is checked again (``fstat``), so a file swapped
in between is caught. A symbolic link whose target is missing is refused with
a message naming the target.
"""

import getpass
import logging
import os
import re
import stat
from pathlib import Path

from .layout import HAMI_HUB_SLICE_ROOT, HAMI_SLICE_ROOT_SUBDIR, HAMI_SLICE_ROOT_TMP_PREFIX, HAMI_SLICE_SUFFIX

SUFFIX = HAMI_SLICE_SUFFIX
HUB_ROOT = Path(HAMI_HUB_SLICE_ROOT)
ROOT_VARIABLE = "HAMI_SLICE_ROOT"

log = logging.getLogger("hami_jupyter")

# Slice names become file names: keep them plain and bounded (the header's
# name field holds 63 bytes). config.c's valid_slice_name is the same rule.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,62}", re.ASCII)

NAME_RULE = ("1-63 letters, digits and . _ @ + - (starting with a letter or digit, not ending "
             "in .slice); a path's file name, less .slice, follows the same rule")


class SliceNameError(ValueError):
    """A slice name that cannot be a file name under the slice root."""


class UntrustedPath(PermissionError):
    """A slice folder or file that another user made or can change: refused.

    *detail* says what is wrong (path, owner or mode found), *fix* what to do;
    ``str()`` is both.
    """

    def __init__(self, path, detail, fix):
        self.path, self.detail, self.fix = os.fspath(path), detail, fix
        super().__init__(f"{detail}; {fix}")

    def __reduce__(self):
        return type(self), (self.path, self.detail, self.fix)


def default_root(env=None):
    """The slice root for this environment (see the module docstring)."""
    env = os.environ if env is None else env
    if not env.get(ROOT_VARIABLE) and HUB_ROOT.is_dir():
        return HUB_ROOT
    return own_root(env)


def own_root(env=None):
    """Where a Jupyter server the hub did not start makes its kernels' slices:
    ``$HAMI_SLICE_ROOT``, else the user's own folder (3 and 4 of the module's
    order), never the hub's ``/run/hami-jupyter``. That folder's slices are
    the hub's: only servers it started (marked ``HAMI_HUB_SLICE``) run
    kernels there. A root JupyterLab started on the host by hand once put its
    kernels there (issue 39), where the hub's tools, the guard and the broker
    took them for a hub user's."""
    env = os.environ if env is None else env
    root = env.get(ROOT_VARIABLE)
    if root:
        return Path(root)
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / HAMI_SLICE_ROOT_SUBDIR
    return Path(f"{HAMI_SLICE_ROOT_TMP_PREFIX}{os.getuid()}")


def valid_name(name):
    """True when *name* is a slice name (config.c's ``valid_slice_name``)."""
    return isinstance(name, str) and bool(_NAME_RE.fullmatch(name)) and not name.endswith(SUFFIX)


def check_name(name):
    """Return *name* if it is a valid slice name; SliceNameError otherwise."""
    if not valid_name(name):
        raise SliceNameError(
            f"invalid slice name {name!r}: use 1-63 letters, digits and . _ @ + - "
            "(starting with a letter or digit), or give a path containing '/'"
        )
    return name


def user_slice_name(env=None):
    """The default slice name: the JupyterHub user, else the Unix user.

    Characters a file name cannot hold are replaced, so every hub user name
    maps to a usable slice name.
    """
    env = os.environ if env is None else env
    user = env.get("JUPYTERHUB_USER") or getpass.getuser()
    name = re.sub(r"[^A-Za-z0-9._@+-]", "-", user, flags=re.ASCII).lstrip("._@+-")[:63] or "user"
    return check_name(name)


def _base_name(path):
    """config.c's slice_name_from_path: the text after the last '/', less ".slice"."""
    base = os.fspath(path).rsplit("/", 1)[-1]
    return base[: -len(SUFFIX)] if base.endswith(SUFFIX) and len(base) > len(SUFFIX) else base


def slice_path(slice_ref, root=None, env=None):
    """Path of the slice named or located by *slice_ref*.

    A path's file name, less ``.slice``, must be a slice name as well (the
    preload library refuses it otherwise): SliceNameError.
    """
    if not isinstance(slice_ref, str):
        slice_ref = os.fspath(slice_ref)
    if "/" in slice_ref:
        if not valid_name(_base_name(slice_ref)):
            raise SliceNameError(
                f"invalid slice path {slice_ref!r}: its file name, less .slice, must be a slice "
                "name: 1-63 letters, digits and . _ @ + - (starting with a letter or digit)")
        return Path(slice_ref)
    root = Path(root) if root else default_root(env)
    return root / f"{check_name(slice_ref)}{SUFFIX}"


def slice_name(path):
    """The name a slice file's path gives it (``/x/alice.slice`` -> ``alice``)."""
    base = Path(path).name
    return base[: -len(SUFFIX)] if base.endswith(SUFFIX) else base


# ---- who owns what ----------------------------------------------------------------

_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def file_kind(mode):
    """"a FIFO (named pipe)", "a directory", ... for an ``st_mode`` (trust.c's hami_file_kind)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _trusted_owner(uid):
    return uid == 0 or uid == os.geteuid()


def _you():
    return f"you (uid {os.geteuid()})"


_ELSEWHERE = f"or set {ROOT_VARIABLE} to a folder you own"


def folder_of(path):
    """The folder holding *path*, as trust.c takes it: the text before the last '/'."""
    p = os.fspath(path)
    slash = p.rfind("/")
    return "." if slash < 0 else "/" if slash == 0 else p[:slash]


def check_folder(folder, st=None):
    """Check a slice folder (or any folder slice files lie in); returns its ``stat``.

    FileNotFoundError when it does not exist (the caller makes it, or has
    nothing to read); UntrustedPath when another user made it or everyone may
    write it (and it is not sticky); other OSErrors as they come.
    """
    folder = os.fspath(folder)
    if st is None:
        st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(folder, f"slice folder {folder} is {file_kind(st.st_mode)}, not a "
                            "directory", f"remove it, {_ELSEWHERE}")
    if not _trusted_owner(st.st_uid):
        raise UntrustedPath(
            folder, f"slice folder {folder} is owned by uid {st.st_uid}, not by {_you()} or root: "
            "another user may have made it to plant slice files",
            f"remove it (as root, or as its owner) and start again, {_ELSEWHERE}")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPath(
            folder, f"slice folder {folder} is writable by every user (mode "
            f"{stat.S_IMODE(st.st_mode):03o}): anyone could swap slice files there",
            f"run chmod o-w {folder}, {_ELSEWHERE}")
    return st


def check_file(path, st, folder, *, what="slice file", owner_only=False, directory=False,
               also_owner=None):
    """Check a slice file, limits file or registry entry at *path* (``stat`` *st*)
    lying in a folder whose ``stat`` is *folder*. Raises UntrustedPath.

    *owner_only*: the file must belong to this user or root wherever it lies
    (limits files); otherwise a file in a root-owned folder nobody else may
    write is trusted whoever owns it (the hub hands users their own files).
    *directory*: the thing must be a folder (a kernel registry), not a file.
    *also_owner*: one more uid trusted to own it (a registry's entries: the
    registry folder's owner).
    """
    path = os.fspath(path)
    want = stat.S_ISDIR if directory else stat.S_ISREG
    if not want(st.st_mode):
        raise UntrustedPath(path, f"{what} {path} is {file_kind(st.st_mode)}, not "
                            f"{'a directory' if directory else 'a regular file'}: refused",
                            "remove it, or point HAMI_SLICE at a slice file" if what == "slice file"
                            else "remove it")
    hub_folder = folder.st_uid == 0 and not folder.st_mode & stat.S_IWOTH
    owner_ok = _trusted_owner(st.st_uid) or (also_owner is not None and st.st_uid == also_owner)
    if not owner_ok and (owner_only or not hub_folder):
        raise UntrustedPath(
            path, f"{what} {path} is owned by uid {st.st_uid}, not by {_you()} or root: another "
            "user may have planted it", f"remove it, {_ELSEWHERE}")
    if st.st_mode & stat.S_IWOTH:
        raise UntrustedPath(path, f"{what} {path} is writable by every user (mode "
                            f"{stat.S_IMODE(st.st_mode):03o}): refused", f"run chmod o-w {path}")
    return st


def refuse_dangling_link(path, what="slice file"):
    """After ``stat`` said ENOENT: a symbolic link whose target is missing is
    refused (UntrustedPath naming the target); a plain absent path is fine."""
    try:
        target = os.readlink(path)
    except OSError:
        return  # not a link (or gone): simply absent
    raise UntrustedPath(path, f"{what} {os.fspath(path)} is a symbolic link to {target}, which "
                        "does not exist: refused", "remove the link or make its target")


def stat_trusted(path, what="slice file", *, owner_only=False, folder=None, also_owner=None,
                 follow=True):
    """``(stat of path, stat of its folder)`` once both passed the rule.

    FileNotFoundError when the folder or the file does not exist (a dangling
    link is UntrustedPath, not absent); other OSErrors (a path too long, no
    search permission) as they come: callers that must fail closed do so.
    *folder*: the folder's stat when the caller checked it already.
    *follow=False* looks at a symbolic link itself (and refuses it) instead
    of its target. *owner_only*, *also_owner*: see :func:`check_file`.
    """
    path = os.fspath(path)
    folder = check_folder(folder_of(path)) if folder is None else folder
    try:
        st = os.stat(path, follow_symlinks=follow)
    except FileNotFoundError:
        refuse_dangling_link(path, what)
        raise
    check_file(path, st, folder, what=what, owner_only=owner_only, also_owner=also_owner)
    return st, folder


def open_trusted(path, flags=os.O_RDONLY, what="slice file", *, owner_only=False, folder=None,
                 also_owner=None, follow=True):
    """Open *path* after :func:`stat_trusted` (same keywords); returns
    ``(fd, fstat, folder stat)``.

    Never blocks on a FIFO (the path is looked at first, and opened
    ``O_NONBLOCK``); what was opened is checked again, so a file swapped in
    between the look and the open is refused too.
    """
    _, folder = stat_trusted(path, what, owner_only=owner_only, folder=folder,
                             also_owner=also_owner, follow=follow)
    flags |= os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = check_file(path, os.fstat(fd), folder, what=what, owner_only=owner_only,
                        also_owner=also_owner)
    except BaseException:
        os.close(fd)
        raise
    return fd, st, folder


def replace_file(path, data, mode=0o644, owner=None):
    """Write *data* (bytes) to *path* whole: a temporary file beside it (never a
    link that was planted there) with *mode* whatever the umask, and *owner*
    (``(uid, gid)``) when given, then renamed over *path*. Readers see the old
    file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink()  # left by a process of our PID that died mid-write
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _make_folders(folder):
    """Make *folder* and its missing parents, each with mode 0700 (native/src/slice.c's
    make_parent_dir)."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(folder.rstrip("/"))
    if parent and parent != folder:
        _make_folders(parent)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass


def ensure_folder(folder):
    """Make *folder* private to this user (0700, missing parents too) when it is
    missing, as the preload library does, then check it (:func:`check_folder`):
    nothing is ever written into a folder another user made. Returns its stat."""
    folder = os.fspath(folder)
    _make_folders(folder)
    return check_folder(folder)


def skip_message(path, error):
    """One line for a path a lister skipped: ``skipped <path>: <why and the fix>``."""
    if isinstance(error, UntrustedPath) and error.path == os.fspath(path):
        return f"skipped {error}"
    return f"skipped {os.fspath(path)}: {error}"


def not_yours(path):
    """True for a slice file another user owns that this user may not read: in a
    shared root (the hub's, 0640 per user) that is theirs, not a fault, and the
    listers skip it (``status``, ``slice list``, ``doctor``)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid != os.geteuid() and not os.access(path, os.R_OK)


def others_skipped(paths):
    """One line for the other users' slices a lister skipped (*paths*), or None."""
    if not paths:
        return None
    names = ", ".join(slice_name(p) for p in paths)
    return (f"skipped {len(paths)} slice(s) of other users, which you cannot read: not yours "
            f"({names})")


def list_slice_paths(root=None, env=None, skipped=None):
    """Every trusted ``*.slice`` file directly under the root, sorted by name.

    What the trust rule refuses (the root folder itself, a slice file another
    user owns or everyone may write, a FIFO, a name that is no slice name) is
    skipped, and the caller goes on with the rest: ``(path, error)`` is
    appended to *skipped* when given (the caller shows it), else a warning
    is logged (``hami_jupyter`` logger).
    """
    root = Path(root) if root else default_root(env)

    def skip(path, error):
        if skipped is not None:
            skipped.append((Path(path), error))
        else:
            log.warning("hami-jupyter: %s", skip_message(path, error))

    try:
        folder = check_folder(root)
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except UntrustedPath as e:  # nothing under it is used
        skip(root, e)
        return []
    except OSError as e:
        skip(root, f"cannot list the folder: {e.strerror or e}")
        return []
    out = []
    for name in sorted(names):
        if not name.endswith(SUFFIX) or name.startswith("."):
            continue  # not a slice (a hidden name: a creator's temporary file)
        path = root / name
        try:
            if not valid_name(_base_name(name)):
                raise SliceNameError(f"{name!r} is not a slice name ({NAME_RULE})")
            stat_trusted(path, folder=folder)
        except FileNotFoundError:
            continue  # removed while we looked
        except (OSError, SliceNameError) as e:
            skip(path, e)
            continue
        out.append(path)
    return out


def root_problem(root, missing="(the hub makes it; or give --root)"):
    """Why a node daemon cannot work on the slice root *root*, or None: it
    must exist and pass the trust rule (:func:`check_folder`). *missing* ends
    the line for a root that does not exist."""
    try:
        check_folder(root)
    except FileNotFoundError:
        return f"the slice root {root} does not exist {missing}"
    except UntrustedPath as e:
        return f"the slice root cannot be trusted: {e}"
    except OSError as e:
        return f"the slice root {root}: {e.strerror or e}"
    return None
