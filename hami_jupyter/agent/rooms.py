"""Room at work: one request for room, from its checked peer to its answer, in one pass.

:meth:`Rooms.serve` takes a request the socket read (:mod:`.server`) through
facts, plan, act and record:

1. **who asks** (:meth:`Rooms.admit`): the peer's PID (``SO_PEERCRED``) as the
   agent sees it, matched to its slot, its slice's limits and NVML use
   (:func:`.room.request.admit`); anything else is answered ``NO``;
2. **its turn**: queued on its GPU (:mod:`.room.queue`), answered ``BUSY <n>``
   at once when *n* requests are ahead of it; its user's other requests
   count against a bound, and it expires after its time-out;
3. **room** (:meth:`Rooms.make_room`): while NVML's free bytes on the GPU are
   short of what it needs, look at the node, find the kernels that may be
   parked (:mod:`.room.kernels`), have the actor park the idlest
   (:mod:`.actor`), record it (:mod:`.records`), and measure again. Before each
   park the requester must still be connected. When the kernels that may be
   parked cannot cover what is missing, nothing is parked: ``NO`` with the
   reason. One park at a time per GPU: the headroom keeper (:mod:`.headroom`)
   takes the same per-GPU lock, and the actor never works on one process for
   two policies at once;
4. **the answer**: ``OK <bytes made free>`` or ``NO <why>``, recorded.

What a request needs is its bytes, and 256 MiB more for each ``OK`` its wait
was answered already (NVML's free figure is not all a driver call can take),
never more than its slice's limit less its use allows plus one such step:
asking again and again parks nothing more than the slice may hold.

Nothing is kept that a restart would lose: a requester whose connection
dropped asks again (with the same ``since``), and the driver and the slices
say what is parked.
"""

from __future__ import annotations

import logging
import threading
import time

from ..slice.parking import ParkError
from ..slice.size import format_size
from . import protocol
from .room.kernels import Requester, gather, judge, plan, why_none
from .room.queue import ENDED, EXPIRED, QueueFull, Queues
from .room.request import Request, admit

FREED_WAIT_S = 2.0  # after a park, how long NVML may take to show the memory free
STEP = 256 << 20  # more room asked of the GPU each time one wait comes back after an OK
OKS_KEPT = 4096  # waits whose OKs are remembered; older than OKS_FORGET_S are forgotten beyond
OKS_FORGET_S = 600.0
ASKS_AGAIN_S = 2.0  # a wait answered NO asks again within a second: its kernel is not idle meanwhile
ADMIT_LOOK_S = 0.25  # a look this fresh serves a request's admission (no look per connection)
# A kernel whose park failed is not tried again for any request for this long:
# on an H100 every checkpoint failed once the GPU was full, and waiting requests,
# each asking again every second, had the agent retry the same failing parks
# 4,154 times in three minutes.
FAILED_PARK_RETRY_S = 30.0
FAILED_PARK_FORGET_S = 600.0  # a failure is remembered this long (the headroom waits longer, 300 s)

log = logging.getLogger("hami_jupyter.broker")


