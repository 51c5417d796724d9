"""What administrators see and do, applied where it may be: here, or by the admin service.

The admin panel and ``hami-jupyter slice`` come through here. Reading shows
every slice of a host with whether this user may change it; a change or a
reset is applied in this process when it may write the slice's limits (root,
or the owner of a slice no hub manages), and otherwise sent to the root
admin service (:mod:`.service`) when its socket lies beside the slice and
this user may use it: the service then checks who asks, applies the change
with :mod:`.changes` and writes the audit log. Both ways return the same
results and raise the same errors.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import audit
from ..advice import advice
from ..slice import change as slice_change
from ..slice import guard_report, parking
from ..slice.file import SliceFileError, read_snapshot
from ..slice.paths import list_slice_paths, log, skip_message, slice_name
from ..slice.status import slice_status
from . import changes, service


def _service_socket(path, audit_path=None):
    """The admin service's socket when a change of the slice at *path* goes
    through it: not root, the default audit log, and a socket beside the slice
    that this user may use. None otherwise."""
    if os.geteuid() == 0:
        return None
    if audit_path is not None and Path(audit_path) != audit.default_path(path.parent):
        return None  # a log of the caller's own choosing: a slice no hub manages
    sock = service.socket_path(path.parent)
    return sock if service.usable(sock) else None


def guard_parked(root):
    """The processes the node agent holds parked under *root* (the guard's
    report's ``parked`` records, and the broker's ``held``), oldest first; []
    without a report or when it cannot be read."""
    from .guard_parked import ParkedError, held_records

    try:
        return held_records(root)
    except ParkedError:
        return []


def guard_act(root, pid, what, *, audit_path=None):
    """Resume or end (*what*: "resume" or "end") the process *pid* the guard
    parked under *root*; a line saying what was done, or ParkedError. Root
    does it here; anyone else through the admin service, which checks that
    they are an administrator and logs who they are."""
    from . import guard_parked as parked

    if os.geteuid() == 0:
        return parked.handle(Path(root), pid, what, audit_path=audit_path)
    sock = service.socket_path(root)
    if not service.usable(sock):
        raise parked.ParkedError(f"only root or the admin service may {what} a process the guard "
                                 f"parked, and no admin service listens on {sock} for you: run "
                                 f"`sudo hami-jupyter guard --{what} {pid}`")
    return service.remote_guard(sock, pid, what)


def writable(path):
    """Whether this user may change the slice's limits, here or through the service."""
    path = Path(path)
    return slice_change.limits_writable(path) or _service_socket(path) is not None


def apply(path, device=None, memory=None, sm=None, mode=None, *, overcommit=False, gpus=(),
          audit_path=None, guarantee=None):
    """Check, apply and log a change (see :func:`.changes.apply_here`); the
    admin service does it for a non-root administrator of a hub's slice."""
    path = Path(path)
    sock = _service_socket(path, audit_path)
    if sock is not None:
        request = dict(device=device, memory=memory, sm=sm, mode=mode, overcommit=overcommit)
        if guarantee is not None:  # an older service refuses no key it does not know: send none
            request["guarantee"] = guarantee
        return service.remote_apply(sock, path, request)
    return changes.apply_here(path, device, memory, sm, mode, overcommit=overcommit, gpus=gpus,
                              audit_path=audit_path, guarantee=guarantee)


def reset(path, *, audit_path=None):
    """Back to the policy's limits (see :func:`.changes.reset_here`), here or
    through the admin service as :func:`apply` decides."""
    path = Path(path)
    sock = _service_socket(path, audit_path)
    if sock is not None:
        return service.remote_reset(sock, path)
    return changes.reset_here(path, audit_path=audit_path)


def _may_park(path):
    """Whether this process may park a kernel of the slice itself: it can write
    the slice file (its owner, or root); else the admin service does it."""
    return os.access(path, os.W_OK)


def park(path, kernel_id):
    """Park a kernel of the slice at *path* (:func:`hami_jupyter.slice.parking.park_kernel`);
    a line saying what was done. ParkError when it could not."""
    path = Path(path)
    if not _may_park(path):
        sock = _service_socket(path)
        if sock is None:
            raise parking.ParkError(f"{changes.READ_ONLY}: you may not park kernels of slice "
                                    f"{path.name!r}")
        return service.remote_parking(sock, path, "park", kernel_id)
    result = parking.park_kernel(path, kernel_id)
    return (f"parked kernel {kernel_id}: {parking.format_size(result.bytes)} to host memory in "
            f"{result.seconds:.1f} s")


def resume(path, kernel_id, timeout=60.0):
    """Bring a parked kernel of the slice back (:func:`~hami_jupyter.slice.parking.resume_kernel`);
    a line saying what was done. ParkError (ResumeTimeout) when it did not come back."""
    path = Path(path)
    if not _may_park(path):
        sock = _service_socket(path)
        if sock is None:
            raise parking.ParkError(f"{changes.READ_ONLY}: you may not resume kernels of slice "
                                    f"{path.name!r}")
        return service.remote_parking(sock, path, "resume", kernel_id)
    restored, seconds = parking.resume_kernel(path, kernel_id, timeout)
    return (f"resumed kernel {kernel_id}: {parking.format_size(restored)} back on the GPU in "
            f"{seconds:.1f} s")


@dataclass
class SliceView:
    """One slice as the panel and ``slice list`` show it (*error* when unreadable)."""

    path: Path
    name: str
    writable: bool
    snapshot: object = None  # a SliceSnapshot
    status: dict | None = None  # slice_status(): usage, limits, kernels and their users
    error: str | None = None


def read_slice(path):
    path = Path(path)
    view = SliceView(path, slice_name(path), writable(path))
    try:
        view.snapshot = read_snapshot(path)
        view.status = slice_status(path)
    except (SliceFileError, OSError) as e:
        view.error = advice(e, path)
    return view


def read_slices(root, skipped=None):
    """Every slice under *root*, sorted by name. Slices the trust rule refuses
    (another user's file, a folder everyone may write: see
    :mod:`hami_jupyter.slice.paths`) are left out; *skipped*, when given,
    gets one line for each."""
    found = []
    paths = list_slice_paths(root, skipped=found)
    if skipped is not None:
        skipped.extend(skip_message(p, e) for p, e in found)
    else:
        for p, e in found:
            log.warning("hami-jupyter: %s", skip_message(p, e))
    return [read_slice(p) for p in paths]


def commitments(views, gpus):
    """:func:`.changes.commitments` of the slices in *views* that could be read."""
    return changes.commitments([(v.name, v.snapshot) for v in views if v.snapshot is not None], gpus)


def guard_note(root, now=None):
    """What to know when no guard is running in the slice root *root* (no
    report, a stale one, or one that cannot be read), as one line; None while
    a guard writes fresh reports there."""
    path = guard_report.report_path(root)
    cooperative = ("memory caps are enforced only cooperatively, by the preload library in each "
                   "process; `hami-jupyter guard` starts the guard (docs/guard.md)")
    try:
        report = guard_report.read_report(root, now=now)
    except guard_report.GuardReportError as e:
        return f"{e}: real memory is unknown (-)"
    if report is None:
        return f"the guard is not running (no {path}): real memory is unknown (-), and {cooperative}"
    if not report["stale"]:
        return None
    age = (time.time() if now is None else now) - (report.get("written_unix") or 0)
    alive = "still runs: stuck?" if guard_report.guard_pid_alive(report) else "is gone"
    return (f"the guard is not running: it last wrote {path} {age:.0f} s ago (its process "
            f"{report.get('guard_pid')} {alive}); real memory is unknown (-), and {cooperative}")
