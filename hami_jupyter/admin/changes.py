"""Limit changes as an administrator asks for them: read, checked, applied, logged.

The admin panel and ``hami-jupyter slice`` both go through this module, so
they show the same slices and accept and refuse the same changes in the same
words.

A change names a slice, one *entry* of its limits, and new values for any of
memory, guarantee, SM share and mode (None keeps a field as it is):

* the entry is a GPU the slice has used (slice device index or UUID), or
  None for the slice's *default* entry: the limits of every GPU without
  limits of its own, including GPUs the slice has not used yet;
* memory is a size (``4g``, ``4096m``, bytes) or ``none`` for no cap;
* guarantee is a size, or ``0`` / ``default`` for none (the cap is then the
  guarantee, as everywhere without oversubscription); never above the cap;
* SM share is a whole percent 1..100, or 0, 100 or ``none`` for no share;
* mode is ``hard`` or ``elastic``.

The checks, in the order an admin meets them:

1. Values are parsed by :mod:`hami_jupyter.slice.limits`; a negative or malformed
   value is refused, never read as "no limit".
2. Promises must fit their GPU. A GPU's *promised* memory is the sum of
   what the slices in the same folder are promised on it: a hard slice its
   guarantee in force (its memory cap, unless a smaller guarantee is set),
   an elastic slice its guarantee only where one is set. For a slice that
   has used the GPU the entry in force is the GPU's own entry, else the
   slice's default; for a slice that has not used it, its default: any slice
   may start on any GPU of the host, so its default counts against every GPU
   it has not used. Slices without a memory cap or a guarantee promise
   nothing and are not counted. A change that would raise a GPU's promised
   memory above the GPU's memory is refused, unless overcommit is allowed
   (then it is a warning). A change that lowers or keeps it is never
   refused, even on a GPU that is already overcommitted, so an admin can
   always back out. Caps above the guarantees may add up to more than the
   GPU (that memory is lent; a warning says so): how far is the hub's
   ``SlicePolicy.memory_oversubscription``, checked when a server starts.
   Without guarantees the promises are the hard caps, as before guarantees.
2b. A guarantee is never above the cap it belongs to: a change that would
   leave one there (a guarantee raised past the cap, or a cap lowered under
   the guarantee) is refused and says which to change.
3. A cap below what the slice uses now is applied, with a warning: its
   processes keep what they hold, and new allocations fail until usage falls
   below the cap.

The GPUs are those NVML reports (:mod:`hami_jupyter.gpus`) plus any GPU a
slice file records; sizes come from NVML where it answers, else from the
slice file.

Applying (:func:`apply_here`) happens with the audit log's lock held (see
:mod:`.audit`): the checks are repeated there against the files as they are
then, the limits are written through :mod:`hami_jupyter.slice.change` (every
running process sees them at its next allocation; no restart), and one
record with the limits before and after is appended. This module applies in
this process; :mod:`.actions` decides whether a change is applied here or by
the root admin service (:mod:`.service`).
"""

from dataclasses import dataclass, field
from pathlib import Path

from .. import audit
from ..advice import advice
from ..gpus import HostGpu
from ..slice import change as slice_change
from ..slice.file import SliceFileError, read_snapshot
from ..slice.limits import (
    LimitError,
    Limits,
    parse_memory_guarantee,
    parse_memory_limit,
    parse_mode,
    parse_ordinal,
    parse_sm_share,
)
from ..slice.paths import list_slice_paths, skip_message, slice_name
from ..slice.size import format_size, parse_size
from . import marks

DEFAULT_ENTRY = "default (every GPU without limits of its own)"
READ_ONLY = "read-only: you cannot change limits"
# What set and reset mean for a slice no hub runs (a single machine): said by both.
OWN_SLICE_LIMITS = ("Its limits are what `slice set` last applied while its kernels run; when "
                    "none runs, the next kernel start gives it the limits its kernels are "
                    "configured with (HAMI_MEMORY_LIMIT, the kernelspec)")


class ChangeError(Exception):
    """A change that was not applied; *change* holds what was checked, when it got that far."""

    def __init__(self, message, change=None):
        super().__init__(message)
        self.change = change


