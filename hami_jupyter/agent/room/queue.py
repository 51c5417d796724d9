"""Who waits for room on which GPU, and whose turn it is.

Each GPU serves one request at a time (parking for two at once would park
for both what one of them needed), the oldest wait first: requests are
ordered by the ``since`` their process gave, the time its wait began, which
it keeps when it asks again. So a wait that began first is served first,
even when its process had to ask again after an agent restart; two waits
that began at the same nanosecond go in the order they came. GPUs are served
side by side.

A restarted agent also knows the waits that have not asked it yet: each
waiting process's slot says since when it waits (``room_wait_since_unix_ns``).
For :data:`REASK_GRACE_S` after the start, a request waits for an older wait
of its GPU that its process is about to ask again (*expected*), so that the
order of before the restart holds. That is a slot's word, so it is believed
for those few seconds only.

No user holds the queue: each has at most :data:`MAX_QUEUED_PER_USER`
requests queued or served at once (more are answered ``NO`` at once), and a
request that waited past its time-out (:attr:`~.request.Request.expires`)
leaves the queue, answered ``NO`` (its process asks again, and keeps its
place by its *since*).
"""

from __future__ import annotations

import itertools
import threading
import time

REASK_GRACE_S = 3.0  # how long after its start the agent waits for older waits to ask again
POLL_S = 0.1  # how often a waiting request looks whether its process is still there
MAX_QUEUED_PER_USER = 8  # a user's requests queued or served at once, on every GPU together
ENDED, GONE, EXPIRED = "turn", "gone", "expired"


class QueueFull(Exception):
    """The requester's user has :data:`MAX_QUEUED_PER_USER` requests in the queues already."""


class Queues:
    """The waiting requests of every GPU. *expected(uuid, since_ns)*: whether
    an older wait of that GPU, not asked yet, is expected to ask (see above)."""

    def __init__(self, expected=lambda uuid, since_ns: False):
        self._cond = threading.Condition()
        self._waiting = {}  # uuid -> [request], in turn order
        self._serving = {}  # uuid -> the request served now
        self._seq = itertools.count()
        self._expected = expected
        self.started = time.monotonic()

    @staticmethod
    def _order(request):
        return (request.since_ns, request.seq)

    def add(self, request):
        """Queue *request*; returns how many requests are ahead of it (the one
        served now included): 0 when it may be served at once. QueueFull when
        its user has too many queued already."""
        with self._cond:
            mine = sum(r.uid == request.uid for line in self._waiting.values() for r in line)
            mine += sum(r.uid == request.uid for r in self._serving.values())
            if mine >= MAX_QUEUED_PER_USER:
                raise QueueFull(f"user {request.user or request.uid} has {mine} requests for room waiting "
                                "already: ask again when one is answered")
            request.seq = next(self._seq)
            line = self._waiting.setdefault(request.uuid, [])
            line.append(request)
            line.sort(key=self._order)
            # A served request whose requester has closed its end is over but for
            # its bookkeeping (it took the room granted): not ahead of anyone.
            serving = self._serving.get(request.uuid)
            return line.index(request) + (serving is not None and serving.alive())

    def _turn(self, request):
        line = self._waiting.get(request.uuid) or []
        if request.uuid in self._serving or not line or line[0] is not request:
            return False
        if time.monotonic() - self.started < REASK_GRACE_S and self._expected(request.uuid, request.since_ns):
            return False
        return True

    def wait_turn(self, request, stop):
        """Until it is *request*'s turn (:data:`ENDED`: it is now being served) or
        it must not be served any more (:data:`GONE`: its process went away, or
        the agent stops; :data:`EXPIRED`: it waited past its time-out); a request
        not given its turn is out of the queue."""
        outcome = GONE
        with self._cond:
            while not stop.is_set():
                if not request.alive():
                    break
                if request.expired():
                    outcome = EXPIRED
                    break
                if self._turn(request):
                    self._waiting[request.uuid].remove(request)
                    self._serving[request.uuid] = request
                    return ENDED
                self._cond.wait(POLL_S)
            self._waiting[request.uuid].remove(request)
            self._cond.notify_all()
            return outcome

    def done(self, request):
        """*request* was answered (or given up): the next one's turn."""
        with self._cond:
            if self._serving.get(request.uuid) is request:
                del self._serving[request.uuid]
            self._cond.notify_all()

    def wake(self):
        with self._cond:
            self._cond.notify_all()

    def view(self):
        """``{uuid: [request, ...]}``: the one served now first, then the others in turn order."""
        with self._cond:
            out = {}
            for uuid in sorted(set(self._waiting) | set(self._serving)):
                served = [self._serving[uuid]] if uuid in self._serving else []
                if served or self._waiting.get(uuid):
                    out[uuid] = served + list(self._waiting.get(uuid) or [])
            return out

    def serving(self, request):
        with self._cond:
            return self._serving.get(request.uuid) is request

    def busy(self, uuid):
        """Whether a request waits for room on GPU *uuid*, or is being served
        there (the headroom keeper then leaves that GPU alone)."""
        with self._cond:
            return uuid in self._serving or bool(self._waiting.get(uuid))
