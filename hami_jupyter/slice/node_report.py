"""A node daemon's report in the slice root: the guard's ``guard.json``, the broker's ``broker.json``.

Both are written by root (or the daemon's user) for every view to read:
replaced atomically (a reader never sees half of one), and read only when the
trust rule allows (root's, or the reader's own: never another user's, who
could fake what a tampering user must not). What differs is only the file's
name, its version, what makes it stale and what a user's view of it keeps:
this module is the rest, once.

Who reads what (issue 39: both reports, 0644, showed every user's PIDs,
kernel ids and bytes to every user):

- the full report, ``<root>/<name>``, is root's, mode 0640, its group the
  one that may read the audit log (the hub gives ``audit.log`` to the admin
  group): root and the administrators read it;
- each user who owns a slice file in the root gets a view of her own,
  ``<root>/views/<uid>.<name>``, hers and readable by her alone (0400), with
  her slices and her processes only (:func:`write` takes them from the
  report's own module); the folder is root's, so nobody replaces anyone's view;
- :func:`read` reads the full report when it may, else the reader's view.

A daemon that does not run as root writes the full report for its own user
only (0600) and no views: every slice under its root is that user's.
"""

import json
import os
import pwd
import stat
import time
from pathlib import Path

from .paths import UntrustedPath, open_trusted, replace_file

MAX_BYTES = 1 << 24
VIEWS = "views"  # <root>/views/<uid>.<report file name>
SLICE_SUFFIX = ".slice"


def view_path(path, uid):
    """Where user *uid*'s view of the report at *path* lies."""
    path = Path(path)
    return path.parent / VIEWS / f"{uid}.{path.name}"


def readers_group(root):
    """The group that may read the full reports: the audit log's, when it is
    root's (the hub gives it to the admin group); else root's group."""
    try:
        st = os.stat(Path(root) / "audit.log")
    except OSError:
        return 0
    return st.st_gid if st.st_uid == 0 else 0


def slice_owners(root):
    """``{uid: {slice names}}`` of the slice files in *root* (their owners, by ``stat``)."""
    owners = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return owners
    for entry in entries:
        if not entry.name.endswith(SLICE_SUFFIX) or entry.name.startswith("."):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            owners.setdefault(st.st_uid, set()).add(entry.name[: -len(SLICE_SUFFIX)])
    return owners


def _user(uid):
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def _encode(report, version):
    report = dict(report, version=version)
    report.setdefault("written_unix", time.time())
    return json.dumps(report, separators=(",", ":"), sort_keys=True).encode()


def write(path, report, version, view_of=None):
    """Replace *path* with *report* (a dict; ``version`` and ``written_unix``
    added), and, as root, each slice owner's view of it: ``view_of(report,
    names, uid)`` gives the view of user *uid*, who owns the slices *names*."""
    path = Path(path)
    report = dict(report)
    report.setdefault("written_unix", time.time())
    if os.geteuid() != 0:
        replace_file(path, _encode(report, version), mode=0o600)
        return
    replace_file(path, _encode(report, version), mode=0o640, owner=(0, readers_group(path.parent)))
    if view_of is None:
        return
    folder = path.parent / VIEWS
    folder.mkdir(mode=0o755, exist_ok=True)
    written = set()
    for uid, names in sorted(slice_owners(path.parent).items()):
        if uid == 0:
            continue  # root reads the full report
        user = _user(uid)
        view = view_of(report, names, uid)
        target = view_path(path, uid)
        replace_file(target, _encode(view, version), mode=0o400, owner=(uid, user.pw_gid if user else uid))
        written.add(target.name)
    suffix = f".{path.name}"
    for entry in os.scandir(folder):
        if entry.name.endswith(suffix) and not entry.name.startswith(".") and entry.name not in written:
            try:
                os.unlink(entry.path)  # a user who owns no slice here any more
            except OSError:
                pass


def _open(path, who):
    fd, _, _ = open_trusted(path, what=f"{who.split()[-1]} report")  # root's, or ours
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_BYTES)


def read(path, version, who, error):
    """The report at *path* as a dict (the reader's own view of it when the
    full one is not the reader's to read), or None when there is none. *error*
    (an exception class) when it cannot be used, its message naming *who*
    ("the guard") and what to do."""
    try:
        data = _open(path, who)
    except FileNotFoundError:
        return None
    except UntrustedPath as e:
        raise error(f"cannot read {who}'s report {path}: {e}") from None
    except PermissionError:
        mine = view_path(path, os.getuid())
        try:
            data = _open(mine, who)
        except FileNotFoundError:
            return None  # no slice of ours here: nothing of the report is ours
        except OSError as e:
            raise error(f"cannot read {who}'s report {mine}: {e.strerror or e}") from None
    except OSError as e:
        raise error(f"cannot read {who}'s report {path}: {e.strerror or e}") from None
    try:
        report = json.loads(data)
    except ValueError:
        raise error(f"{who}'s report {path} is not JSON") from None
    if not isinstance(report, dict) or report.get("version") != version:
        raise error(f"{who}'s report {path} is not version {version}: is {who.split()[-1]} older or "
                    "newer than this hami-jupyter?")
    return report