class ReadOnlyError(ChangeError):
    """This user may look at the slice but not change its limits."""


@dataclass
class Change:
    """A checked change. *old*/*new* are None when the entry could not be found."""

    path: Path
    slice: str
    device: int | None = None  # slice device index; None: the default entry
    uuid: str | None = None
    old: Limits | None = None
    new: Limits | None = None
    fields: tuple = ()  # the fields asked for: memory_limit, memory_guarantee, sm_share, mode
    errors: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    applied: bool = False

    @property
    def ok(self):
        return not self.errors

    @property
    def entry(self):
        return DEFAULT_ENTRY if self.device is None else f"GPU {self.device} ({self.uuid})"

    def summary(self):
        head = f"slice {self.slice!r}, {self.entry}"
        if self.old is None or self.new is None:
            return head
        return f"{head}: {self.old.describe()} -> {self.new.describe()}"

    def as_dict(self):
        """Plain data (JSON), as the admin service answers with it."""
        return {"path": str(self.path), "slice": self.slice, "device": self.device,
                "uuid": self.uuid, "old": self.old.as_dict() if self.old else None,
                "new": self.new.as_dict() if self.new else None, "fields": list(self.fields),
                "errors": self.errors, "warnings": self.warnings, "applied": self.applied}

    @classmethod
    def from_dict(cls, data):
        """The inverse of :meth:`as_dict`; None for no data."""
        if not data:
            return None
        c = cls(Path(data["path"]), data["slice"], data.get("device"), data.get("uuid"))
        c.old = Limits.from_dict(data["old"]) if data.get("old") else None
        c.new = Limits.from_dict(data["new"]) if data.get("new") else None
        c.fields = tuple(data.get("fields") or ())
        c.errors, c.warnings = list(data.get("errors") or []), list(data.get("warnings") or [])
        c.applied = bool(data.get("applied"))
        return c


# ---- reading the host ------------------------------------------------------------


def _explain(path, error):
    return advice(error, path)


def host_gpus(snapshots, gpus):
    """Every GPU known: NVML's (*gpus*, :class:`~hami_jupyter.gpus.HostGpu`), then
    those the slice files record, with the size the slice file recorded."""
    known = {g.uuid: g for g in gpus}
    for snap in snapshots:
        for d in snap.devices:
            known.setdefault(d.uuid, HostGpu(None, d.uuid, "", d.memory_total))
    return list(known.values())


def in_force(snap, uuid):
    """The limits slice *snap* is held to on GPU *uuid* (its default if it never used it)."""
    for d in snap.devices:
        if d.uuid == uuid:
            return d.limit
    return snap.fallback_limit


def promise(limits):
    """The bytes *limits* (a :class:`Limits`) promise on a GPU (rule 2): a hard
    slice's guarantee in force, an elastic slice's set guarantee; 0: none."""
    return limits.guarantee if limits.mode == "hard" else limits.memory_guarantee


def _promised(holders):
    """``[(slice, bytes)]`` of the holders whose limits promise memory (:func:`promise`)."""
    return [(name, promise(lim)) for name, lim in holders if promise(lim)]


def _capped(holders):
    """``[(slice, cap)]`` of the holders with a memory cap."""
    return [(name, lim.memory_limit) for name, lim in holders if lim.memory_limit]


def commitments(snaps, gpus):
    """Per known GPU, the memory its slices are promised (rule 2 of the module
    docstring) and their caps; *snaps* are ``(slice name, snapshot)``.

    Returns dicts: uuid, name, memory_total, promised (bytes), holders ({slice:
    bytes}), capped (the caps' sum, bytes), lent (True when a slice there has a
    cap above its guarantee: the caps are then more than the promises).
    """
    out = []
    for g in host_gpus([s for _, s in snaps], gpus):
        limits = [(name, in_force(s, g.uuid)) for name, s in snaps]
        holders = _promised(limits)
        out.append({"uuid": g.uuid, "name": g.name, "memory_total": g.memory_total,
                    "promised": sum(b for _, b in holders), "holders": dict(holders),
                    "capped": sum(b for _, b in _capped(limits)),
                    "lent": any(lim.memory_limit and lim.lends for _, lim in limits)})
    return out


