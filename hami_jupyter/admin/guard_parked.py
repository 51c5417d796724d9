"""What an administrator does with a process the guard parked: resume it, or end it.

The guard parks a process over its slice's cap (``--action park``, the
default) and lists it in its report (``guard.json``, ``"parked"``) until it
is gone or back on the GPU. Only an administrator brings it back: after
raising the slice's cap (``hami-jupyter slice set``), ``hami-jupyter guard
--resume PID`` restores its GPU state and lets it run; if the slice is still
over, the guard parks it again. ``--end PID`` ends it instead. Both check that
the PID still names the process the guard parked (its start time), and both
go to the audit log, with who asked.

The agent holds a process off the GPU the same way for the memory broker
when the process's slot refused a park (it said the process was parked or
being parked while the driver had it running): such a process is listed
too, and brought back or ended the same way.

Used by the command line and by the admin service (on behalf of an
administrator it identified), so the checks live here once.
"""

from __future__ import annotations

import time

from .. import audit
from ..slice.broker_report import BrokerReportError
from ..slice.broker_report import read_report as read_broker_report
from ..slice.guard_report import GuardReportError, read_report
from ..slice.parking import ParkError, restore_process
from ..slice.size import format_size
from ..processes import end_process, start_ticks

RESUME, END = "resume", "end"


class ParkedError(RuntimeError):
    """The request cannot be carried out; the message says why and what to do."""


def held_records(root):
    """The processes the node agent holds parked off the GPU under *root*: the
    guard's report's ``parked`` and, from an agent running the broker alone,
    the broker report's ``held`` (kernels whose slots refused a park for room)."""
    try:
        report = read_report(root)
    except (GuardReportError, OSError) as e:
        raise ParkedError(f"cannot read the guard's report in {root}: {e}") from None
    found = list((report or {}).get("parked") or [])
    try:
        found += (read_broker_report(root) or {}).get("held") or []
    except (BrokerReportError, OSError):
        pass
    return [r for r in found if isinstance(r, dict) and isinstance(r.get("pid"), int)]


def parked_by_guard(root, pid):
    """The agent's park record of *pid* (:func:`held_records`); ParkedError when none."""
    held = held_records(root)
    for record in held:
        if record.get("pid") == pid:
            return record
    raise ParkedError(f"the guard has not parked process {pid} (its report in {root} lists "
                      f"{', '.join(str(r.get('pid')) for r in held) or 'none'}): "
                      "check the PID with hami-jupyter status")


def _audit(root, record, action, who, uid, audit_path=None, **extra):
    entry = audit.make_record(record.get("slice"), str(root / f"{record.get('slice')}.slice"), None,
                              record.get("uuid"), None, None, who=who, uid=uid,
                              action=f"guard-{action}", pid=record.get("pid"), user=record.get("user"),
                              command=record.get("command"), **extra)
    with audit.AuditLog(audit_path or audit.default_path(root)) as trail:
        trail.append(entry)


def handle(root, pid, what, *, who=None, uid=None, audit_path=None, restore=restore_process,
           end=end_process, proc="/proc"):
    """Resume or end (*what*) the process *pid* the guard parked; one line saying what was done."""
    record = parked_by_guard(root, pid)
    ticks = record.get("start_ticks")
    if ticks is not None and start_ticks(pid, proc) != ticks:
        raise ParkedError(f"process {pid} is gone (or its PID now names another process): nothing to {what}")
    held = format_size(record.get("process_bytes") or 0)
    if what == RESUME:
        try:
            restore(pid)
        except ParkError as e:
            raise ParkedError(f"the driver could not bring process {pid} back: {e}") from None
        _audit(root, record, RESUME, who, uid, audit_path)
        return (f"process {pid} ({record.get('user')}) runs again with its {held} back on the GPU; "
                f"if slice {record.get('slice')} is still over its cap, the guard parks it again")
    if what == END:
        if not end(pid, ticks if ticks is not None else start_ticks(pid, proc), proc):
            raise ParkedError(f"process {pid} is gone already")
        _audit(root, record, END, who, uid, audit_path)
        return f"process {pid} ({record.get('user')}) ended; the {held} it held in host memory are freed"
    raise ValueError(what)


def describe(record, now=None):
    """One line for a user or an administrator: who the guard parked, when and why."""
    now = time.time() if now is None else now
    ago = max(0, int(now - (record.get("unix") or now)))
    return (f"process {record.get('pid')} ({record.get('command') or '?'}) was parked by the guard "
            f"{ago // 60} min {ago % 60} s ago: {record.get('why') or 'over its slice cap'}. Its memory is "
            "safe in host memory; an administrator can resume it after raising the cap "
            f"(hami-jupyter guard --resume {record.get('pid')}) or end it")
