"""Which limits an administrator set, and which the policy gives, beside the limits file.

The hub rewrites a user's limits from the policy at every server start; an
administrator's live change must survive that until an administrator resets
it. The limits file's layout is shared with the C library and has no room
for a marker, so the facts live in two small JSON files next to it, in the
hub's folder (root's, 0755), where neither users nor administrators can
create or change files:

- ``<user>.limits.admin``: written when an administrator's change is applied
  (by root: the admin service, or root itself): who (from the OS or
  SO_PEERCRED), when, and the limits as the change left them. While it is
  there, the hub keeps the limits file as it is.
- ``<user>.limits.policy``: written by the hub at each server start: the
  policy's size and the limits it gives. ``slice reset`` restores these.

A marker is believed only when root (or this process's user) owns it, nobody
else may write it, and it is a regular file (see :func:`read_trusted`); a
marker a user made elsewhere means nothing.

Limits are kept as ``{"default": {...}, "devices": {uuid: {...}}}``, each
entry a :class:`~hami_jupyter.slice.limits.Limits` as a dict
(``memory_limit``, ``sm_share``, ``mode``, ``max_decoders``; 0: none),
devices being the GPUs with limits of their own.
"""

import json
import os
import stat
from pathlib import Path

from ..slice.change import update_limits
from ..slice.create import fill_limit_set
from ..slice.file import read_snapshot
from ..slice.layout import limits_file_path
from ..slice.limits import Limits
from ..slice.paths import replace_file

ADMIN_SUFFIX = ".admin"
POLICY_SUFFIX = ".policy"


def admin_mark_path(slice_path):
    return Path(limits_file_path(slice_path) + ADMIN_SUFFIX)


def policy_path(slice_path):
    return Path(limits_file_path(slice_path) + POLICY_SUFFIX)


def state_of(default, devices=None):
    """The markers' form of limits: *default* and *devices* ({uuid: Limits})."""
    return {"default": default.as_dict(),
            "devices": {uuid: limits.as_dict() for uuid, limits in (devices or {}).items()}}


def limits_state(slice_path):
    """The slice's limits now, as stored in the marker files."""
    snap = read_snapshot(slice_path)
    return state_of(snap.fallback_limit,
                    {d.uuid: d.limit for d in snap.devices if not d.limit_is_fallback})


def describe_state(state):
    parts = [Limits.from_dict(state["default"]).describe()]
    parts += [f"GPU {uuid}: {Limits.from_dict(e).describe()}"
              for uuid, e in sorted(state.get("devices", {}).items())]
    return "; ".join(parts)


def restore(slice_path, state):
    """Write *state* into the slice's limits (running processes follow). A GPU
    the slice file does not list yet follows the default."""

    def change(limit_set, snapshot):
        index_of = {d.uuid: d.index for d in snapshot.devices}
        own = {index_of[u]: Limits.from_dict(e) for u, e in state.get("devices", {}).items()
               if u in index_of}
        fill_limit_set(limit_set, Limits.from_dict(state["default"]), own)

    update_limits(slice_path, change)


def write_json(path, data):
    """Write *data* to *path* atomically, 0644, owned by this process's user."""
    replace_file(path, (json.dumps(data, sort_keys=True) + "\n").encode(), 0o644)


def read_trusted(path):
    """The JSON object at *path*, or None when absent or not to be believed:
    not a regular file, owned by someone other than root or this process's
    user, or writable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid())
                or st.st_mode & 0o022):
            return None
        folder = os.stat(Path(path).parent)
        if folder.st_uid not in (0, os.geteuid()) or folder.st_mode & 0o022:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) and isinstance(data.get("limits"), dict) else None


def mark_admin(slice_path, who, uid, when):
    """Record that an administrator set the slice's limits (as they are now)."""
    write_json(admin_mark_path(slice_path), {"who": who, "uid": uid, "when": when,
                                             "limits": limits_state(slice_path)})


def admin_mark(slice_path):
    """The trusted admin marker of the slice, or None."""
    return read_trusted(admin_mark_path(slice_path))


def clear_admin(slice_path):
    try:
        os.unlink(admin_mark_path(slice_path))
        return True
    except FileNotFoundError:
        return False


def policy_limits(slice_path):
    """The trusted policy record of the slice (``{"size", "limits", ...}``), or None."""
    return read_trusted(policy_path(slice_path))


def hub_managed(slice_path):
    """True when the slice's limits live in a separate (hub-owned) limits file."""
    return os.path.exists(limits_file_path(slice_path))
