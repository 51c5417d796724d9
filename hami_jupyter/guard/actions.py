"""What the guard does about a slice over its cap, and the trail each act leaves.

Three actions (``--action``):

- **park** (the default where the driver has the process checkpoint API):
  the processes :func:`.policy.plan_kills` chose are parked by the guard: the
  driver moves each one's GPU state to host memory (``hami-park hold``), so
  the GPU is free at once and the process, whole, waits in its next CUDA
  call. Only an administrator brings it back (``hami-jupyter guard resume
  PID``, after raising the cap) or ends it (``hami-jupyter guard end PID``);
  the user sees why in ``%hami status`` and the panel, from the report. A
  park that fails ends the process instead, and says so.
- **kill**: the chosen processes are ended with SIGKILL, for an
  administrator who prefers it. SIGKILL because a process past its cap
  without the library has shown it will not keep to it, and a polite signal
  can be caught and ignored; the driver frees a killed process's memory at
  once.
- **warn**: a log line, an audit record (``"guard-warn"``) and the slice
  marked ``"over"`` in the report, where ``%hami status``, the panel,
  ``slice list`` and ``/metrics`` show it. Nothing is ended: for a first
  deployment, to see what the guard would do before it does it.

A process that comes back over the cap with the same command line (a
restarter starting it again after a kill) is parked like any other; ended
again when parking fails, it gets one audit record for all its returns.

Each leaves the same record in the audit log the administrators' changes
go to (:mod:`hami_jupyter.audit`, hash-chained), so that "who ended my
kernel?" has an answer that outlives the report: who (the guard), the
slice, the GPU, the process and its user, the real bytes NVML saw, the bytes
the slice reported and the cap.

A PID is only signalled while it still names the process the guard looked
at: a pidfd is opened first, then the start time is checked again, then the
signal goes through the pidfd, so a process that ended and whose PID was
reused in between is never hit.
"""

from __future__ import annotations

import logging
import time

from .. import audit
from ..slice.parking import ParkError, hold_process
from ..slice.size import format_size
from ..processes import end_process, start_ticks

GUARD_WHO = "hami-jupyter guard"
WARN, KILL, PARK = "warn", "kill", "park"
ACTIONS = (PARK, KILL, WARN)
RETURN_WINDOW_S = 600  # the same command line ended again within this is a return, not a new story

log = logging.getLogger("hami_jupyter.guard")


def _preload(p):
    return "under the preload library" if p.preload else "without the preload library"


