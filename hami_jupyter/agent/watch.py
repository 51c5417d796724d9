"""The agent's watch: every interval, look at the node, judge by the guard's policy, act, report.

:class:`Watch` does one interval in :meth:`Watch.round` and repeats it in
:meth:`Watch.run`. Every interval is a look (:meth:`~.facts.look.Node.look`),
which is also how the agent learns who uses the GPU (the room policy's
measure of idleness rests on these looks), so the watch runs whichever
policies are on. With the guard on, it then judges each slice's real use
against its cap (:mod:`.guard.policy`), has the actor park, end or only warn
about what passes a cap by memory no cap allowed, records each act
(:mod:`.records`) and writes ``guard.json`` (:mod:`.guard.report`).

An over state must be seen in :data:`CONFIRM_ROUNDS` intervals in a row
before the guard acts on it (it is shown as ``"over"`` in the report at
once). A process's first CUDA context is charged only after the driver made
it (docs/preload.md), so for a moment a slice at its cap can hold one more
context than the cap; a second look, one interval later, keeps that moment
from ending anything, and still ends a real bypass within two intervals.

What the actor is at work on for the room policy (a kernel being parked) is
left alone: its memory is leaving the GPU already. A park that fails because
someone else parks the process (the driver holds it locked) ends nothing
either; only a park that fails for the process's own sake (the driver
refuses, host memory is short) ends it, when the action is ``park``.

A process parked is not "ended": when an administrator resumes it and its
slice is still over its cap, it is parked again (only a killed process's
bytes, which NVML may list a moment longer, count as freed).
"""

from __future__ import annotations

import logging
import time

from ..slice.guard_report import MAX_ACTIONS, write_report
from ..slice.parking import ParkError
from .actor import Busy, ParkedElsewhere
from .guard.policy import DEFAULT_TOLERANCE, Allowances, measure, plan_kills
from .guard.report import build, carried_over

CONFIRM_ROUNDS = 2
DEFAULT_INTERVAL = 0.5
WARN, KILL, PARK = "warn", "kill", "park"
ACTIONS = (PARK, KILL, WARN)

log = logging.getLogger("hami_jupyter.guard")


class ReportFile:
    """Writes a report with *write* (``write(report, root)``) under *root*; a
    write that fails is logged once (as *who*), not every interval, until one
    succeeds again."""

    def __init__(self, write, root, who):
        self.write, self.root, self.who = write, root, who
        self._error = None

    def __call__(self, report):
        try:
            self.write(report, self.root)
        except OSError as e:
            message = f"cannot write the report in {self.root}: {e.strerror or e}"
            if message != self._error:
                logging.getLogger(f"hami_jupyter.{self.who}").error("%s: %s", self.who, message)
            self._error = message
        else:
            self._error = None