# ---- checking a change ------------------------------------------------------------


def _is_zero(text):
    try:
        return parse_size(text) == 0
    except ValueError:
        return False


# What an admin writes for "no cap" / "no share": the one word this form adds
# to the grammar every other reader shares (hami_jupyter.slice.limits).
NONE = "none"


def parse_memory(value, source="memory"):
    """Bytes for *value* (0: no cap); LimitError for a negative, zero or malformed size.

    The grammar is :func:`hami_jupyter.slice.limits.parse_memory_limit`'s, as the
    preload library reads it: no spaces around the value, no sign."""
    if isinstance(value, str) and value.lower() == NONE:
        return 0
    if isinstance(value, str) and value.startswith("-"):
        raise LimitError(f"{source}: {value!r} is negative; give a size such as 4g, or none for "
                         "no cap")
    if isinstance(value, str) and _is_zero(value):
        raise LimitError(f"{source}: a cap of 0 would refuse every allocation; write none for no cap")
    return parse_memory_limit(value, source)


def parse_sm(value, source="SM share"):
    """Percent for *value* (0: no share); LimitError unless a whole percent 0..100 or none
    (:func:`hami_jupyter.slice.limits.parse_sm_share`'s grammar: ASCII digits only)."""
    if isinstance(value, str) and value.lower() == NONE:
        return 0
    if isinstance(value, str) and value.startswith("-"):
        raise LimitError(f"{source}: {value!r} is negative; give a whole percent 1..100, or none")
    return parse_sm_share(value, source) or 0


# What an admin writes for "no guarantee of its own": the cap is the guarantee.
DEFAULT_GUARANTEE = "default"


def parse_guarantee(value, source="guarantee"):
    """Bytes for a guarantee *value* (0: none set, the cap is the guarantee);
    LimitError for a negative or malformed size. ``0`` and ``default`` mean
    none; otherwise the grammar of :func:`parse_memory`."""
    if isinstance(value, str) and value.lower() == DEFAULT_GUARANTEE:
        return 0
    if isinstance(value, str) and value.startswith("-"):
        raise LimitError(f"{source}: {value!r} is negative; give a size such as 2g, or "
                         f"{DEFAULT_GUARANTEE} (or 0) for none: the cap is then the guarantee")
    try:
        return parse_memory_guarantee(value, source)
    except LimitError:
        raise LimitError(f"{source}: guarantee {value!r} is not a size; expected a size such as "
                         f"2g or 2048m, or {DEFAULT_GUARANTEE} (or 0) for none") from None


def check_values(device=None, memory=None, sm=None, mode=None, guarantee=None):
    """The problems of a change's values alone, one line each, before any slice
    is read: a malformed size, share, mode or GPU is reported together with
    every other, never hidden behind a slice that cannot be found."""
    problems = []
    if isinstance(device, str) and parse_ordinal(device) is None and not device.startswith(
            ("GPU-", "MIG-")):
        problems.append(f"--device: {device!r} is neither a GPU index (0-15) nor a GPU UUID "
                        "(GPU-...)")
    for option, raw, parse in (("--memory", memory, parse_memory), ("--sm", sm, parse_sm),
                               ("--mode", mode, parse_mode),
                               ("--guarantee", guarantee, parse_guarantee)):
        if raw is None:
            continue
        try:
            parse(raw, option)
        except LimitError as e:
            problems.append(str(e))
    return problems


def _new_limits(old, memory, sm, mode, errors, guarantee=None):
    values = {}
    for name, raw, parse in (("memory_limit", memory, parse_memory), ("sm_share", sm, parse_sm),
                             ("mode", mode, lambda v: parse_mode(v, "mode")),
                             ("memory_guarantee", guarantee, parse_guarantee)):
        if raw is None:
            continue
        try:
            values[name] = parse(raw)
        except LimitError as e:
            errors.append(str(e))
    return old.replace(**values)


