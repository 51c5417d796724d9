"""Every act and decision of the agent: a log line, an audit record, and the reports' latest.

The agent parks and ends other users' processes; each of them will ask "who
did this to my kernel, and why?". So every act goes to the audit log the
administrators' changes go to (:mod:`hami_jupyter.audit`, hash-chained),
through this one writer, for both policies:

- the guard's (``who``: ``hami-jupyter guard``): ``guard-park``,
  ``guard-kill``, ``guard-return`` (the same command line ended again: one
  record for all its returns within ten minutes), ``guard-warn``;
- the room policy's (``who``: ``hami-jupyter broker``): ``broker-park`` (a
  kernel parked to make room, and for whom), ``broker-park-failed``,
  ``broker-served`` (``OK`` answered), ``broker-refused`` (``NO``),
  ``broker-dropped`` (the requester went away).

A park for the headroom is a ``broker-park`` like any other, but no user
asked for it: its ``requester`` is ``{"for": "headroom", ...}``.

No user can fill the log: every record a user's requests or processes cause
is rate-limited, and so is its line in the agent's log (one connect, send and
close loop left 6,543 ``broker-dropped`` records in 15 s, issue 39). A
refusal repeated for the same wait is recorded once, and the next record of
that wait says how many times it was asked; beyond that, refusals by one rule,
requests that went away before they were served with nothing parked for
them, refusals of requests that are no requests (a process without a slot, a
malformed line), and ``OK`` answers that parked nothing (the GPU had the
room) are recorded at most once a minute per user (and rule), each record
counting those left out since the one before (``asked``, ``times``). The
guard's parks and ends of one slice's processes are recorded one by one up to
:data:`GUARD_BURST` a minute; beyond that they are counted into the next
record of that slice (``unrecorded_acts``), and kept in the guard's report.
What costs another user something (a park made for a request) is always
recorded.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from .. import audit
from ..slice.broker_report import MAX_DECISIONS
from ..slice.size import format_size as _size

GUARD_WHO = "hami-jupyter guard"
BROKER_WHO = "hami-jupyter broker"
PARK, PARK_FAILED, SERVED, REFUSED, DROPPED = "park", "park-failed", "served", "refused", "dropped"
WARN, KILL = "warn", "kill"
USER_WINDOW_S = 60.0  # a user's requests cause at most one record of a kind in this long
GUARD_BURST = 10  # the guard's acts on one slice recorded one by one in USER_WINDOW_S; the rest counted
RETURN_WINDOW_S = 600  # the same command line ended again within this is a return, not a new story
MAX_REMEMBERED = 4096  # repeats remembered for the count; older than FORGET_AFTER_S are forgotten beyond
FORGET_AFTER_S = 3600.0

log = logging.getLogger("hami_jupyter.agent")
guard_log = logging.getLogger("hami_jupyter.guard")
broker_log = logging.getLogger("hami_jupyter.broker")


def _preload(p):
    """What is true of *p* (a :class:`~.guard.policy.ProcessUse`) and the library: a
    process under it was charged less than the driver says it holds (its slice's
    counters were changed, or it took memory past what the library let through)."""
    if not p.preload:
        return "without the preload library"
    if p.charged_bytes is None:
        return "under the preload library"
    return (f"under the preload library, which charged it {_size(p.charged_bytes)} of the "
            f"{_size(p.real_bytes)} the driver lists")


class Records:
    """Writes to the audit log at *audit_path* (None: none, for tests of a
    policy alone) and keeps the latest room decisions per GPU for the report."""

    def __init__(self, audit_path):
        self.audit_path = audit_path
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one record at a time, whichever thread writes it
        self._latest = collections.defaultdict(lambda: collections.deque(maxlen=MAX_DECISIONS))
        self._repeats = {}  # key -> [asks since the last record, monotonic time of the last record, rule]
        self.errors = collections.deque(maxlen=10)  # audit writes that failed, for the reports
        self.returns = {}  # (slice, command) -> {"first_unix", "last_unix", "count", "pids"} of ended ones
        self._refused_kills = set()  # (pid, start) whose kill was refused: said once
        self._guard_acts = {}  # slice -> [monotonic times of its recent recorded acts, acts not recorded]

    def _append(self, slice_name, path, device, uuid, who, action, fields, uid=None):
        if self.audit_path is None:
            return
        extra = {"uid": uid} if uid is not None else {}
        record = audit.make_record(slice_name, str(path), device, uuid, None, None, who=who, action=action,
                                   **extra, **fields)
        with self._write_lock:
            failed = audit.append_or_say(self.audit_path, record)
        if failed:
            message = f"the audit record of {action} {failed}"
            log.error("agent: %s", message)
            self.errors.append(message)

    # ---- the guard's --------------------------------------------------------------

    def guard_warn(self, gpu, now=None):
        """Say that *gpu* (a :class:`~.guard.policy.SliceGpu`) is over; returns the
        report's action record."""
        now = time.time() if now is None else now
        pids = sorted(p.pid for p in gpu.processes)
        why = (f"slice {gpu.slice} really uses {_size(gpu.real_bytes)} on GPU {gpu.uuid}, over "
               f"its {_size(gpu.limit_bytes)} cap + {_size(gpu.tolerance_bytes)} "
               f"tolerance (the slice counts {_size(gpu.reported_bytes)})")
        who = ", ".join(f"{p.pid} ({p.user or p.uid}, {_size(p.real_bytes)}, {_preload(p)})"
                        for p in sorted(gpu.processes, key=lambda p: p.pid))
        guard_log.warning("guard: WARN %s; processes: %s; nothing ended (--action warn)", why, who)
        fields = {"pid": None, "pids": pids, "real_bytes": gpu.real_bytes, "reported_bytes": gpu.reported_bytes,
                  "limit_bytes": gpu.limit_bytes, "tolerance_bytes": gpu.tolerance_bytes,
                  "users": sorted({p.user or str(p.uid) for p in gpu.processes})}
        self._append(gpu.slice, gpu.path, gpu.device, gpu.uuid, GUARD_WHO, "guard-warn", fields)
        return dict(_common(gpu, now), action=WARN, pid=None, pids=pids, real_bytes=gpu.real_bytes, why=why)

    def guard_why(self, planned):
        """Why the guard acts on *planned* (a :class:`~.guard.policy.Kill`), in one line."""
        gpu, p = planned.gpu, planned.process
        allowed = (f", of which it was seen holding {_size(p.allowed_bytes)} within the cap"
                   if p.preload and p.allowed_bytes else "")
        return (f"slice {gpu.slice} really used {_size(planned.real_before)} on GPU {gpu.uuid}, "
                f"over its {_size(gpu.allowed_bytes)} "
                f"{'cap' if gpu.allowed_bytes == gpu.limit_bytes else 'cap (held from before it was lowered)'}"
                f" + {_size(gpu.tolerance_bytes)} tolerance (the slice counts "
                f"{_size(gpu.reported_bytes)}); pid {p.pid} held {_size(p.real_bytes)} there"
                f"{allowed}, {_preload(p)}, attributed by {p.attributed_by}")

    @staticmethod
    def _fields(planned):
        gpu, p = planned.gpu, planned.process
        return {"pid": p.pid, "user": p.user, "process_uid": p.uid, "real_bytes": planned.real_before,
                "process_bytes": p.real_bytes, "reported_bytes": gpu.reported_bytes,
                "limit_bytes": gpu.limit_bytes, "tolerance_bytes": gpu.tolerance_bytes,
                "held_bytes": gpu.held_bytes, "preload": p.preload, "attributed_by": p.attributed_by,
                "command": p.command}

    def _guard_turn(self, slice_name):
        """Whether an act of the guard on *slice_name* is recorded now (at most
        :data:`GUARD_BURST` in :data:`USER_WINDOW_S`), and how many acts on it
        were not recorded since its last record."""
        now = time.monotonic()
        with self._lock:
            recent, skipped = self._guard_acts.get(slice_name, ([], 0))
            recent = [t for t in recent if now - t < USER_WINDOW_S]
            if len(recent) >= GUARD_BURST:
                self._guard_acts[slice_name] = (recent, skipped + 1)
                return False, 0
            self._guard_acts[slice_name] = (recent + [now], 0)
            return True, skipped

    def guard_park(self, planned, seconds, now=None):
        """The guard parked *planned*'s process: logged and audited; the report's record."""
        gpu, p = planned.gpu, planned.process
        now = time.time() if now is None else now
        why = self.guard_why(planned)
        turn, skipped = self._guard_turn(gpu.slice)
        if turn:
            guard_log.warning("guard: PARK pid %d (user %s) in %.1f s: %s", p.pid, p.user or p.uid, seconds, why)
            self._append(gpu.slice, gpu.path, gpu.device, gpu.uuid, GUARD_WHO, "guard-park",
                         dict(self._fields(planned), park_seconds=round(seconds, 3), unrecorded_acts=skipped))
        else:
            guard_log.debug("guard: PARK pid %d (user %s) in %.1f s (not audited: more than %d acts on slice "
                            "%s within a minute)", p.pid, p.user or p.uid, seconds, GUARD_BURST, gpu.slice)
        return dict(_common(gpu, now), action="park", pid=p.pid, start_ticks=p.start_ticks, user=p.user,
                    real_bytes=planned.real_before, process_bytes=p.real_bytes, preload=p.preload,
                    command=p.command, why=why)

    def guard_kill(self, planned, now=None, park_error=None):
        """The guard ended *planned*'s process (*park_error*: why it was not parked
        instead): logged and audited once per story; the report's record."""
        gpu, p = planned.gpu, planned.process
        now = time.time() if now is None else now
        why = self.guard_why(planned)
        if park_error is not None:
            why += f"; ended because its park failed: {park_error}"
        # A command line ended again soon after: one story, told once (a restarter's loop).
        key = (gpu.slice, p.command)
        seen = self.returns.get(key)
        again = seen is not None and p.command and now - seen["last_unix"] <= RETURN_WINDOW_S
        if again:
            seen["count"] += 1
            seen["last_unix"] = now
            seen["pids"] = (seen["pids"] + [p.pid])[-10:]
            guard_log.warning("guard: KILL pid %d again (the same command line ended %d times since %s)", p.pid,
                              seen["count"], time.strftime("%H:%M:%S", time.localtime(seen["first_unix"])))
            if seen["count"] == 2:
                self._append(gpu.slice, gpu.path, gpu.device, gpu.uuid, GUARD_WHO, "guard-return",
                             dict(self._fields(planned), ended_times=2, first_pid=seen["pids"][0],
                                  note="the same command line came back over the cap; later returns are "
                                       "counted in the guard's report, not logged one by one"))
        else:
            self.returns[key] = {"first_unix": now, "last_unix": now, "count": 1, "pids": [p.pid]}
            turn, skipped = self._guard_turn(gpu.slice)
            if turn:
                guard_log.warning("guard: KILL pid %d (user %s): %s", p.pid, p.user or p.uid, why)
                self._append(gpu.slice, gpu.path, gpu.device, gpu.uuid, GUARD_WHO, "guard-kill",
                             dict(self._fields(planned), unrecorded_acts=skipped))
            else:
                guard_log.debug("guard: KILL pid %d (user %s) (not audited: more than %d acts on slice %s "
                                "within a minute)", p.pid, p.user or p.uid, GUARD_BURST, gpu.slice)
        return dict(_common(gpu, now), action=KILL, pid=p.pid, user=p.user, real_bytes=planned.real_before,
                    process_bytes=p.real_bytes, preload=p.preload, command=p.command, why=why,
                    repeat=bool(again))

    def kill_refused(self, planned, errors):
        """The guard may not end *planned*'s process (not root): a line in the
        report every time, in the log once."""
        gpu, p = planned.gpu, planned.process
        message = (f"may not end pid {p.pid} (user {p.user or p.uid}) of slice {gpu.slice}, over its cap: "
                   "the guard must run as root to end other users' processes")
        errors.append(message)
        if (p.pid, p.start_ticks) not in self._refused_kills:
            self._refused_kills.add((p.pid, p.start_ticks))
            guard_log.error("guard: %s", message)

    def returning(self):
        """The command lines ended more than once lately, for the report."""
        return [{"slice": s, "command": c, **v} for (s, c), v in sorted(self.returns.items(), key=str)
                if v["count"] > 1]

    # ---- the room policy's ------------------------------------------------------------

    def latest(self):
        """``{uuid: [decision, ...]}``, oldest first."""
        with self._lock:
            return {uuid: list(d) for uuid, d in self._latest.items()}

    def _room(self, action, uuid, slice_name, path, uid, fields):
        self._append(slice_name, path, None, uuid, BROKER_WHO, f"broker-{action}", fields, uid=uid)
        with self._lock:
            self._latest[uuid].append(dict(fields, action=action, unix=time.time()))

    def park(self, request, kernel, result, idle_s):
        why = (f"to make room for {request.who()}: {kernel.label} of slice {kernel.slice} "
               f"(user {kernel.user or '?'}) idle for {idle_s:.0f} s, its slice holding "
               f"{_size(kernel.held)} above its {_size(kernel.guarantee)} guarantee")
        if result.held:
            why += (f"; process(es) {', '.join(map(str, result.held))} held by the driver, their slots refusing "
                    "a park: an administrator brings them back")
        broker_log.warning("broker: PARK %s: %s moved to host memory in %.1f s, %s", kernel.label,
                           _size(result.bytes), result.seconds, why)
        fields = dict(kernel.record(), requester=request.record(), park_bytes=result.bytes,
                      park_seconds=round(result.seconds, 3), idle_seconds=round(idle_s, 1),
                      slice_bytes=kernel.held, guarantee_bytes=kernel.guarantee, held=list(result.held), why=why)
        self._room(PARK, request.uuid, kernel.slice, kernel.path, request.uid, fields)

    def park_failed(self, request, kernel, error):
        why = f"park of {kernel.label} (slice {kernel.slice}) failed: {error}; trying the next"
        broker_log.error("broker: %s", why)
        fields = dict(kernel.record(), requester=request.record(), error=str(error), why=why)
        self._room(PARK_FAILED, request.uuid, kernel.slice, kernel.path, request.uid, fields)

    def served(self, request, made, free, parked):
        why = (f"{_size(made)} made free by parking {len(parked)} kernel(s)" if parked else
               "the GPU had the room already")
        asked = self._settle(request)
        if not parked and not self._first(("served", request.uid, request.uuid), "room-there", USER_WINDOW_S):
            broker_log.debug("broker: OK again to %s: %s", request.who(), why)
            return  # nothing parked: counted, recorded at most once a minute per user
        broker_log.info("broker: OK to %s: %s (%s free)", request.who(), why, _size(free))
        fields = dict(requester=request.record(), made_bytes=made, free_bytes=free,
                      parked=[k.record() for k in parked], asked=asked, why=why)
        if not parked:
            fields["answered"] = self._take_count(("served", request.uid, request.uuid))
        self._room(SERVED, request.uuid, request.slice, request.path, request.uid, fields)

    def refused(self, request, why, kind):
        """``NO`` to a request from a process with a slot; *kind*: the rule that
        refused it (a wait refused again by the same rule is not recorded again,
        and one user's waits refused by one rule at most once a minute)."""
        key = ("wait", request.pid, request.since_ns, request.uuid)
        if not self._first(key, kind, None):
            broker_log.debug("broker: NO again to %s: %s", request.who(), why)
            return
        user_key = ("refused", request.uid, kind)
        if not self._first(user_key, kind, USER_WINDOW_S):
            broker_log.debug("broker: NO to %s (not recorded: refused by this rule within a minute): %s",
                             request.who(), why)
            return
        broker_log.info("broker: NO to %s: %s", request.who(), why)
        fields = dict(requester=request.record(), asked=self._take_count(key), times=self._take_count(user_key),
                      why=why)
        self._room(REFUSED, request.uuid, request.slice, request.path, request.uid, fields)

    def refused_stranger(self, root, pid, uid, user, uuid, why, kind):
        """``NO`` to a request that is no request of a slice's process, or that a
        user's bounds turn away; *kind*: the rule."""
        key = ("stranger", uid, kind)
        if not self._first(key, kind, USER_WINDOW_S):
            return
        broker_log.warning("broker: NO to pid %s (user %s): %s", pid, user or uid, why)
        fields = {"requester": {"pid": pid, "user": user}, "why": why, "asked": self._take_count(key)}
        self._append(None, root, None, uuid, BROKER_WHO, f"broker-{REFUSED}", fields, uid=uid)
        if uuid:
            with self._lock:
                self._latest[uuid].append(dict(fields, action=REFUSED, unix=time.time()))

    def dropped(self, request, parked):
        """*request* went away before it was served. Recorded whenever kernels
        were parked for it (someone paid for it); otherwise at most once a
        minute per user, counting the others (``times``)."""
        why = (f"{request.who()} went away before it was served; nothing more is parked for it"
               + (f" ({len(parked)} kernel(s) were parked for it already)" if parked else ""))
        asked = self._settle(request)
        key = ("dropped", request.uid)
        if not self._first(key, DROPPED, USER_WINDOW_S) and not parked:
            broker_log.debug("broker: %s (not recorded: another of this user's requests went away within a "
                             "minute)", why)
            return
        broker_log.warning("broker: %s", why)
        fields = dict(requester=request.record(), parked=[k.record() for k in parked], asked=asked,
                      times=self._take_count(key), why=why)
        self._room(DROPPED, request.uuid, request.slice, request.path, request.uid, fields)

    def _first(self, key, kind, window):
        """Whether *key* by rule *kind* is to be recorded now (the first time, or
        another rule, or *window* seconds after the last); counts the times."""
        now = time.monotonic()
        with self._lock:
            if len(self._repeats) > MAX_REMEMBERED:
                kept = {k: v for k, v in self._repeats.items() if now - v[1] < FORGET_AFTER_S}
                if len(kept) > MAX_REMEMBERED // 2:  # many new keys lately (new waits): the newest half stays
                    newest = sorted(kept.items(), key=lambda kv: kv[1][1])[-(MAX_REMEMBERED // 2):]
                    kept = dict(newest)
                self._repeats = kept
            seen = self._repeats.get(key)
            if seen is None or seen[2] != kind or (window is not None and now - seen[1] >= window):
                self._repeats[key] = [(seen[0] if seen else 0) + 1, now, kind]
                return True
            seen[0] += 1
            return False

    def _take_count(self, key):
        """The times counted for *key* since its last record (then 0 again)."""
        with self._lock:
            seen = self._repeats.get(key)
            count = seen[0] if seen else 1
            if seen:
                seen[0] = 0
            return count

    def _settle(self, request):
        """The asks of this wait not recorded yet (the wait is over: forgotten)."""
        with self._lock:
            seen = self._repeats.pop(("wait", request.pid, request.since_ns, request.uuid), None)
        return (seen[0] if seen else 0) + 1


def _common(gpu, now):
    return {"unix": now, "slice": gpu.slice, "uuid": gpu.uuid, "reported_bytes": gpu.reported_bytes,
            "limit_bytes": gpu.limit_bytes, "tolerance_bytes": gpu.tolerance_bytes}
