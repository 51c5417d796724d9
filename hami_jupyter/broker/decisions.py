"""Every decision of the broker: a log line, an audit record, and the report's latest.

The broker parks other users' kernels; each of them will ask "who parked my
kernel, and for whom?". So every decision goes to the audit log the guard and
the administrators' changes go to (:mod:`hami_jupyter.audit`, hash-chained),
with who it was for (the requester's slice, PID, user and kernel, as the
kernel reported its socket's peer) beside what was done:

- ``broker-park``: a kernel parked to make room (its slice, kernel, user,
  bytes, how long it had been idle);
- ``broker-park-failed``: a park that failed, and why (the broker goes on
  with the next kernel);
- ``broker-served``: ``OK`` answered (the bytes made free, the kernels parked);
- ``broker-refused``: ``NO`` answered, and why;
- ``broker-dropped``: the requester went away before it was served; nothing
  more is parked for it.

A park for the headroom (``--headroom``, :mod:`.headroom`) is a
``broker-park`` (or ``broker-park-failed``) like any other, but no user asked
for it: its ``requester`` is ``{"for": "headroom", "headroom_bytes": ...,
"free_bytes": ...}`` (slice, pid and user None), its ``uid`` the broker's own.

A refusal repeated for the same wait (the library asks again until its
deadline) is recorded once, and the next record of that wait says how many
times it was asked; refusals of requests that are no requests (a process
without a slot, a malformed line), which any local user can send, are
recorded at most once a minute per user and reason. Both keep one user from
filling the log.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from .. import audit
from ..slice.broker_report import MAX_DECISIONS
from ..slice.size import format_size as _size

BROKER_WHO = "hami-jupyter broker"
PARK, PARK_FAILED, SERVED, REFUSED, DROPPED = "park", "park-failed", "served", "refused", "dropped"
STRANGER_WINDOW_S = 60.0
MAX_REMEMBERED = 4096  # refusals remembered for the count; older than FORGET_AFTER_S are forgotten beyond
FORGET_AFTER_S = 3600.0

log = logging.getLogger("hami_jupyter.broker")


class Decisions:
    """Writes decisions to the audit log at *audit_path* (None: none, for tests of
    the choice alone) and keeps the latest per GPU for the report."""

    def __init__(self, audit_path):
        self.audit_path = audit_path
        self._lock = threading.Lock()
        self._latest = collections.defaultdict(lambda: collections.deque(maxlen=MAX_DECISIONS))
        self._repeats = {}  # key -> [asks since the last record, monotonic time of the last record, rule]
        self.errors = collections.deque(maxlen=10)  # audit writes that failed, for the report

    def latest(self):
        """``{uuid: [decision, ...]}``, oldest first."""
        with self._lock:
            return {uuid: list(d) for uuid, d in self._latest.items()}

    def _audit(self, action, uuid, slice_name, path, uid, fields):
        if self.audit_path is None:
            return
        record = audit.make_record(slice_name, str(path), None, uuid, None, None, who=BROKER_WHO,
                                   uid=uid, action=f"broker-{action}", **fields)
        failed = audit.append_or_say(self.audit_path, record)
        if failed:
            message = f"the audit record of a broker {action} {failed}"
            log.error("broker: %s", message)
            self.errors.append(message)

    def _keep(self, action, uuid, entry):
        with self._lock:
            self._latest[uuid].append(dict(entry, action=action, unix=time.time()))

    def park(self, request, kernel, result, idle_s):
        why = (f"to make room for {request.who()}: {kernel.label} of slice {kernel.slice} "
               f"(user {kernel.user or '?'}) idle for {idle_s:.0f} s, its slice holding "
               f"{_size(kernel.held)} above its {_size(kernel.guarantee)} guarantee")
        log.warning("broker: PARK %s: %s moved to host memory in %.1f s, %s", kernel.label,
                    _size(result.bytes), result.seconds, why)
        fields = dict(kernel.record(), requester=request.record(), park_bytes=result.bytes,
                      park_seconds=round(result.seconds, 3), idle_seconds=round(idle_s, 1),
                      slice_bytes=kernel.held, guarantee_bytes=kernel.guarantee, why=why)
        self._audit(PARK, request.uuid, kernel.slice, kernel.path, request.uid, fields)
        self._keep(PARK, request.uuid, fields)

    def park_failed(self, request, kernel, error):
        why = f"park of {kernel.label} (slice {kernel.slice}) failed: {error}; trying the next"
        log.error("broker: %s", why)
        fields = dict(kernel.record(), requester=request.record(), error=str(error), why=why)
        self._audit(PARK_FAILED, request.uuid, kernel.slice, kernel.path, request.uid, fields)
        self._keep(PARK_FAILED, request.uuid, fields)

    def served(self, request, made, free, parked):
        why = (f"{_size(made)} made free by parking {len(parked)} kernel(s)" if parked else
               "the GPU had the room already")
        log.info("broker: OK to %s: %s (%s free)", request.who(), why, _size(free))
        fields = dict(requester=request.record(), made_bytes=made, free_bytes=free,
                      parked=[k.record() for k in parked], asked=self._settle(request), why=why)
        self._audit(SERVED, request.uuid, request.slice, request.path, request.uid, fields)
        self._keep(SERVED, request.uuid, fields)

    def refused(self, request, why, kind):
        """``NO`` to a request from a process with a slot; *kind*: the rule that
        refused it (a wait refused again by the same rule is not recorded again)."""
        key = ("wait", request.pid, request.since_ns, request.uuid)
        if not self._first(key, kind, None):
            log.debug("broker: NO again to %s: %s", request.who(), why)
            return
        log.info("broker: NO to %s: %s", request.who(), why)
        fields = dict(requester=request.record(), asked=self._repeats[key][0], why=why)
        self._repeats[key][0] = 0
        self._audit(REFUSED, request.uuid, request.slice, request.path, request.uid, fields)
        self._keep(REFUSED, request.uuid, fields)

    def refused_stranger(self, root, pid, uid, user, uuid, why, kind):
        """``NO`` to a request that is no request of a slice's process; *kind*: the rule."""
        key = ("stranger", uid, kind)
        if not self._first(key, kind, STRANGER_WINDOW_S):
            return
        log.warning("broker: NO to pid %s (user %s): %s", pid, user or uid, why)
        fields = {"requester": {"pid": pid, "user": user}, "why": why,
                  "asked": self._repeats[key][0]}
        self._repeats[key][0] = 0
        self._audit(REFUSED, uuid, None, root, uid, fields)
        if uuid:
            self._keep(REFUSED, uuid, fields)

    def dropped(self, request, parked):
        why = (f"{request.who()} went away before it was served; nothing more is parked for it"
               + (f" ({len(parked)} kernel(s) were parked for it already)" if parked else ""))
        log.warning("broker: %s", why)
        fields = dict(requester=request.record(), parked=[k.record() for k in parked], asked=self._settle(request),
                      why=why)
        self._audit(DROPPED, request.uuid, request.slice, request.path, request.uid, fields)
        self._keep(DROPPED, request.uuid, fields)

    def _first(self, key, kind, window):
        """Whether *key* refused by rule *kind* is to be recorded now (the first
        time, or another rule, or *window* seconds after the last); counts the asks."""
        now = time.monotonic()
        with self._lock:
            if len(self._repeats) > MAX_REMEMBERED:
                self._repeats = {k: v for k, v in self._repeats.items() if now - v[1] < FORGET_AFTER_S}
            seen = self._repeats.get(key)
            if seen is None or seen[2] != kind or (window is not None and now - seen[1] >= window):
                self._repeats[key] = [(seen[0] if seen else 0) + 1, now, kind]
                return True
            seen[0] += 1
            return False

    def _settle(self, request):
        """The asks of this wait not recorded yet (the wait is over: forgotten)."""
        with self._lock:
            seen = self._repeats.pop(("wait", request.pid, request.since_ns, request.uuid), None)
        return (seen[0] if seen else 0) + 1