def _find_device(snap, name, device):
    """The slice's Device for an index or UUID; LimitError naming the GPUs it has."""
    if isinstance(device, str) and parse_ordinal(device) is not None:
        device = parse_ordinal(device)  # "1", not "01" nor other scripts' digits
    for d in snap.devices:
        if device in (d.index, d.uuid):
            return d
    known = ", ".join(f"{d.index} ({d.uuid})" for d in snap.devices) or "none yet"
    raise LimitError(f"slice {name!r} has no GPU {device!r} (it has: {known}); a slice lists a GPU "
                     "once one of its processes used it; until then change its default entry")


def _neighbours(path):
    """Snapshots of the other slices in *path*'s folder, and warnings for those unreadable."""
    snaps, warnings, skipped = [], [], []
    here = Path(path).resolve()
    paths = list_slice_paths(Path(path).parent, skipped=skipped)
    warnings += [f"{skip_message(p, e)}, so its caps are not counted" for p, e in skipped]
    for p in paths:
        if p.resolve() == here:
            continue
        try:
            snaps.append((slice_name(p), read_snapshot(p)))
        except (SliceFileError, OSError) as e:
            warnings.append(f"slice {slice_name(p)!r} could not be read, so its caps are not "
                            f"counted: {_explain(p, e)}")
    return snaps, warnings


def _check_fit(change, snap, device, gpus, overcommit):
    """Rule 2 of the module docstring, for the GPUs this change touches."""
    others, unreadable = _neighbours(change.path)
    change.warnings.extend(unreadable)
    known = host_gpus([snap] + [s for _, s in others], gpus)
    if device is not None:
        touched = [g for g in known if g.uuid == device.uuid]
    else:
        own = {d.uuid for d in snap.devices if not d.limit_is_fallback}
        touched = [g for g in known if g.uuid not in own]
        promise_changes = _promised([("", change.old)]) != _promised([("", change.new)])
        if not known and promise_changes:
            change.warnings.append("no GPU is known (NVML is unavailable and no slice has used a "
                                   "GPU yet), so the memory total was not checked")
    for g in touched:
        rest = [(name, in_force(s, g.uuid)) for name, s in others]
        now = rest + [(change.slice, in_force(snap, g.uuid))]
        then = rest + [(change.slice, change.new)]
        before, after = _promised(now), _promised(then)
        total_before, total_after = sum(b for _, b in before), sum(b for _, b in after)
        if not g.memory_total:
            continue
        if total_after <= g.memory_total or total_after <= total_before:
            _note_lent(change, g, then, now)
            continue
        shares = ", ".join(f"{name} {format_size(b)}" for name, b in after)
        who = "slices" if any(lim.lends for _, lim in then) else "hard slices"
        text = (f"GPU {g.label}: {who} would be promised {format_size(total_after)} of its "
                f"{format_size(g.memory_total)} ({shares})")
        if overcommit:
            change.warnings.append(f"{text}; allowed because overcommit is on")
        else:
            change.errors.append(f"{text}; lower a cap or a guarantee, make a slice elastic, or "
                                 "allow overcommit")


def _note_lent(change, g, after, before):
    """A warning when the caps on GPU *g* come to more than it has while the
    promises fit: the memory above the guarantees is lent (once per GPU)."""
    if not any(lim.memory_limit and lim.lends for _, lim in after):
        return  # no guarantee below a cap: the promises are the caps, checked above
    capped_after = sum(b for _, b in _capped(after))
    capped_before = sum(b for _, b in _capped(before))
    if capped_after <= g.memory_total or capped_after <= capped_before:
        return
    text = (f"GPU {g.label}: the caps come to {format_size(capped_after)} of its "
            f"{format_size(g.memory_total)}; above the guarantees that memory is lent, and the "
            "memory broker takes it back by parking idle kernels (the hub's "
            "SlicePolicy.memory_oversubscription bounds it at server starts)")
    if text not in change.warnings:
        change.warnings.append(text)


