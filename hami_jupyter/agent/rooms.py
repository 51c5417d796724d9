"""The room loop: each request for room, and the headroom, in one pass of facts, plan, act and record.

A request the socket read (:mod:`.server`) goes through :meth:`Rooms.serve`:

1. **who asks** (:meth:`Rooms.admit`): the peer's PID (``SO_PEERCRED``) as
   the agent sees it, matched to its slot, its slice's limits and NVML use
   (:func:`.room.request.admit`); anything else is answered ``NO``;
2. **its turn**: queued on its GPU in the order its wait began
   (:mod:`.room.queue`), answered ``BUSY <n>`` when *n* are ahead. While any
   request waits on a GPU the room ledger says so (:mod:`.ledger`), and every
   preload library there takes its turn through this queue before taking
   memory beyond its slice's guarantee: room made for the first in line is
   not taken by the next one's resume;
3. **room**, one step at a time: the **facts** of the GPU (NVML's free bytes,
   what the ledger keeps: the reserve and others' grants; the kernels on it,
   only when room is short), the **plan** (:mod:`.room.plan`: grant, park
   this kernel, or refuse), the **act** (the actor parks, :mod:`.actor`), the
   **record** (:mod:`.records`); again until the room is there;
4. **the answer**: ``OK <made> <ticket>`` with the room granted in the ledger
   (kept for the requester while its connection stays open, at most
   :data:`LEASE_S`; its turn lasts as long, so that the next request finds
   that room taken, not counted twice), or ``NO <why>``.

The headroom keeper (:mod:`.headroom`) asks :meth:`Rooms.keep_free` for one
step toward its free bytes on a GPU; :meth:`Rooms.publish` writes the ledger
(the report's thread calls it every half second); :meth:`Rooms.view` is the
queues for the report. Those are the loop's whole interface.

Nothing is kept that a restart would lose: a requester whose connection
dropped asks again (with the same ``since``), the driver and the slices say
what is parked, and a new agent's ledger starts with no grants.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ..slice.layout import HAMI_PARK_PARKING, HAMI_PARK_RESUMING
from ..slice.parking import ParkError
from . import protocol
from .room import plan as room_plan
from .room.kernels import NOBODY, Requester, gather
from .room.queue import ENDED, EXPIRED, QueueFull, Queues
from .room.request import REQUEST_TIMEOUT_S, ForHeadroom, Request, admit

FREED_WAIT_S = 2.0  # after a park, how long NVML may take to show the memory free
LEASE_S = 60.0  # a grant is kept while its requester takes the room; a restore of 100 GiB takes tens of s
OKS_KEPT = 4096  # waits whose OKs are remembered; older than OKS_FORGET_S are forgotten beyond
OKS_FORGET_S = 600.0
ASKS_AGAIN_S = 2.0  # a wait answered NO asks again within a second: its kernel is not idle meanwhile
# A look this fresh serves a request's admission (the watch looks every 0.5 s):
# no connection makes the agent look at the node for it, but for a process
# that just took its slot (FRESH_LOOK_S).
ADMIT_LOOK_S = 1.0
FRESH_LOOK_S = 1.0  # a process without a slot in the latest look gets a fresh one at most this often
# A kernel whose park failed is not tried again for any request for this long:
# on an H100 every checkpoint failed once the GPU was full, and waiting requests,
# each asking again every second, had the agent retry the same failing parks
# 4,154 times in three minutes. A checkpoint the driver refused for want of
# device memory is tried again sooner: the reserve keeps room for it.
FAILED_PARK_RETRY_S = 30.0
FAILED_FOR_ROOM_RETRY_S = 3.0
FAILED_PARK_FORGET_S = 600.0
CUDA_ERROR_OUT_OF_MEMORY = 2
MOVING_HOLD_S = 2.0  # after a process's state was seen moving, calls refused as busy still wait this long
# A slice over its cap on the GPU (memory no limit allowed, a bypass) is the
# guard's to take back, within two of its looks and a park: a request waits
# for that, at most this long, before anyone within a cap is parked for it.
OVER_CAP_WAIT_S = 10.0
OVER_CAP_POLL_S = 0.5
TIGHT_MIN = 4 << 30  # a GPU with less than reserve + max(this, 10 % of it) free is tight

log = logging.getLogger("hami_jupyter.broker")


@dataclass
class GpuFacts:
    """One GPU as a step of the loop sees it: NVML's *free* bytes (None: unread,
    *error* says why) and what the ledger *kept* (the reserve and others' grants)."""

    free: int | None
    kept: int
    error: str = ""


class Rooms:
    """The room loop over the slices under *root*, acting through *actor*.

    *node*: the facts (:class:`~.facts.look.Node`); *records*: the audit
    writer; *min_idle*: seconds a kernel must be idle to be parked;
    *cannot_park*: why this driver cannot park processes (None: it can);
    *ledger*: the room ledger (:class:`~.ledger.Ledger`; None: none is kept);
    *reserve*: bytes kept free on each GPU for parks; *over_tolerance*: the
    guard's tolerance when it runs (None: no guard takes an excess back, and
    no request waits for it).
    """

    def __init__(self, root, node, actor, records, *, min_idle, cannot_park=None, ledger=None, reserve=0,
                 over_tolerance=None):
        self.root = root
        self.node, self.actor, self.records = node, actor, records
        self.min_idle = min_idle
        self.cannot_park = cannot_park
        self.ledger = ledger
        self.reserve = reserve
        self.over_tolerance = over_tolerance
        self.stop = threading.Event()
        self.changed = threading.Event()  # a queue changed: the report and the ledger are written sooner
        self.served = threading.Event()  # a request was answered: the headroom is looked at sooner
        self.started = time.time()
        self._gpu_locks = {}  # uuid -> held while a step parks on that GPU (a request's, or the headroom's)
        self._lock = threading.Lock()
        self.queues = Queues(self._expected)
        self._oks = {}  # (pid, since, uuid) -> [OKs answered to that wait, monotonic time of the last]
        self._heard = {}  # (pid, since) -> Unix time the agent first heard of that wait
        self._answered = {}  # pid -> (uuid, monotonic time it was last answered NO)
        self._failed_parks = {}  # (uuid, kernel key) -> (monotonic time its park last failed, error code)
        self._parked_bytes = {}  # (pid, start ticks) -> NVML bytes it held when the agent parked it
        self._fresh_looks = {}  # ("pid", pid) or ("uid", uid) -> monotonic time of its last fresh look
        self._moving = {}  # uuid -> Unix ns until which a process's state is taken to move there

    def _gpu_lock(self, uuid):
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
        found = self.node.process(pid, look.slices)
        if found is not None and found[1].slot is None and self._may_look(pid, uid):
            # A process that just took its slot (its first wait: for its first
            # context) is not in a look taken before, nor in one that read the
            # slices just before, however recently it ended: look again, once a while.
            look = self.node.look(within=0)
            found = self.node.process(pid, look.slices)
        now = time.time()
        with self._lock:  # heard of only once admitted: a stranger's lines fill nothing
            heard = self._heard.get((pid, room.since_ns), now)
        fields = admit(look, found, uid, user, room, heard, self.started, self.root)
        with self._lock:
            if len(self._heard) > OKS_KEPT:
                self._heard = {k: v for k, v in self._heard.items() if now - v < OKS_FORGET_S}
            self._heard.setdefault((pid, room.since_ns), heard)
        return Request(conn=conn, **fields)

    def _may_look(self, pid, uid):
        """Whether an admission for *pid* may take a fresh look of the node: once
        per :data:`FRESH_LOOK_S` per process, and four times a second per user: a
        look holds the node's lock, and a process without a slot asking in a loop
        must not hold the watch and everyone's requests up (another user's new
        process still gets its look)."""
        now = time.monotonic()
        with self._lock:
            if len(self._fresh_looks) > OKS_KEPT:
                self._fresh_looks = {k: t for k, t in self._fresh_looks.items() if now - t < FRESH_LOOK_S}
            if (now - self._fresh_looks.get(("pid", pid), 0.0) < FRESH_LOOK_S
                    or now - self._fresh_looks.get(("uid", uid), 0.0) < 0.25):
                return False
            self._fresh_looks[("pid", pid)] = self._fresh_looks[("uid", uid)] = now
        log.debug("broker: a fresh look for the admission of pid %d", pid)
        return True

    def serve(self, request):
        """Queue *request*, make room on its turn, answer it, and keep the room
        granted for it while it takes it."""
        try:
            ahead = self.queues.add(request)
        except QueueFull as e:
            self.records.refused_stranger(self.root, request.pid, request.uid, request.user, request.uuid,
                                          str(e), "queue-full")
            request.answer(protocol.no(str(e)))
            return
        ticket = None
        if self.ledger is not None:  # before any room is made for it: no resume takes that room
            self.ledger.someone_waits(request.uuid, ahead + 1)
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
            answer, ticket = self._turn(request)
            if answer is not None:
                request.answer(answer)
            if ticket is not None:
                # Its turn lasts until it took the room granted (it closes its end):
                # the next request's facts then show that room taken, never twice.
                request.wait_closed(LEASE_S, self.stop)
        finally:
            if ticket is not None:
                self.ledger.revoke(request.uuid, ticket)
            self.queues.done(request)
            self.changed.set()
            self.served.set()

    def _turn(self, request):
        """The requester's turn: ``(answer line, ticket)``; the answer is None when
        nothing is to be answered (it went away, the agent stops)."""
        lock = self._gpu_lock(request.uuid)
        while not lock.acquire(timeout=0.1):  # a headroom park under way finishes first
            if self.stop.is_set():
                return None, None
            if not request.alive():
                self.records.dropped(request, [])
                return None, None
        try:
            return self._make_room(request)
        finally:
            lock.release()

    def _make_room(self, request):
        requester = Requester(request.slice, request.kernel_id, request.pid)
        want = self._wanted(request)
        parked, made = [], 0
        tried = {}  # kernel key -> why it is not tried again for this request
        over_deadline = None  # when this request stops waiting for the guard (set once a slice is seen over)
        while True:
            if self.stop.is_set():
                return None, None
            if not request.alive():  # before each park, and before it is told OK
                self.records.dropped(request, parked)
                return None, None
            facts = self._facts(request.uuid)  # facts
            if facts.free is None:
                return self._no(request, facts.error, "nvml"), None
            if room_plan.room_there(facts.free, facts.kept, want):  # plan: the room is there
                return self._grant(request, want, made, facts, parked)
            if self.cannot_park:
                return self._no(request, f"this driver cannot park processes ({self.cannot_park})", "driver"), None
            look = self.node.look()
            if request.uuid not in look.reading.gpus:
                return self._no(request, "the agent cannot read the GPU's processes: "
                                f"{'; '.join(look.errors) or 'NVML lists no such GPU'}", "nvml"), None
            over = self._over_caps(look, request.uuid, request.slice)
            if over and over_deadline is None:
                over_deadline = time.monotonic() + OVER_CAP_WAIT_S
            if over and time.monotonic() < over_deadline:
                # The guard takes that excess back: parking a kernel within its
                # cap for this request would make another user pay for it.
                time.sleep(OVER_CAP_POLL_S)
                continue
            now = time.time()
            kernels = gather(look, request.uuid, self.node.activity, now,
                             self.asking(request.uuid) - {request.pid}, self.actor.acting())
            need = want - (facts.free - facts.kept)
            step = room_plan.choose(kernels, requester, need=need, min_idle=self.min_idle, now=now,
                                    left_out={**self._left_out(request.uuid, kernels), **tried})
            if isinstance(step, room_plan.Refuse):
                note = f"; {len(parked)} kernel(s) were parked for it already" if parked else ""
                why = f"{room_plan.short_of(request.uuid, facts.free, facts.kept, want)}; {step.why}{note}"
                return self._no(request, why, step.kind), None
            if not self._park(request, step.kernel, now, tried):  # act, and record
                continue
            parked.append(step.kernel)
            made += step.kernel.bytes
            request.expires = time.monotonic() + REQUEST_TIMEOUT_S  # room is being made: no time-out
            self._await_freed(request.uuid, facts.free)

    def _over_caps(self, look, uuid, but):
        """The slices (but the requester's *but*) holding more than their trusted
        cap plus the guard's tolerance on GPU *uuid*, by NVML: ``{name: excess}``."""
        if self.over_tolerance is None:
            return {}
        held = {}
        for p in look.on(uuid):
            seen = p.attribution.seen
            if seen is not None and seen.name != but and seen.limits_trusted:
                held[seen.name] = (seen, held.get(seen.name, (seen, 0))[1] + p.used_bytes)
        over = {}
        for name, (seen, nbytes) in held.items():
            limit = seen.limit_bytes(uuid)
            if limit and nbytes > limit + self.over_tolerance:
                over[name] = nbytes - limit
        return over

    def _facts(self, uuid):
        errors = []
        free = self.node.free(uuid, errors)
        kept = self.reserve + (self.ledger.granted(uuid) if self.ledger is not None else 0)
        error = f"the agent cannot read the GPU's free memory: {'; '.join(errors)}" if free is None else ""
        return GpuFacts(free, kept, error)

    def _grant(self, request, want, made, facts, parked):
        ticket = 0
        if self.ledger is not None:
            ticket = self.ledger.grant(request.uuid, request.pid, want, LEASE_S)
            if ticket is None:
                return self._no(request, f"GPU {request.uuid} has room, but the room ledger holds as many "
                                "grants as it can: ask again in a moment", "ledger-full"), None
        self.records.served(request, made, facts.free, parked)
        self._answered_ok(request)
        return protocol.ok(made, ticket), (ticket or None)

    def _wanted(self, request):
        with self._lock:
            seen = self._oks.get((request.pid, request.since_ns, request.uuid))
            parked = self._parked_bytes.get(request.pid, (None, 0))[1]
        return room_plan.wanted(request.bytes, seen[0] if seen else 0, request.room, parked)

    def _answered_ok(self, request):
        now = time.monotonic()
        with self._lock:
            if len(self._oks) > OKS_KEPT:
                self._oks = {k: v for k, v in self._oks.items() if now - v[1] < OKS_FORGET_S}
            seen = self._oks.setdefault((request.pid, request.since_ns, request.uuid), [0, now])
            seen[0] += 1
            seen[1] = now

    def _no(self, request, why, kind):
        with self._lock:
            self._answered[request.pid] = (request.uuid, time.monotonic())
            if len(self._answered) > OKS_KEPT:
                cut = time.monotonic() - ASKS_AGAIN_S
                self._answered = {p: v for p, v in self._answered.items() if v[1] > cut}
        self.records.refused(request, why, kind)
        return protocol.no(why)

    # ---- the act ---------------------------------------------------------------------

    def _park(self, requester, kernel, now, tried):
        """Have the actor park *kernel* for *requester* (a request, or the headroom);
        recorded either way. True when it was parked; else it joins *tried*."""
        self._moving[requester.uuid] = time.time_ns() + int(MOVING_HOLD_S * 1e9)
        self.changed.set()  # the ledger says a state moves here: calls refused as busy wait
        try:
            result = self.actor.park_kernel(kernel, record={"unix": time.time(), "action": "park", "for": "room",
                                                            "uuid": requester.uuid,
                                                            "requester": requester.record()})
        except ParkError as e:
            tried[room_plan.key(kernel)] = "park(s) failed"
            with self._lock:
                self._failed_parks[(requester.uuid, room_plan.key(kernel))] = (time.monotonic(), e.code)
            self.records.park_failed(requester, kernel, e)
            return False
        finally:
            self._moving[requester.uuid] = time.time_ns() + int(MOVING_HOLD_S * 1e9)
        with self._lock:
            for pid, ticks in kernel.processes:
                self._parked_bytes[pid] = (ticks, dict(kernel.bytes_of).get(pid, 0))
        self.records.park(requester, kernel, result, kernel.idle_s(now))
        self.changed.set()
        return True

    def _left_out(self, uuid, kernels, retry_s=FAILED_PARK_RETRY_S):
        """``{kernel key: why}`` of the kernels on *uuid* whose park failed lately:
        not tried again before *retry_s* (sooner, when the driver had no device
        memory for the checkpoint)."""
        now = time.monotonic()
        out = {}
        with self._lock:
            self._failed_parks = {k: v for k, v in self._failed_parks.items() if now - v[0] < FAILED_PARK_FORGET_S}
            for k in kernels:
                failed = self._failed_parks.get((uuid, room_plan.key(k)))
                if failed is None:
                    continue
                wait = FAILED_FOR_ROOM_RETRY_S if failed[1] == CUDA_ERROR_OUT_OF_MEMORY else retry_s
                if now - failed[0] < wait:
                    out[room_plan.key(k)] = f"whose park failed in the last {wait:.0f} s not tried again yet"
        return out

    def _await_freed(self, uuid, before):
        """After a park: until NVML shows the memory free (or :data:`FREED_WAIT_S`),
        so that a late figure does not make the agent park one kernel too many."""
        deadline = time.monotonic() + FREED_WAIT_S
        while time.monotonic() < deadline:
            free = self.node.free(uuid, [])
            if free is None or free > before:
                return
            time.sleep(0.05)

    # ---- the headroom's step -----------------------------------------------------------------

    def keep_free(self, uuid, target, failed_retry_s):
        """One step toward *target* free bytes on GPU *uuid*, for the headroom:
        ``("kept", free, None)``, ``("parked", free, what)`` (measure again),
        ``("waits", free, why)`` (a request comes first, or a park is under way:
        looked at again later) or ``("short", free, why)`` (nothing may be parked)."""
        facts = self._facts(uuid)
        if facts.free is None:
            return "short", None, facts.error
        available = facts.free - (self.ledger.granted(uuid) if self.ledger is not None else 0)
        if available >= target:
            return "kept", facts.free, None
        if self.queues.busy(uuid) or self.asking(uuid):
            return "waits", facts.free, "a request for room is served on this GPU first"
        if self.cannot_park:
            return "short", facts.free, f"this driver cannot park processes ({self.cannot_park})"
        lock = self._gpu_lock(uuid)
        if not lock.acquire(blocking=False):
            return "waits", facts.free, "a request for room is served on this GPU first"
        try:
            if self.queues.busy(uuid):  # asked while the lock was taken
                return "waits", facts.free, "a request for room is served on this GPU first"
            look = self.node.look()
            if uuid not in look.reading.gpus:
                return "short", facts.free, f"the agent cannot read the GPU's processes: {'; '.join(look.errors)}"
            now = time.time()
            kernels = gather(look, uuid, self.node.activity, now, acting=self.actor.acting())
            if any(k.state == "parking" for k in kernels):
                return "waits", facts.free, "a park is under way on this GPU: measured again when it is done"
            step = room_plan.choose(kernels, NOBODY, need=target - available, min_idle=self.min_idle, now=now,
                                    left_out=self._left_out(uuid, kernels, failed_retry_s))
            if isinstance(step, room_plan.Refuse):
                return "short", facts.free, f"{room_plan.headroom_short(available, target)}; {step.why}"
            if self._park(ForHeadroom(uuid, target, facts.free), step.kernel, now, {}):
                self._await_freed(uuid, facts.free)
            return "parked", facts.free, f"parking {step.kernel.label} of slice {step.kernel.slice} for the headroom"
        finally:
            lock.release()

    # ---- the ledger and the report -------------------------------------------------------------

    def publish(self):
        """Write the room ledger from the latest look: per GPU the reserve, NVML's
        free bytes, whether it is tight, who waits, whether a state moves there."""
        if self.ledger is None:
            return
        look = self.node.look(within=0.5)
        waiting = {uuid: len(line) for uuid, line in self.queues.view().items()}
        acting = self.actor.acting()
        now_ns = time.time_ns()
        hold = int(MOVING_HOLD_S * 1e9)
        for uuid in sorted(set(look.reading.gpus) | set(waiting)):
            for p in look.on(uuid):
                slot = p.attribution.slot
                moving = p.facts.pid in acting or (slot is not None and slot.park_state in (HAMI_PARK_PARKING,
                                                                                          HAMI_PARK_RESUMING))
                if moving:
                    self._moving[uuid] = now_ns + hold
            total, free = self.node.memory(uuid, []) or (0, None)
            margin = max(TIGHT_MIN, total // 10)
            n = waiting.get(uuid, 0)
            tight = free is None or free < self.reserve + margin or n > 0 or self.ledger.granted(uuid) > 0
            self.ledger.publish(uuid, reserve=self.reserve, free=free, waiting=n, turns=tight,
                                moving_until_ns=self._moving.get(uuid, 0), now_ns=now_ns)
        self.ledger.heartbeat(now_ns)

    def view(self):
        """``{uuid: [queue entry, ...]}`` for the report, each with the grants in force."""
        out = {}
        for uuid, line in self.queues.view().items():
            out[uuid] = [dict(r.record(), serving=self.queues.serving(r)) for r in line]
        return out

    def granted_view(self):
        """``{uuid: [{"pid", "bytes"}]}``: the room kept for requesters now."""
        if self.ledger is None:
            return {}
        return {uuid: [{"pid": pid, "bytes": b} for pid, b in self.ledger.grants(uuid)]
                for uuid in self.node.look(within=1.0).reading.gpus if self.ledger.grants(uuid)}


def _expired(request):
    return (f"not served within {request.expires - request.arrived:.0f} s of this request (others were "
            "served first); ask again (the wait keeps its place)")
