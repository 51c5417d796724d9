"""Admission at the hub: a server starts only if its slice fits each GPU it may use.

Memory has two figures per slice and GPU: the guarantee (what the slice keeps
whatever others need) and the limit (its cap; above the guarantee the memory
is lent, and the node's memory broker takes it back by parking idle kernels).
So, per GPU of the host, over the slices of the servers that run (or are
starting) and the one about to start:

- the guarantees add up to no more than the GPU's memory: a guarantee the
  GPU could not give is no guarantee;
- the caps add up to no more than ``memory_oversubscription`` times the
  GPU's memory (a slice without a cap may take the whole GPU: it counts as
  the GPU's memory).

A slice's guarantee is its ``memory_guarantee``, else its cap (slice file
1.7: 0 means the cap), whatever its SM mode: the broker never parks a slice
that holds no more than that. A slice that may use only some GPUs (a size's
``gpus``) counts on those only; one that may use any counts on every GPU.

Which slices: those of users whose server the hub's database lists as
started or starting (``orm.Spawner.server``), read from their hub-made files
under the slice root: the limits in force there (an administrator's change
included), on the GPUs their size named at their start (the policy record,
:mod:`hami_jupyter.admin.marks`). The one about to start counts with the
size it is given, or with the limits an administrator set for it (kept at a
restart, see :mod:`.slice_files`). Servers without a slice (no size) are not
counted: they run without limits, which the hub cannot add up.

A start that would break either sum is refused with a message that names the
GPU, the sums, and the slices holding guarantees there with their sizes. The
check runs in the hub's ``pre_spawn_hook``, one spawn at a time (JupyterHub
runs them on one event loop, and the hook does not yield), so two starts
never both take the last room.

The GPUs and their memory: NVML's (in the hub's process, else as a process
with the servers' environment sees them: :meth:`.policy.SlicePolicy.host_gpus`),
else those the slice files record (:func:`hami_jupyter.admin.changes.host_gpus`).
With no GPU known at all nothing can be checked: the start goes ahead, with a
warning in the hub's log.

On Kubernetes none of this applies: pods land on nodes and GPUs that HAMi's
scheduler picks, by the resources of their profile (see :mod:`.kubernetes`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..admin import marks
from ..admin.changes import host_gpus, in_force
from ..slice.file import SliceFileError, read_snapshot
from ..slice.paths import SliceNameError, slice_path, user_slice_name
from ..slice.size import format_size
from .sizes import PolicyError

log = logging.getLogger("hami_jupyter.hub")


class AdmissionError(PolicyError):
    """A start the GPUs have no room for; the message says where and who holds what."""


@dataclass(frozen=True)
class Claim:
    """What one slice takes of one GPU: its guarantee and its cap (0: none)."""

    slice: str
    guarantee: int
    limit: int


def _claims_of(name, limits_by_uuid):
    return {uuid: Claim(name, lim.guarantee, lim.memory_limit) for uuid, lim in limits_by_uuid.items()}


def running_claims(path, gpus):
    """``{uuid: Claim}`` of the hub-made slice at *path* on each GPU it may use,
    by the limits in force in its files; {} when it cannot be read."""
    try:
        snap = read_snapshot(path)
    except (SliceFileError, OSError) as e:
        log.warning("hami-jupyter: admission: slice %s cannot be read, so it is not counted: %s",
                    path, e)
        return {}
    record = marks.policy_limits(path) or {}
    allowed = record.get("gpus")
    usable = [g for g in gpus if allowed is None or g.uuid in allowed]
    return _claims_of(snap.name, {g.uuid: in_force(snap, g.uuid) for g in usable})


def starting_claims(name, path, size, gpus):
    """``{uuid: Claim}`` of the slice about to start with *size*: an
    administrator's limits where the hub will keep them, else the size's."""
    if path.exists() and marks.hub_managed(path) and marks.admin_mark(path) is not None:
        try:
            snap = read_snapshot(path)
        except (SliceFileError, OSError):
            snap = None
        if snap is not None:
            usable = [g for g in gpus if _size_may_use(size, g)]
            return _claims_of(name, {g.uuid: in_force(snap, g.uuid) for g in usable})
    return _claims_of(name, {g.uuid: size.limits_for(g.index, g.uuid)
                             for g in gpus if _size_may_use(size, g)})


def _size_may_use(size, gpu):
    return size.gpus is None or gpu.index in size.gpus or gpu.uuid in size.gpus


def _shares(claims, field):
    return ", ".join(f"{c.slice} {format_size(getattr(c, field))}" for c in claims
                     if getattr(c, field))


def check_gpu(gpu, others, new, oversubscription):
    """The refusal for *new* (a Claim) among *others* (Claims) on *gpu*, or None."""
    total = gpu.memory_total
    if not total:
        return None
    everyone = [*others, new]
    where = f"GPU {gpu.index} ({gpu.label})" if gpu.index is not None else f"GPU {gpu.uuid}"
    holders = _shares([c for c in everyone if c.guarantee], "guarantee") or "none"
    guaranteed = sum(c.guarantee for c in everyone)
    if new.guarantee and guaranteed > total:
        return (f"{where} cannot guarantee slice {new.slice!r} {format_size(new.guarantee)}: "
                f"the guarantees there would come to {format_size(guaranteed)} of its "
                f"{format_size(total)} (guarantees: {holders})")
    capped = sum(c.limit or total for c in everyone)
    room = oversubscription * total
    if capped > room:
        cap = format_size(new.limit) if new.limit else "no cap (the whole GPU)"
        return (f"{where} cannot take slice {new.slice!r} with {cap}: the caps there would "
                f"come to {format_size(capped)}, more than {oversubscription:g} x its "
                f"{format_size(total)} (SlicePolicy.memory_oversubscription) (caps: "
                f"{_shares(everyone, 'limit') or 'none'}; guarantees: {holders})")
    return None


def hub_running_users(spawner):
    """Names of the users with a server started or starting, from the hub's
    database through *spawner*'s user; None when it cannot be read."""
    db = getattr(getattr(spawner, "user", None), "db", None)
    if db is None:
        return None
    try:
        from jupyterhub import orm
        rows = db.query(orm.Spawner).filter(orm.Spawner.server_id.isnot(None)).all()
        return {row.user.name for row in rows if row.user is not None}
    except Exception as e:  # not JupyterHub's database: count every slice instead
        log.warning("hami-jupyter: admission: the hub's servers cannot be read (%s): every "
                    "slice under the slice root counts", e)
        return None