def _check_usage(change, snap, device):
    """Rule 3: a cap below current usage is a warning."""
    cap = change.new.memory_limit
    devices = [device] if device is not None else [d for d in snap.devices if d.limit_is_fallback]
    for d in devices:
        if cap and d.memory_used > cap:
            change.warnings.append(
                f"GPU {d.index}: slice {change.slice!r} uses {format_size(d.memory_used)}, more "
                f"than the new cap {format_size(cap)}; its processes keep what they hold, but new "
                "allocations are refused until usage falls below the cap")


def _check_guarantee(change):
    """Rule 2b: the new guarantee (the one set, when a cap moves) not above the new cap."""
    new = change.new
    if not (new.memory_limit and new.memory_guarantee > new.memory_limit):
        return
    g, cap = format_size(new.memory_guarantee), format_size(new.memory_limit)
    if "memory_guarantee" in change.fields:
        change.errors.append(f"a guarantee of {g} is above the memory cap of {cap}: the slice "
                             f"could never use it; give at most {cap}, or raise the cap too")
    else:
        change.errors.append(f"the new cap of {cap} is below the slice's guarantee of {g}; lower "
                             f"the guarantee too (--guarantee), or choose a cap of at least {g}")


def propose(path, device=None, memory=None, sm=None, mode=None, *, overcommit=False, gpus=(),
            guarantee=None):
    """Check a change without applying it; returns a :class:`Change` whose
    *errors* say why it would be refused and *warnings* what to know."""
    path = Path(path)
    change = Change(path, slice_name(path))
    change.fields = tuple(n for n, v in (("memory_limit", memory), ("memory_guarantee", guarantee),
                                         ("sm_share", sm), ("mode", mode))
                          if v is not None)
    if not change.fields:
        change.errors.append("nothing to change: give a memory cap, a guarantee, an SM share or "
                             "a mode")
    try:
        snap = read_snapshot(path)
    except (SliceFileError, OSError) as e:
        change.errors.append(_explain(path, e))
        return change
    if not slice_change.limits_writable(path):
        change.errors.append(f"{READ_ONLY} of slice {change.slice!r}")
    found = None
    if device is not None:
        try:
            found = _find_device(snap, change.slice, device)
        except LimitError as e:
            change.errors.append(str(e))
            return change
        change.device, change.uuid = found.index, found.uuid
    change.old = found.limit if found else snap.fallback_limit
    change.new = _new_limits(change.old, memory, sm, mode, change.errors, guarantee)
    _check_guarantee(change)
    if found is not None and found.limit_is_fallback:
        change.warnings.append(f"GPU {found.index} gets limits of its own: later changes of the "
                               "slice's default no longer apply to it")
    _check_fit(change, snap, found, gpus, overcommit)
    _check_usage(change, snap, found)
    return change


# ---- applying it -------------------------------------------------------------------


def _write(change):
    """Publish the new limits, the edited fields alone, in one publication:
    processes of the slice apply them at their next allocation. *old* came
    from a snapshot taken with the administrators' lock held, so no admin's
    change can slip in between and be missing from the audit log.
    """
    slice_change.set_limits(change.path, change.device,
                            **{f: getattr(change.new, f) for f in change.fields})


def _mark(change, log_record):
    """Hub-managed slices: record that an administrator set these limits, so that
    the hub keeps them at the next server start (see :mod:`.marks`). Only a
    process that may write the hub's folder (root: the admin service) can."""
    if not marks.hub_managed(change.path):
        return
    try:
        marks.mark_admin(change.path, log_record["who"], log_record["uid"], log_record["when"])
    except OSError as e:
        change.warnings.append(f"the change is not marked as an administrator's ({e.strerror or e}): "
                               "the hub will put the policy's limits back at the next server start")


