"""The guard's loop: every interval, read, attribute, judge, act, report.

:class:`Guard` does one interval in :meth:`Guard.round` and repeats it in
:meth:`Guard.run`; :func:`main` is ``hami-jupyter guard``: it checks that the
guard can do its job before the first interval, and stops cleanly on
SIGTERM (systemd, Kubernetes) or SIGINT.

Start-up refuses, with one line saying why, when NVML cannot be started at
all (no driver: a guard that cannot see the GPUs guards nothing, and a
service manager restarting it shows the reason every time) or when the
slice root is missing or another user's. It warns, and goes on, when it is
not root: it can then read and end only its own user's processes.

Once running, nothing stops it but a signal: an NVML error, a slice that
cannot be read or a process that vanished is a line in the report's
``"errors"``; any other exception in an interval is logged with its
traceback and the next interval runs as usual.

An over state must be seen in :data:`CONFIRM_ROUNDS` intervals in a row
before the guard acts on it (it is shown as ``"over"`` in the report at
once). A process's first CUDA context is charged only after the driver made
it (docs/preload.md), so for a moment a slice at its cap can hold one more
context than the cap; a second look, one interval later, keeps that moment
from ending anything, and still ends a real bypass within two intervals.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from pathlib import Path

from .. import audit
from ..processes import start_ticks
from ..slice.guard_report import MAX_ACTIONS, write_report
from ..slice.paths import root_problem
from ..slice.size import format_size
from ..slice.parking import checkpoint_api
from .actions import KILL, PARK, WARN, Actions
from .attribution import Attributor
from .nvml import NvmlReader, NvmlUnavailable
from .policy import DEFAULT_TOLERANCE, Placed, measure, plan_kills
from .procs import ProcessTable
from .report import build, carried_over
from .slices import SliceFiles

CONFIRM_ROUNDS = 2
DEFAULT_INTERVAL = 0.5

log = logging.getLogger("hami_jupyter.guard")


class GuardStartError(RuntimeError):
    """The guard cannot do its job here; the message says why and what to do."""


class Guard:
    """One guard over the slices under *root*.

    *reader*: where GPU processes come from (default NVML); *audit_path*:
    the audit log (default ``<root>/audit.log``); *tolerance*: the
    tolerance of a slice whose processes declare no context overhead.
    """

    def __init__(self, root, *, interval=DEFAULT_INTERVAL, action=PARK, reader=None,
                 audit_path=None, tolerance=DEFAULT_TOLERANCE, proc="/proc", hold=None):
        self.root = Path(root)
        self.interval = interval
        self.action = action
        self.tolerance = tolerance
        self.reader = reader if reader is not None else NvmlReader()
        self.slices = SliceFiles(self.root)
        self.procs = ProcessTable(proc)
        self.attributor = Attributor(proc)
        extra = {"hold": hold} if hold is not None else {}
        self.actions = Actions(action, Path(audit_path) if audit_path else audit.default_path(self.root),
                               proc, **extra)
        self.allowance = {}  # (slice, uuid) -> bytes held from before a lowered cap (policy.py)
        self.parked = {}  # pid -> the park action's record, while the process stays parked
        self._parked_now = set()  # parked during this interval
        self.recent = []  # the latest actions, oldest first (the report keeps MAX_ACTIONS)
        self.warned = set()  # (slice, uuid) warned about while it stays over
        self.over_rounds = {}  # (slice, uuid) -> intervals in a row it was seen over
        self._write_error = None
        self.ended = {}  # pid -> start ticks of processes killed that NVML may still list

    def start(self):
        """Start NVML (NvmlUnavailable when it cannot) and take back what a
        previous guard reported."""
        self.reader.start()
        previous = carried_over(self.root)
        self.recent, over = previous.actions, previous.over
        self.allowance = previous.allowance
        self.parked = {p["pid"]: p for p in previous.parked}
        self.warned = set(over)
        self.over_rounds = {key: CONFIRM_ROUNDS - 1 for key in over}
        if over:
            log.info("guard: the previous guard saw %d slice GPU(s) over their caps; "
                     "they are not warned about again while they stay over", len(over))

    def round(self, now=None):
        """One interval; returns the report written."""
        errors = []
        reading = self.reader.read()
        errors.extend(reading.errors)
        slices = self.slices.read(errors)
        placed, unseen, facts_of = [], [], {}
        for gp in reading.processes:
            if gp.pid not in facts_of:
                facts_of[gp.pid] = self.procs.facts(gp.pid)
            facts = facts_of[gp.pid]
            if facts is None:  # ended since NVML listed it, or in a PID namespace we do not see
                unseen.append({"pid": gp.pid, "uuid": gp.uuid, "real_bytes": gp.used_bytes, "user": None,
                               "why": "not in the guard's /proc: it ended, or runs in a PID namespace "
                                      "the guard does not see"})
                continue
            placed.append(Placed(gp.uuid, gp.used_bytes, facts, self.attributor.attribute(facts, slices)))
        self.procs.keep(facts_of)
        self.ended = {pid: ticks for pid, ticks in self.ended.items()
                      if facts_of.get(pid) is not None and facts_of[pid].start_ticks == ticks}
        self.attributor.keep((f.pid, f.start_ticks) for f in facts_of.values() if f is not None)
        measured, unattributed = measure(set(reading.gpus), placed, slices, self.tolerance)
        for name, gpus in measured.items():
            for uuid, g in gpus.items():
                g.allowance_bytes = self.allowance.get((name, uuid))
        self._parked_now = set()
        self._act(measured, set(reading.gpus), errors)
        for name, gpus in measured.items():
            for uuid, g in gpus.items():
                self.allowance[(name, uuid)] = g.next_allowance()
        self._keep_parked(reading)
        self.recent = self.recent[-MAX_ACTIONS:]
        report = build(measured, slices, unattributed + unseen, errors, self.recent,
                       interval=self.interval, action=self.action, now=now, allowance=self.allowance,
                       parked=list(self.parked.values()), returns=self.actions.returning())
        self._write(report)
        return report

    def _keep_parked(self, reading):
        """Forget a parked process once it is gone (its PID gone, or another
        process's now), or back on a GPU: an administrator resumed it, and
        NVML lists it with bytes again."""
        on_gpu = {gp.pid for gp in reading.processes if gp.used_bytes > 0}
        for pid, record in list(self.parked.items()):
            if pid in self._parked_now:
                continue  # this interval's reading is from before its park
            ticks = start_ticks(pid, self.procs.proc)
            if pid in on_gpu or ticks is None or ticks != record.get("start_ticks", ticks):
                del self.parked[pid]

    def _write(self, report):
        try:
            write_report(report, self.root)
        except OSError as e:  # said once, not every half second
            message = f"cannot write the report in {self.root}: {e.strerror or e}"
            if message != self._write_error:
                log.error("guard: %s", message)
            self._write_error = message
        else:
            self._write_error = None

    def _act(self, measured, read, errors):
        over_now = set()
        for name, gpus in measured.items():
            confirmed = set()
            for uuid, g in gpus.items():
                if not g.over:
                    continue
                key = (name, uuid)
                over_now.add(key)
                self.over_rounds[key] = self.over_rounds.get(key, 0) + 1
                if self.over_rounds[key] >= CONFIRM_ROUNDS:
                    confirmed.add(uuid)
            if not confirmed:
                continue
            if self.action == WARN:
                for uuid in sorted(confirmed):
                    if (name, uuid) not in self.warned:
                        self.warned.add((name, uuid))
                        self.recent.append(self.actions.warn(gpus[uuid], errors))
                continue
            ended = {p.pid for g in gpus.values() for p in g.processes
                     if self.ended.get(p.pid) == p.start_ticks}
            for planned in plan_kills(list(gpus.values()), only=confirmed, ended=ended):
                done = self.actions.act(planned, errors)
                if done is not None:
                    self.ended[planned.process.pid] = planned.process.start_ticks
                    self.recent.append(done)
                    if done["action"] == PARK:
                        self.parked[planned.process.pid] = done
                        self._parked_now.add(planned.process.pid)
        # A GPU read this interval and not over there any more has recovered:
        # the next time it is over is a new state, warned about again. A GPU
        # not read keeps what was known of it.
        for key in [k for k in set(self.over_rounds) | self.warned if k[1] in read and k not in over_now]:
            self.over_rounds.pop(key, None)
            self.warned.discard(key)

    def run(self, stop, once=False):
        """Run intervals until *stop* (a threading.Event) is set, or once."""
        while True:
            began = time.monotonic()
            try:
                self.round()
            except Exception:
                log.exception("guard: this interval failed; the guard goes on with the next")
            if once or stop.wait(max(0.0, self.interval - (time.monotonic() - began))):
                return

    def close(self):
        self.slices.close()


def _check_root(root):
    problem = root_problem(root, ": nothing to guard yet (the hub makes it; or give --root)")
    if problem:
        raise GuardStartError(problem)


def _more_files():
    """One open slice file per slice is kept between intervals: raise the soft
    limit on open files to the hard one (systemd's default soft limit is 1024)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))
    except (ValueError, OSError):
        pass


def main(root, *, interval=DEFAULT_INTERVAL, action=PARK, once=False, tolerance=DEFAULT_TOLERANCE,
         audit_path=None, reader=None):
    """``hami-jupyter guard``: returns the exit status, or raises GuardStartError."""
    root = Path(root)
    _check_root(root)
    if os.geteuid() != 0:
        log.warning("guard: not running as root (uid %d): it can read the environment of, and end, only "
                    "this user's processes; other users' processes over their caps are reported but not "
                    "ended. Run it as root (docs/guard.md).", os.geteuid())
    _more_files()
    if action == PARK:
        why_not = checkpoint_api()
        if why_not is not None:
            log.warning("guard: cannot park here (%s): processes over their caps are ended instead "
                        "(--action kill)", why_not)
            action = KILL
    guard = Guard(root, interval=interval, action=action, reader=reader, audit_path=audit_path,
                  tolerance=tolerance)
    try:
        guard.start()
    except NvmlUnavailable as e:
        raise GuardStartError(f"cannot see the GPUs: {e}") from None
    stop = threading.Event()

    def stopping(signum, frame):
        log.info("guard: %s received, stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info("guard: watching %s every %g s, action %s, default tolerance %s, audit log %s", root,
             interval, action, format_size(tolerance), guard.actions.audit_path)
    try:
        guard.run(stop, once=once)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        guard.close()
    log.info("guard: stopped")
    return 0