class Watch:
    """The watch over *node* (a :class:`~.facts.look.Node`) under slice root *root*.

    *actor*, *records*: the agent's; *guard*: whether the guard's policy runs
    (else the watch only looks, for the activity it sees); *action*: park,
    kill or warn; *tolerance*: the tolerance of a slice whose processes
    declare no context overhead.
    """

    def __init__(self, root, node, actor, records, *, interval=DEFAULT_INTERVAL, guard=True, action=PARK,
                 tolerance=DEFAULT_TOLERANCE):
        if action not in ACTIONS:
            raise ValueError(f"action {action!r}: use one of {', '.join(ACTIONS)}")
        self.root = root
        self.node, self.actor, self.records = node, actor, records
        self.interval = interval
        self.guard = guard
        self.action = action
        self.tolerance = tolerance
        self.memory = Allowances()  # what was seen allowed (guard/policy.py)
        self.recent = []  # the latest actions, oldest first (the report keeps MAX_ACTIONS)
        self.warned = set()  # (slice, uuid) warned about while it stays over
        self.over_rounds = {}  # (slice, uuid) -> intervals in a row it was seen over
        self.ended = {}  # pid -> start ticks of processes killed that NVML may still list
        self._write = ReportFile(lambda report, root: write_report(report, root), root, "guard")

    @classmethod
    def alone(cls, root, *, reader=None, audit_path=None, proc="/proc", **options):
        """A watch of its own over *root*, with a node, actor and records of its
        own (a test's, a benchmark's): the guard's policy as the agent runs it.
        *reader*: NVML's stand-in; *audit_path*: default ``<root>/audit.log``."""
        from .. import audit
        from .actor import Actor
        from .facts.look import Node
        from .records import Records

        node = Node(root, reader=reader, proc=proc)
        node.start()
        records = Records(audit_path if audit_path is not None else audit.default_path(root))
        return cls(root, node, Actor(proc=proc), records, **options)

    def close(self):
        self.node.close()

    def start(self):
        """Take back what a previous agent reported."""
        if not self.guard:
            return
        previous = carried_over(self.root)
        self.recent, over = previous.actions, previous.over
        self.memory = previous.memory
        for record in previous.parked:
            self.actor.held.setdefault(record["pid"], record)
        self.warned = set(over)
        self.over_rounds = {key: CONFIRM_ROUNDS - 1 for key in over}
        if over:
            log.info("guard: the previous guard saw %d slice GPU(s) over their caps; "
                     "they are not warned about again while they stay over", len(over))

    def round(self, now=None):
        """One interval: the look, and with the guard on, the report written."""
        look = self.node.look()
        if not self.guard:
            self.actor.prune({p.facts.pid for p in look.placed if p.used_bytes > 0})
            return None
        errors = list(look.errors)
        read = set(look.reading.gpus)
        measured, unattributed = measure(read, look.placed, look.slices, self.tolerance, self.memory)
        facts_of = {p.facts.pid: p.facts for p in look.placed}
        self.ended = {pid: ticks for pid, ticks in self.ended.items()
                      if pid in facts_of and facts_of[pid].start_ticks == ticks}
        held_now = self._act(measured, read, errors)
        self.memory = self.memory.advance(measured, read)
        self.actor.prune({p.facts.pid for p in look.placed if p.used_bytes > 0}, held_now)
        self.recent = self.recent[-MAX_ACTIONS:]
        report = build(measured, look.slices, unattributed + look.unseen, errors, self.recent,
                       interval=self.interval, action=self.action, now=now, memory=self.memory,
                       parked=list(self.actor.held.values()), returns=self.records.returning())
        self._write(report)
        return report

    def _act(self, measured, read, errors):
        """Act on the slices confirmed over; the PIDs held now."""
        over_now, held_now = set(), set()
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
                        self.recent.append(self.records.guard_warn(gpus[uuid]))
                continue
            ended = {p.pid for g in gpus.values() for p in g.processes
                     if self.ended.get(p.pid) == p.start_ticks or p.pid in self.actor.held}
            for planned in plan_kills(list(gpus.values()), only=confirmed, ended=ended):
                done = self._act_on(planned, errors)
                if done is None:
                    continue
                self.recent.append(done)
                if done["action"] == PARK:
                    held_now.add(planned.process.pid)
                else:
                    self.ended[planned.process.pid] = planned.process.start_ticks
        # A GPU read this interval and not over there any more has recovered:
        # the next time it is over is a new state, warned about again. A GPU
        # not read keeps what was known of it.
        for key in [k for k in set(self.over_rounds) | self.warned if k[1] in read and k not in over_now]:
            self.over_rounds.pop(key, None)
            self.warned.discard(key)
        return held_now

    def _act_on(self, planned, errors):
        """Park or end *planned*'s process as the action says; the report's record,
        or None when nothing was done."""
        p = planned.process
        park_error = None
        if self.action == PARK:
            why = self.records.guard_why(planned)
            record = {"unix": time.time(), "action": PARK, "slice": planned.gpu.slice, "uuid": planned.gpu.uuid,
                      "user": p.user, "real_bytes": planned.real_before, "process_bytes": p.real_bytes,
                      "preload": p.preload, "command": p.command, "why": why}
            try:
                seconds = self.actor.hold(p.pid, p.start_ticks, record)
            except (Busy, ParkedElsewhere) as e:  # its memory is on its way off the GPU: nothing ended
                errors.append(f"pid {p.pid} of slice {planned.gpu.slice}: not parked by the guard now: {e}")
                return None
            except ParkError as e:
                if "is gone" in str(e):
                    return None
                park_error = str(e)
                message = f"could not park pid {p.pid} of slice {planned.gpu.slice} ({e}); it is ended instead"
                log.error("guard: %s", message)
                errors.append(message)
            else:
                done = self.records.guard_park(planned, seconds)
                self.actor.held[p.pid].update(done)
                return done
        try:
            ended = self.actor.kill(p.pid, p.start_ticks)
        except Busy as e:
            errors.append(f"pid {p.pid} of slice {planned.gpu.slice}: not ended now: {e}")
            return None
        except PermissionError:
            self.records.kill_refused(planned, errors)
            return None
        if not ended:
            return None  # it ended on its own (or its PID is another process's now)
        return self.records.guard_kill(planned, park_error=park_error)

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