def apply_here(path, device=None, memory=None, sm=None, mode=None, *, overcommit=False, gpus=(),
               audit_path=None, who=None, uid=None, via=None, guarantee=None):
    """Check and apply a change (arguments as :func:`propose`) in this process,
    and log it.

    Returns the applied :class:`Change`. Raises :class:`ReadOnlyError` when
    this user may not change the slice, and :class:`ChangeError` when the
    change is refused or the audit log cannot be opened (nothing changed), or,
    should the disk fill between the two, when it was applied but could not
    be logged (the message says which). *audit_path* defaults to
    ``audit.log`` beside the slice file. *who* and *uid* are for the admin
    service: the caller it acts for; anyone else's name comes from the OS.
    """
    path = Path(path)
    if path.exists() and not slice_change.limits_writable(path):
        raise ReadOnlyError(f"{READ_ONLY} of slice {slice_name(path)!r} "
                            "(its limits are not writable for you)")
    request = dict(device=device, memory=memory, sm=sm, mode=mode, overcommit=overcommit, gpus=gpus,
                   guarantee=guarantee)
    first = propose(path, **request)
    if not first.ok:  # refused before the audit log is even opened
        raise ChangeError("; ".join(first.errors), first)
    change = None
    try:
        with audit.AuditLog(audit_path or audit.default_path(path.parent)) as log:
            # Checked again under the lock: another admin may have changed a slice since.
            change = propose(path, **request)
            if not change.ok:
                raise ChangeError("; ".join(change.errors), change)
            try:
                _write(change)
            except (SliceFileError, OSError, ValueError) as e:
                raise ChangeError(f"could not apply {change.summary()}: {e}", change) from None
            change.applied = True
            extra = {"via": via} if via else {}
            record = audit.make_record(change.slice, path, change.device, change.uuid,
                                       change.old.as_dict(), change.new.as_dict(), who, uid=uid,
                                       **extra)
            _mark(change, record)
            log.append(record)
    except audit.AuditLogError as e:
        if change is not None and change.applied:
            raise ChangeError(f"applied {change.summary()}, but it could not be logged: {e}",
                              change) from None
        raise ChangeError(f"{e}; nothing was changed", change) from None
    return change


def reset_here(path, *, audit_path=None, who=None, uid=None, via=None):
    """Drop an administrator's limits, in this process: the slice goes back to
    the policy's.

    The policy's limits are those the hub recorded at the last server start
    (:func:`.marks.policy_limits`); they are written at once, the marker is
    removed and a ``reset`` record is logged. Returns a line saying what was
    done. Raises :class:`ChangeError` when there is nothing to reset.
    """
    path = Path(path)
    name = slice_name(path)
    if not path.exists():  # where it looked and what to check, as `slice set` says
        raise ChangeError(_explain(path, FileNotFoundError(path)))
    if not slice_change.limits_writable(path):
        raise ReadOnlyError(f"{READ_ONLY} of slice {name!r} (its limits are not writable for you)")
    if not marks.hub_managed(path):
        raise ChangeError(f"slice {name!r} is not a hub's (no limits file beside it): there is no "
                          f"policy to go back to. {OWN_SLICE_LIMITS}; change them now with "
                          "`hami-jupyter slice set`")
    try:
        with audit.AuditLog(audit_path or audit.default_path(path.parent)) as log:
            mark = marks.admin_mark(path)
            if mark is None:
                raise ChangeError(f"slice {name!r} has no limits set by an administrator; "
                                  "nothing to reset")
            policy = marks.policy_limits(path)
            old = marks.limits_state(path)
            if policy is not None:
                try:
                    marks.restore(path, policy["limits"])
                except (SliceFileError, OSError, ValueError, KeyError) as e:
                    raise ChangeError(f"could not reset slice {name!r}: {e}") from None
            marks.clear_admin(path)
            new = marks.limits_state(path)
            extra = {"via": via} if via else {}
            if policy is not None:
                extra["size"] = policy.get("size")
            log.append(audit.make_record(name, path, None, None, old, new, who, uid=uid,
                                         action="reset", **extra))
    except audit.AuditLogError as e:
        raise ChangeError(f"{e}; nothing was changed") from None
    if policy is None:
        return (f"slice {name!r}: the administrator's mark is removed; the hub recorded no policy "
                "limits for it, so its limits stay until the next server start applies the policy")
    return (f"slice {name!r} is back to the policy's size {policy.get('size')!r}: "
            f"{marks.describe_state(new)}")
