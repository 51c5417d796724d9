"""The hub makes each user's slice before the user's server starts.

Under the slice root (``/run/hami-jupyter``, owned by the hub, 0755), a user's
slice is:

- ``<user>.limits``: the limits, owned by the hub (group: the admin group
  when one is configured), mode 0644: only root writes it, the hub at a
  server start and the admin service (:mod:`hami_jupyter.admin.service`)
  for administrators, so every write is in the audit log. The user's
  processes can read it but not change it.
- ``<user>.slice``: usage, owned by the user, mode 0600 (0640 with the admin
  group, so that administrators can see it): written by the user's kernels. GPUs with limits of their own are entered up front, so that
  the limits file can name them before any kernel has met them.
- ``<user>.slice.kernels/``: the kernel registry, owned by the user.
- ``<user>.limits.policy``: the policy's size and limits, as of the last
  server start (``hami-jupyter slice reset`` goes back to them).
- ``<user>.limits.admin``: present while an administrator's change is in
  force (written by root when the change is applied, see
  :mod:`hami_jupyter.admin.marks`).
- ``audit.log``: every write of a limits file, the hub's included: root's,
  mode 0640 (group: the admin group, which may read it) or 0600. Only root
  writes it; administrators' changes go through ``hami-jupyter
  admin-service`` (see :mod:`hami_jupyter.audit`).

Preparing an existing slice rewrites its limits from the policy (a user who
picked another size in the spawn form gets it) and leaves its usage alone,
unless an administrator set its limits: those are kept (and the kept limits
and the policy's are logged) until an administrator resets them. Each write,
and each keep, is one record of the audit log, by ``jupyterhub (policy)``
with the policy's size name. See docs/slice-file.md, "Permissions".
"""

import grp
import logging
import os
import pwd
from pathlib import Path

from .. import audit
from ..admin import marks
from ..gpus import read_gpus
from ..slice.change import update_limits
from ..slice.create import create_limits_file, create_slice, fill_limit_set
from ..slice.paths import slice_path
from ..slice.registry import registry_dir
from .sizes import PolicyError, SliceSize


def owner_of(user_name):
    """``(uid, gid)`` of the Unix user the server runs as: the hub user's own
    when no such Unix user exists (SimpleLocalProcessSpawner, containers)."""
    try:
        pw = pwd.getpwnam(user_name)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return os.getuid(), os.getgid()


def _device_limits(size, gpus):
    """Slice device index -> Limits for GPUs with limits of their own, and
    the ``(uuid, memory_total)`` list to enter them up front, in that order.
    *gpus*: the host's (:class:`~hami_jupyter.gpus.HostGpu`)."""
    if not size.per_gpu:
        return {}, []
    by_key = {}
    for g in gpus:
        by_key[g.index] = by_key[g.uuid] = g
    entered, limits = [], {}
    for key in size.per_gpu:
        g = by_key.get(key)
        if g is None:
            raise PolicyError(f"slice size {size.name!r}: per_gpu names GPU {key!r}, which this "
                              f"host does not have (GPUs: {', '.join(str(x.index) for x in gpus) or 'none'})")
        limits[len(entered)] = size.limits_for(g.index, g.uuid)
        entered.append((g.uuid, g.memory_total))
    return limits, entered


def size_gpus(size, gpus):
    """The UUIDs of the host GPUs *size* may use (its ``gpus``), for the policy
    record: what the hub's admission counts the slice against at later
    starts. None for every GPU; an index this host does not have is left out."""
    if size.gpus is None:
        return None
    by_key = {}
    for g in gpus:
        by_key[g.index] = by_key[g.uuid] = g.uuid
    return [by_key[k] if k in by_key else k for k in size.gpus if k in by_key or isinstance(k, str)]


_log = logging.getLogger("hami_jupyter.hub")