class Rooms:
    """The room policy over the slices under *root*, acting through *actor*.

    *node*: the facts (:class:`~.facts.look.Node`); *records*: the audit
    writer; *min_idle*: seconds a kernel must be idle to be parked;
    *cannot_park*: why this driver cannot park processes (None: it can).
    """

    def __init__(self, root, node, actor, records, *, min_idle, cannot_park=None):
        self.root = root
        self.node, self.actor, self.records = node, actor, records
        self.min_idle = min_idle
        self.cannot_park = cannot_park
        self.stop = threading.Event()
        self.changed = threading.Event()  # a queue changed: the report is written sooner
        self.served = threading.Event()  # a request was answered: the headroom is looked at sooner
        self.keeper = None  # the headroom keeper (:mod:`.headroom`), when --headroom is set
        self.started = time.time()
        self._gpu_locks = {}  # uuid -> held while parking on that GPU (a request's, or the headroom's)
        self._lock = threading.Lock()
        self.queues = Queues(self._expected)
        self._oks = {}  # (pid, since, uuid) -> [OKs answered to that wait, monotonic time of the last]
        self._heard = {}  # (pid, since) -> Unix time the agent first heard of that wait
        self._answered = {}  # pid -> (uuid, monotonic time it was last answered NO)
        self._failed_parks = {}  # (uuid, kernel key) -> monotonic time its park last failed

    def gpu_lock(self, uuid):
        """The lock held while kernels are chosen and parked on GPU *uuid*."""
        with self._lock:
            return self._gpu_locks.setdefault(uuid, threading.Lock())

    # ---- who waits -----------------------------------------------------------------

    def asking(self, uuid=None):
        """Host PIDs that ask the agent for room (on GPU *uuid*, or any): queued,
        served, or answered NO a moment ago (they ask again within a second)."""
        now = time.monotonic()
        with self._lock:
            pids = {pid for pid, (on, when) in self._answered.items()
                    if now - when < ASKS_AGAIN_S and (uuid is None or on == uuid)}
        for on, line in self.queues.view().items():
            if uuid is None or on == uuid:
                pids |= {r.pid for r in line}
        return pids

    def _expected(self, uuid, since_ns):
        """Whether a process of a slice waits for room on *uuid* since before
        *since_ns* and has not asked yet (right after a restart, it is about to).
        A slot's word, believed only in the queue's first seconds."""
        waiting = {(r.slice, r.pid) for line in self.queues.view().values() for r in line}
        for name, seen in self.node.look(within=ADMIT_LOOK_S).slices.readable.items():
            device = seen.device(uuid)
            if device is None:
                continue
            for s in seen.snapshot.slots:
                if (s.room_wait_since_unix_ns and s.room_wait_since_unix_ns < since_ns
                        and s.room_wait_device == device.index and (name, s.pid) not in waiting):
                    return True
        return False

    # ---- one request ---------------------------------------------------------------

    def admit(self, conn, pid, uid, user, room):
        """The :class:`~.room.request.Request` of peer *pid* for *room*; Refused."""
        look = self.node.look(within=ADMIT_LOOK_S)
        now = time.time()
        with self._lock:
            if len(self._heard) > OKS_KEPT:
                self._heard = {k: v for k, v in self._heard.items() if now - v < OKS_FORGET_S}
            heard = self._heard.setdefault((pid, room.since_ns), now)
        found = self.node.process(pid, look.slices)
        if found is not None and found[1].slot is None and time.time() - look.unix > 0.01:
            # A process that just took its slot (its first wait: for its first
            # context) is not in a look taken before: look again, once.
            look = self.node.look(within=0)
            found = self.node.process(pid, look.slices)
        fields = admit(look, found, uid, user, room, heard, self.started, self.root)
        return Request(conn=conn, **fields)

    def serve(self, request):
        """Queue *request*, make room on its turn, answer it."""
        try:
            ahead = self.queues.add(request)
        except QueueFull as e:
            self.records.refused_stranger(self.root, request.pid, request.uid, request.user, request.uuid,
                                          str(e), "queue-full")
            request.answer(protocol.no(str(e)))
            return
        self.changed.set()
        try:
            if ahead:
                request.answer(protocol.busy(ahead))  # a requester gone already: the queue sees it
            outcome = self.queues.wait_turn(request, self.stop)
            if outcome == EXPIRED:
                request.answer(self._no(request, _expired(request), "expired"))
                return
            if outcome != ENDED:
                if not self.stop.is_set():
                    self.records.dropped(request, [])
                return
            self.changed.set()
            answer = self.make_room(request)
            if answer is not None:
                request.answer(answer)
        finally:
            self.queues.done(request)
            self.changed.set()
            self.served.set()

    def _wanted(self, request):
        """The free bytes that serve *request*: its bytes and :data:`STEP` more
        for each OK its wait was answered already, never more than its slice's
        room (limit less use) allows plus one step."""
        with self._lock:
            seen = self._oks.get((request.pid, request.since_ns, request.uuid))
        wanted = request.bytes + (seen[0] if seen else 0) * STEP
        return wanted if request.room is None else min(wanted, max(request.bytes, request.room) + STEP)

    def _answered_ok(self, request):
        now = time.monotonic()
        with self._lock:
            if len(self._oks) > OKS_KEPT:
                self._oks = {k: v for k, v in self._oks.items() if now - v[1] < OKS_FORGET_S}
            seen = self._oks.setdefault((request.pid, request.since_ns, request.uuid), [0, now])
            seen[0] += 1
            seen[1] = now

    def make_room(self, request):
        """Park for *request* until its GPU has the room; the answer line, or None
        when nothing is to be answered (the requester went away, the agent stops).
        A headroom park under way on the GPU finishes first (its room serves this
        request too); the keeper parks nothing more while a request waits or is
        served (:meth:`~.room.queue.Queues.busy`)."""
        lock = self.gpu_lock(request.uuid)
        while not lock.acquire(timeout=0.1):
            if self.stop.is_set():
                return None
            if not request.alive():
                self.records.dropped(request, [])
                return None
        try:
            return self._make_room(request)
        finally:
            lock.release()

    def _make_room(self, request):
        requester = Requester(request.slice, request.kernel_id, request.pid)
        wanted = self._wanted(request)
        parked, failed, made = [], set(), 0
        while True:
            if self.stop.is_set():
                return None
            if not request.alive():  # before each park, and before it is told OK
                self.records.dropped(request, parked)
                return None
            if request.expired():
                return self._no(request, _expired(request), "expired")
            errors = []
            free = self.node.free(request.uuid, errors)
            if free is None:
                return self._no(request, f"the agent cannot read the GPU's free memory: {'; '.join(errors)}",
                                "nvml")
            if free >= wanted:
                self.records.served(request, made, free, parked)
                self._answered_ok(request)
                return protocol.ok(made)
            if self.cannot_park:
                return self._no(request, f"this driver cannot park processes ({self.cannot_park})", "driver")
            look = self.node.look()
            if request.uuid not in look.reading.gpus:
                return self._no(request, "the agent cannot read the GPU's processes: "
                                f"{'; '.join(look.errors) or 'NVML lists no such GPU'}", "nvml")
            now = time.time()
            kernels = gather(look, request.uuid, self.node.activity, now, self.asking(request.uuid) - {request.pid},
                             self.actor.acting(), self.node.driver_state)
            eligible, skipped = judge(kernels, requester, self.min_idle, now)
            eligible = [k for k in eligible if _key(k) not in failed]
            lately = [k for k in eligible if self.failed_lately(request.uuid, k)]
            eligible = [k for k in eligible if k not in lately]
            need = wanted - free
            chosen = plan(eligible, need)
            if not chosen:
                return self._no(request, _nothing_to_park(need, free, wanted, request.uuid, eligible, skipped,
                                                          failed, parked, lately), "nothing-to-park")
            kernel = chosen[0]
            if not self.park(request, kernel, now, failed):
                continue
            parked.append(kernel)
            made += kernel.bytes
            self.await_freed(request.uuid, free)

    def park(self, requester, kernel, now, failed):
        """Have the actor park *kernel* for *requester* (a request, or the headroom);
        recorded either way. True when it was parked; else its key joins *failed*."""
        try:
            result = self.actor.park_kernel(kernel, record={"unix": time.time(), "action": "park", "for": "room",
                                                            "uuid": requester.uuid,
                                                            "requester": requester.record()})
        except ParkError as e:
            failed.add(_key(kernel))
            with self._lock:
                self._failed_parks[(requester.uuid, _key(kernel))] = time.monotonic()
            self.records.park_failed(requester, kernel, e)
            return False
        self.records.park(requester, kernel, result, kernel.idle_s(now))
        self.changed.set()
        return True

    def failed_lately(self, uuid, kernel, within=FAILED_PARK_RETRY_S):
        """Whether *kernel*'s park on GPU *uuid* (for a request or the headroom)
        failed less than *within* seconds ago: it is not tried again before."""
        now = time.monotonic()
        with self._lock:
            self._failed_parks = {k: t for k, t in self._failed_parks.items() if now - t < FAILED_PARK_FORGET_S}
            failed = self._failed_parks.get((uuid, _key(kernel)))
        return failed is not None and now - failed < within

    def await_freed(self, uuid, before):
        """After a park: until NVML shows the memory free (or :data:`FREED_WAIT_S`),
        so that a late figure does not make the agent park one kernel too many."""
        deadline = time.monotonic() + FREED_WAIT_S
        while time.monotonic() < deadline:
            free = self.node.free(uuid, [])
            if free is None or free > before:
                return
            time.sleep(0.05)

    def _no(self, request, why, kind):
        with self._lock:
            self._answered[request.pid] = (request.uuid, time.monotonic())
            if len(self._answered) > OKS_KEPT:
                cut = time.monotonic() - ASKS_AGAIN_S
                self._answered = {p: v for p, v in self._answered.items() if v[1] > cut}
        self.records.refused(request, why, kind)
        return protocol.no(why)

    # ---- the report ------------------------------------------------------------------------

    def queue_view(self):
        """``{uuid: [queue entry, ...]}`` for the report."""
        out = {}
        for uuid, line in self.queues.view().items():
            out[uuid] = [dict(r.record(), serving=self.queues.serving(r)) for r in line]
        return out


def _key(kernel):
    return (kernel.slice, kernel.kernel_id, kernel.pids)


def _expired(request):
    return (f"no room was made within {request.expires - request.arrived:.0f} s of this request; "
            "ask again (the wait keeps its place)")


def _nothing_to_park(need, free, wanted, uuid, eligible, skipped, failed, parked, lately=()):
    """Why no more room can be made, in one line."""
    note = f" ({len(failed)} park(s) failed)" if failed else ""
    if lately:
        note += (f" ({len(lately)} whose park failed in the last {FAILED_PARK_RETRY_S:.0f} s not tried "
                 "again yet)")
    if parked:
        note += f"; {len(parked)} kernel(s) were parked for it already"
    return (f"GPU {uuid} has {format_size(free)} free, {format_size(need)} short of the "
            f"{format_size(wanted)} needed; " + why_none(eligible, skipped, note))