class Actions:
    """Warns and kills for the service; *audit_path*: the audit log to append to
    (None: no audit records, for tests of the policy alone)."""

    def __init__(self, mode, audit_path, proc="/proc", end=end_process, hold=hold_process):
        if mode not in ACTIONS:
            raise ValueError(f"action {mode!r}: use one of {', '.join(ACTIONS)}")
        self.mode = mode
        self.audit_path = audit_path
        self.proc = proc
        self._end = end
        self._hold = hold
        self._refused = set()  # (pid, start) whose kill was refused: said once
        self.returns = {}  # (slice, command) -> {"first_unix", "last_unix", "count", "pids"} of ended ones

    def _common(self, gpu, now):
        return {"unix": now, "slice": gpu.slice, "uuid": gpu.uuid,
                "reported_bytes": gpu.reported_bytes, "limit_bytes": gpu.limit_bytes,
                "tolerance_bytes": gpu.tolerance_bytes}

    def _audit(self, gpu, kind, fields, errors):
        if self.audit_path is None:
            return
        record = audit.make_record(gpu.slice, gpu.path, gpu.device, gpu.uuid, None, None,
                                   who=GUARD_WHO, action=f"guard-{kind}", **fields)
        failed = audit.append_or_say(self.audit_path, record)
        if failed:
            message = f"the audit record of a guard {kind} {failed}"
            log.error("guard: %s", message)
            errors.append(message)

    def warn(self, gpu, errors, now=None):
        """Say that *gpu* (a :class:`~.policy.SliceGpu`) is over; returns the
        report's action record."""
        now = time.time() if now is None else now
        pids = sorted(p.pid for p in gpu.processes)
        why = (f"slice {gpu.slice} really uses {format_size(gpu.real_bytes)} on GPU {gpu.uuid}, over "
               f"its {format_size(gpu.limit_bytes)} cap + {format_size(gpu.tolerance_bytes)} "
               f"tolerance (the slice counts {format_size(gpu.reported_bytes)})")
        who = ", ".join(f"{p.pid} ({p.user or p.uid}, {format_size(p.real_bytes)}, "
                        f"{_preload(p)})" for p in sorted(gpu.processes, key=lambda p: p.pid))
        log.warning("guard: WARN %s; processes: %s; nothing ended (--action warn)", why, who)
        record = dict(self._common(gpu, now), action=WARN, pid=None, pids=pids,
                      real_bytes=gpu.real_bytes, why=why)
        self._audit(gpu, WARN, {"pid": None, "pids": pids, "real_bytes": gpu.real_bytes,
                                "reported_bytes": gpu.reported_bytes, "limit_bytes": gpu.limit_bytes,
                                "tolerance_bytes": gpu.tolerance_bytes,
                                "users": sorted({p.user or str(p.uid) for p in gpu.processes})},
                    errors)
        return record

    def _why(self, planned):
        gpu, p = planned.gpu, planned.process
        kept = (f", of which the library charged {format_size(p.charged_bytes)}" if p.preload and
                p.charged_bytes is not None else "")
        return (f"slice {gpu.slice} really used {format_size(planned.real_before)} on GPU {gpu.uuid}, "
                f"over its {format_size(gpu.allowed_bytes)} "
                f"{'cap' if gpu.allowed_bytes == gpu.limit_bytes else 'cap (held from before it was lowered)'}"
                f" + {format_size(gpu.tolerance_bytes)} tolerance (the slice counts "
                f"{format_size(gpu.reported_bytes)}); pid {p.pid} held {format_size(p.real_bytes)} there"
                f"{kept}, {_preload(p)}, attributed by {p.attributed_by}")

    def _fields(self, planned):
        gpu, p = planned.gpu, planned.process
        return {"pid": p.pid, "user": p.user, "process_uid": p.uid, "real_bytes": planned.real_before,
                "process_bytes": p.real_bytes, "reported_bytes": gpu.reported_bytes,
                "limit_bytes": gpu.limit_bytes, "tolerance_bytes": gpu.tolerance_bytes,
                "held_bytes": gpu.held_bytes, "preload": p.preload, "attributed_by": p.attributed_by,
                "command": p.command}

    def act(self, planned, errors, now=None):
        """Park or end the process of *planned* (a :class:`~.policy.Kill`), as
        the mode says; returns the report's action record, or None when nothing
        was done (it ended on its own, or may not be touched)."""
        if self.mode == PARK:
            done = self.park(planned, errors, now)
            if done is not False:
                return done
        return self.kill(planned, errors, now, parked_failed=self.mode == PARK)

    def park(self, planned, errors, now=None):
        """Park it (``hami-park hold``): the action record; None when it is gone;
        False when the park failed (the caller ends it instead)."""
        gpu, p = planned.gpu, planned.process
        now = time.time() if now is None else now
        if start_ticks(p.pid, self.proc) != p.start_ticks:
            return None
        try:
            seconds = self._hold(p.pid)
        except ParkError as e:
            message = f"could not park pid {p.pid} of slice {gpu.slice} ({e}); it is ended instead"
            log.error("guard: %s", message)
            errors.append(message)
            self._park_error = str(e)
            return False
        why = self._why(planned)
        log.warning("guard: PARK pid %d (user %s) in %.1f s: %s", p.pid, p.user or p.uid, seconds, why)
        fields = dict(self._fields(planned), park_seconds=round(seconds, 3))
        self._audit(gpu, PARK, fields, errors)
        return dict(self._common(gpu, now), action=PARK, pid=p.pid, start_ticks=p.start_ticks, user=p.user,
                    real_bytes=planned.real_before, process_bytes=p.real_bytes, preload=p.preload,
                    command=p.command, why=why)

    def kill(self, planned, errors, now=None, parked_failed=False):
        """End the process of *planned* (a :class:`~.policy.Kill`); returns the
        report's action record, or None when nothing was ended."""
        gpu, p = planned.gpu, planned.process
        now = time.time() if now is None else now
        try:
            ended = self._end(p.pid, p.start_ticks, self.proc)
        except PermissionError:
            key = (p.pid, p.start_ticks)
            message = (f"may not end pid {p.pid} (user {p.user or p.uid}) of slice {gpu.slice}, over "
                       "its cap: the guard must run as root to end other users' processes")
            errors.append(message)
            if key not in self._refused:
                self._refused.add(key)
                log.error("guard: %s", message)
            return None
        if not ended:
            return None  # it ended on its own (or its PID is another process's now)
        why = self._why(planned)
        if parked_failed:
            why += f"; ended because its park failed: {getattr(self, '_park_error', '?')}"
        # A command line ended again soon after: one story, told once (a restarter's loop).
        key = (gpu.slice, p.command)
        seen = self.returns.get(key)
        again = seen is not None and p.command and now - seen["last_unix"] <= RETURN_WINDOW_S
        if again:
            seen["count"] += 1
            seen["last_unix"] = now
            seen["pids"] = (seen["pids"] + [p.pid])[-10:]
            log.warning("guard: KILL pid %d again (the same command line ended %d times since %s)", p.pid,
                        seen["count"], time.strftime("%H:%M:%S", time.localtime(seen["first_unix"])))
            if seen["count"] == 2:
                self._audit(gpu, "return", dict(self._fields(planned), ended_times=2,
                                                 first_pid=seen["pids"][0],
                                                 note="the same command line came back over the cap; "
                                                      "later returns are counted in the guard's report, "
                                                      "not logged one by one"), errors)
        else:
            self.returns[key] = {"first_unix": now, "last_unix": now, "count": 1, "pids": [p.pid]}
            log.warning("guard: KILL pid %d (user %s): %s", p.pid, p.user or p.uid, why)
            self._audit(gpu, KILL, self._fields(planned), errors)
        return dict(self._common(gpu, now), action=KILL, pid=p.pid, user=p.user,
                    real_bytes=planned.real_before, process_bytes=p.real_bytes, preload=p.preload,
                    command=p.command, why=why, repeat=bool(again))

    def returning(self):
        """The command lines ended more than once lately, for the report."""
        return [{"slice": s, "command": c, **v} for (s, c), v in sorted(self.returns.items(), key=str)
                if v["count"] > 1]