def _paths_of(users, root):
    """Slice files of *users* (None: every hub-made slice under *root*)."""
    from ..slice.paths import list_slice_paths

    if users is None:
        return [p for p in list_slice_paths(root) if marks.hub_managed(p)]
    paths = []
    for user in sorted(users):
        try:
            p = slice_path(user_slice_name({"JUPYTERHUB_USER": user}), root=root)
        except SliceNameError:
            continue
        if p.exists() and marks.hub_managed(p):
            paths.append(p)
    return paths


def check(user, size, root, oversubscription, running_users, gpus):
    """Refuse (AdmissionError) *user*'s start with *size* when a GPU has no
    room for it (see the module docstring); *running_users* as
    :func:`hub_running_users` gives them; *gpus* the host's (NVML)."""
    name = user_slice_name({"JUPYTERHUB_USER": user})
    own = slice_path(name, root=root)
    paths = [p for p in _paths_of(running_users, root) if p.resolve() != own.resolve()]
    snaps = []
    for p in paths + ([own] if own.exists() else []):
        try:
            snaps.append(read_snapshot(p))
        except (SliceFileError, OSError):
            pass
    known = host_gpus(snaps, gpus)
    if not known:
        log.warning("hami-jupyter: admission: no GPU is known (NVML answers neither the hub nor "
                    "a process with the servers' environment, and no slice recorded one): %s's "
                    "start is not checked", user)
        return
    others = [running_claims(p, known) for p in paths]
    new = starting_claims(name, own, size, known)
    problems = []
    for g in known:
        if g.uuid not in new:
            continue
        refusal = check_gpu(g, [c[g.uuid] for c in others if g.uuid in c], new[g.uuid],
                            oversubscription)
        if refusal:
            problems.append(refusal)
    if problems:
        raise AdmissionError("; ".join(problems) + f". Pick a smaller size than {size.name!r}, "
                             "or start again when others' servers have stopped")