def prepare_user_slice(name, size: SliceSize, uid, gid, root, admin_group=None, gpus=None, log=None):
    """Create or update the slice *name* for a user (see the module docstring).
    Returns the slice file's path. Needs the right to chown (the hub runs as
    root) unless *uid*/*gid* are the hub's own. *log* (a ``logging.Logger``,
    e.g. the spawner's) hears that an administrator's limits were kept."""
    log = log or _log
    root = Path(root)
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = slice_path(name, root=root)
    limits = size.limits
    host = read_gpus()[0] if gpus is None else gpus
    device_limits, entered = _device_limits(size, host)
    admin_gid = grp.getgrnam(admin_group).gr_gid if admin_group else -1
    policy = marks.state_of(limits, {uuid: device_limits[i] for i, (uuid, _) in enumerate(entered)})
    audit_log = _prepare_audit_log(root, admin_gid if admin_group else -1)

    # The limits file first: the library looks for it when it maps the slice file.
    # Under the audit log's lock: no administrator's change can slip in between
    # the look at the admin marker and the write.
    with audit.AuditLog(audit_log) as records:
        old = marks.limits_state(path) if marks.hub_managed(path) and path.exists() else None
        lpath, created = create_limits_file(path, limits, mode=0o644,
                                            device_limits=device_limits)
        os.chown(lpath, -1, admin_gid)
        marks.write_json(marks.policy_path(path), {"size": size.name, "limits": policy,
                                                   "gpus": size_gpus(size, host),
                                                   "when": audit.utc_now()})
        mark = None if created else marks.admin_mark(path)
        if created:
            marks.clear_admin(path)  # a marker left from a slice that was removed: stale
        if mark is not None and path.exists():
            kept = marks.limits_state(path)
            log.info("hami-jupyter: slice %s keeps the limits an administrator set (%s, at %s): "
                     "%s; the policy's size %s would give %s; `hami-jupyter slice reset %s` "
                     "returns to the policy", name, mark.get("who"), mark.get("when"),
                     marks.describe_state(kept), size.name, marks.describe_state(policy), name)
            records.append(audit.make_record(name, path, None, None, kept, kept, audit.HUB_WHO,
                                             action="policy-kept", size=size.name, policy=policy,
                                             admin=mark.get("who")))
        else:
            if not created:
                update_limits(path, lambda s, snap: fill_limit_set(
                    s, limits, _reindexed(snap, device_limits, entered)))
            records.append(audit.make_record(name, path, None, None, old, policy, audit.HUB_WHO,
                                             action="policy", size=size.name))

    # Usage: the user's to write; the admin group's to read (the panel shows it).
    group = admin_gid if admin_group else gid
    create_slice(path, name, limits, mode=0o640 if admin_group else 0o600, devices=entered)
    _chown_if_needed(path, uid, group)
    reg = registry_dir(path)
    reg.mkdir(mode=0o750 if admin_group else 0o700, exist_ok=True)
    _chown_if_needed(reg, uid, group)
    return path


def _prepare_audit_log(root, admin_gid):
    """The audit log lives in the hub's folder: the hub's (root's) to write,
    the admin group's to read. An older log the admin group could write is
    put right here. Returns its path."""
    log = audit.default_path(root)
    mode = 0o640 if admin_gid >= 0 else 0o600
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchown(fd, os.geteuid(), admin_gid)
        os.fchmod(fd, mode)  # whatever the umask says
    finally:
        os.close(fd)
    head = audit.head_path(log)
    if head.exists():
        os.chown(head, os.geteuid(), admin_gid)
        os.chmod(head, 0o640 if admin_gid >= 0 else 0o600)
    return log


def _reindexed(snapshot, device_limits, entered):
    """Per-GPU limits of an existing slice (*snapshot*), at the indices its file
    gave the GPUs. A GPU the file does not list yet follows the fallback until
    the slice is made anew (a warning is the caller's business: limits still hold)."""
    if not device_limits:
        return {}
    index_of = {d.uuid: d.index for d in snapshot.devices}
    return {index_of[uuid]: device_limits[i] for i, (uuid, _) in enumerate(entered) if uuid in index_of}


def _chown_if_needed(path, uid, gid):
    st = os.stat(path)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid)
