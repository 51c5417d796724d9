"""The broker at work: check who asks, queue the request, make room, answer.

Each connection is served by a thread of its own (:meth:`Broker.handle`):

1. read the one request line (at most :data:`READ_TIMEOUT_S`);
2. check who asks (:meth:`Broker.check`): the peer's PID (SO_PEERCRED) must
   hold a live slot in a slice under the root, as the slice file's owner, and
   that slice's charge on the GPU must be within its limit (the library
   reserved the bytes under the limit before the driver refused them; a slice
   over its limit gets no room made for it). Anything else is answered ``NO``;
3. queue it on its GPU (:mod:`.queue`), answering ``BUSY <n>`` at once when
   *n* requests are ahead of it;
4. on its turn, make room (:meth:`Broker.make_room`): while NVML's free
   bytes on the GPU are short of the request, park the idlest kernel that may
   be parked (:mod:`.kernels`), one at a time, measuring again after each;
   a park that fails is said and audited, and the next kernel is tried;
   before each park, the requester must still be connected. When the kernels
   that may be parked cannot cover what is missing, nothing is parked: ``NO``
   with the reason. A park already under way on that GPU (the broker's before
   a restart, or a Jupyter server's) is room on its way: it is waited for
   (at most :data:`SETTLE_S`) before more is parked. A headroom park under
   way on that GPU (:mod:`.headroom`) is waited for first, and its room
   counts: one park at a time per GPU, so the two never pick the same kernel;
5. answer ``OK <bytes made free>`` or ``NO <why>``, and close.

Nothing is kept that a restart would lose: a requester whose connection
dropped asks again (with the same ``since``), and the slices say what is
parked and who waits.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from ..guard.attribution import Attributor
from ..guard.procs import pid_namespace, read_facts, user_name
from ..guard.slices import SliceFiles
from ..slice.parking import ParkError
from ..slice.size import format_size
from . import protocol
from .decisions import Decisions
from .kernels import Requester, coverable, gather, judge, plan, why_none
from .queue import Queues
from .request import Request

READ_TIMEOUT_S = 5.0  # a client writes its line at once; one that does not is no client
SETTLE_S = 20.0  # longest wait for a park under way (hami-park's lock waits up to 10 s)
FREED_WAIT_S = 2.0  # after a park, how long NVML may take to show the memory free
HEADROOM = 256 << 20  # more room asked of the GPU each time one wait comes back after an OK
OKS_KEPT = 4096  # waits whose OKs are remembered; older than OKS_FORGET_S are forgotten beyond
OKS_FORGET_S = 600.0
MAX_CONNECTIONS = 256

log = logging.getLogger("hami_jupyter.broker")


class Refused(Exception):
    """A request answered ``NO`` before it is queued; the message says why,
    *kind* names the rule (the audit log records each kind once a minute per user)."""

    def __init__(self, why, kind):
        super().__init__(why)
        self.kind = kind


class Broker:
    """The broker over the slices under *root*.

    *room*: NVML (:class:`~.room.Room`); *parker*: parks kernels
    (:class:`~.parker.Parker`); *min_idle*: seconds a kernel must be idle to
    be parked; *audit_path*: the audit log; *cannot_park*: why this driver
    cannot park processes (None: it can).
    """

    def __init__(self, root, *, room, parker, min_idle, audit_path, cannot_park=None, proc="/proc"):
        self.root = root
        self.room = room
        self.parker = parker
        self.min_idle = min_idle
        self.cannot_park = cannot_park
        self.proc = proc
        self.decisions = Decisions(audit_path)
        self.stop = threading.Event()
        self.changed = threading.Event()  # a queue changed: the report is written sooner
        self.served = threading.Event()  # a request was answered: the headroom is looked at sooner
        self.keeper = None  # the headroom keeper (:mod:`.headroom`), when --headroom is set
        self._gpu_locks = {}  # uuid -> held while parking on that GPU (a request's, or the headroom's)
        self._gpu_locks_lock = threading.Lock()
        self.queues = Queues(self._expected)
        self.own_ns = pid_namespace("self", proc)
        self._look_lock = threading.Lock()
        self._slices = SliceFiles(root)
        self._attributor = Attributor(proc)
        self._threads = set()
        self._threads_lock = threading.Lock()
        self._oks = {}  # (pid, since, uuid) -> [OKs answered to that wait, monotonic time of the last]
        self._oks_lock = threading.Lock()
        self.errors = []  # what the latest look could not read

    # ---- the slices -------------------------------------------------------------

    def look(self, errors):
        """The slices now (a guard :class:`~hami_jupyter.guard.slices.SliceSet`)."""
        with self._look_lock:
            found = self._slices.read(errors)
        self.errors = list(errors)
        return found

    def slot_of(self, pid, slices):
        """``(SliceSeen, Slot, facts)`` of the live slot process *pid* (a PID of
        ours) holds as the slice file's owner, or None."""
        facts = read_facts(pid, proc=self.proc)
        if facts is None:
            return None
        with self._look_lock:
            attribution = self._attributor.attribute(facts, slices)
        if attribution.slot is None:
            return None
        return attribution.seen, attribution.slot, facts

    def _expected(self, uuid, since_ns):
        """Whether a process of a slice waits for room on *uuid* since before
        *since_ns* and has not asked yet (right after a restart, it is about to)."""
        waiting = {(r.slice, r.slot_pid) for line in self.queues.view().values() for r in line}
        for name, seen in self.look([]).readable.items():
            device = seen.device(uuid)
            if device is None:
                continue
            for s in seen.snapshot.slots:
                if (s.room_wait_since_unix_ns and s.room_wait_since_unix_ns < since_ns
                        and s.room_wait_device == device.index and (name, s.pid) not in waiting):
                    return True
        return False

    def gpu_lock(self, uuid):
        """The lock held while kernels are chosen and parked on GPU *uuid*."""
        with self._gpu_locks_lock:
            return self._gpu_locks.setdefault(uuid, threading.Lock())

    # ---- one connection ------------------------------------------------------------

    def accept(self, conn):
        """Serve *conn* from a thread of its own."""
        with self._threads_lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            if len(self._threads) >= MAX_CONNECTIONS:
                try:
                    conn.sendall(protocol.no(f"the broker serves {MAX_CONNECTIONS} requests already"))
                finally:
                    conn.close()
                return
            thread = threading.Thread(target=self.handle, args=(conn,), name="broker-request", daemon=True)
            self._threads.add(thread)
        thread.start()

    def handle(self, conn):
        try:
            request = self._request(conn)
            if request is not None:
                self._serve(request)
        except Exception:  # one request's trouble never ends the broker
            log.exception("broker: a request failed")
        finally:
            conn.close()

    def _read_line(self, conn):
        conn.settimeout(READ_TIMEOUT_S)
        data = b""
        while b"\n" not in data and len(data) <= protocol.MAX_LINE:
            chunk = conn.recv(protocol.MAX_LINE + 1 - len(data))
            if not chunk:
                break
            data += chunk
        conn.settimeout(None)
        return data.split(b"\n", 1)[0] if b"\n" in data else None

    def _request(self, conn):
        """The checked :class:`Request` of *conn*, or None (answered ``NO`` already)."""
        pid, uid, _ = protocol.peer_credentials(conn)
        user = user_name(uid)
        try:
            line = self._read_line(conn)
        except OSError:
            line = None
        if line is None:
            self.decisions.refused_stranger(self.root, pid, uid, user, None,
                                            "no request line (ROOM <gpu uuid> <bytes> <since_unix_ns>)",
                                            "no-request")
            return None
        try:
            room = protocol.parse_request(line)
            return self.check(conn, pid, uid, user, room)
        except protocol.BadRequest as e:
            why = f"malformed request: {e}"
            self.decisions.refused_stranger(self.root, pid, uid, user, None, why, "malformed")
        except Refused as e:
            why = str(e)
            self.decisions.refused_stranger(self.root, pid, uid, user, room.uuid, why, e.kind)
        _send(conn, protocol.no(why))
        return None

    def check(self, conn, pid, uid, user, room):
        """The :class:`Request` of the process *pid* for *room*; Refused when it
        may not ask (see the module docstring)."""
        found = self.slot_of(pid, self.look([]))
        if found is None:
            raise Refused(f"pid {pid} holds no live slot in a slice under {self.root}: only a process "
                          "running under the preload library in one of its slices may ask for room", "no-slot")
        seen, slot, facts = found
        device = seen.device(room.uuid)
        limits = device.limit if device is not None else seen.snapshot.fallback_limit
        charge = device.memory_used if device is not None else 0
        if limits.memory_limit and charge > limits.memory_limit:
            raise Refused(f"slice {seen.name} holds {format_size(charge)} on GPU {room.uuid}, over its "
                          f"{format_size(limits.memory_limit)} limit: room is made only within a limit",
                          "over-limit")
        if limits.memory_limit and room.bytes > limits.memory_limit:
            raise Refused(f"{format_size(room.bytes)} is more than slice {seen.name}'s "
                          f"{format_size(limits.memory_limit)} limit on GPU {room.uuid}", "over-limit")
        # A wait cannot have begun before its process, nor after now: a since
        # outside that would only move the request in the queue.
        since = min(max(room.since_ns, slot.started_unix_ns), time.time_ns())
        return Request(conn=conn, pid=pid, uid=uid, user=user or facts.user, slice=seen.name,
                       path=seen.path, kernel_id=slot.kernel_id, slot_pid=slot.pid, uuid=room.uuid,
                       bytes=room.bytes, since_ns=since)

    def _serve(self, request):
        ahead = self.queues.add(request)
        self.changed.set()
        try:
            if ahead:
                request.answer(protocol.busy(ahead))  # a requester gone already: the queue sees it
            if not self.queues.wait_turn(request, self.stop):
                if not self.stop.is_set():
                    self.decisions.dropped(request, [])
                return
            self.changed.set()
            answer = self.make_room(request)
            if answer is not None:
                request.answer(answer)
        finally:
            self.queues.done(request)
            self.changed.set()
            self.served.set()

    # ---- making room ---------------------------------------------------------------------

    def _wanted(self, request):
        """The free bytes that serve *request*: its bytes, and :data:`HEADROOM`
        more for each OK its wait was answered already. NVML's free figure is
        not all a driver call can take (its own bookkeeping, page rounding):
        a wait that comes back after an OK found the room short, and asking
        the same again would answer OK at once, over and over."""
        with self._oks_lock:
            seen = self._oks.get((request.pid, request.since_ns, request.uuid))
        return request.bytes + (seen[0] if seen else 0) * HEADROOM

    def _answered_ok(self, request):
        now = time.monotonic()
        with self._oks_lock:
            if len(self._oks) > OKS_KEPT:
                self._oks = {k: v for k, v in self._oks.items() if now - v[1] < OKS_FORGET_S}
            seen = self._oks.setdefault((request.pid, request.since_ns, request.uuid), [0, now])
            seen[0] += 1
            seen[1] = now

    def make_room(self, request):
        """Park for *request* until its GPU has the room; the answer line, or None
        when nothing is to be answered (the requester went away, the broker stops).
        A headroom park under way on the GPU finishes first (its room serves
        this request too); the headroom keeper parks nothing more while a
        request waits or is served (:meth:`~.queue.Queues.busy`)."""
        lock = self.gpu_lock(request.uuid)
        while not lock.acquire(timeout=0.1):
            if self.stop.is_set():
                return None
            if not request.alive():
                self.decisions.dropped(request, [])
                return None
        try:
            return self._make_room(request)
        finally:
            lock.release()

    def _make_room(self, request):
        requester = Requester(request.slice, request.kernel_id, request.slot_pid)
        wanted = self._wanted(request)
        parked, failed, made = [], set(), 0
        settle_until = time.monotonic() + SETTLE_S
        while True:
            if self.stop.is_set():
                return None
            if not request.alive():  # before each park, and before it is told OK
                self.decisions.dropped(request, parked)
                return None
            errors = []
            free = self.room.free(request.uuid, errors)
            if free is None:
                return self._no(request, f"the broker cannot read the GPU's free memory: {'; '.join(errors)}",
                                "nvml")
            if free >= wanted:
                self.decisions.served(request, made, free, parked)
                self._answered_ok(request)
                return protocol.ok(made)
            if self.cannot_park:
                return self._no(request, f"this driver cannot park processes ({self.cannot_park})", "driver")
            holders = self.room.holders(request.uuid, errors)
            if holders is None:
                return self._no(request, f"the broker cannot read the GPU's processes: {'; '.join(errors)}",
                                "nvml")
            slices = self.look(errors)
            kernels = gather(slices, request.uuid, holders, self.placed(holders, slices), self.own_ns)
            if any(k.state == "parking" for k in kernels) and time.monotonic() < settle_until:
                time.sleep(0.1)  # room on its way: measured again when it is there
                continue
            now = time.time()
            eligible, skipped = judge(kernels, requester, self.min_idle, now)
            eligible = [k for k in eligible if _key(k) not in failed]
            need = wanted - free
            chosen = plan(eligible, need)
            if not chosen:
                return self._no(request, _nothing_to_park(need, free, wanted, request.uuid, eligible, skipped,
                                                          failed, parked), "nothing-to-park")
            kernel = chosen[0]
            if not request.alive():
                continue  # said at the top
            try:
                result = self.parker.park(kernel)
            except ParkError as e:
                failed.add(_key(kernel))
                self.decisions.park_failed(request, kernel, e)
                continue
            parked.append(kernel)
            made += result.bytes
            self.decisions.park(request, kernel, result, kernel.idle_s(now))
            self.await_freed(request, free)

    def await_freed(self, request, before):
        """After a park: until NVML shows the memory free (or :data:`FREED_WAIT_S`),
        so that a late figure does not make the broker park one kernel too many."""
        deadline = time.monotonic() + FREED_WAIT_S
        while time.monotonic() < deadline:
            free = self.room.free(request.uuid, [])
            if free is None or free > before:
                return
            time.sleep(0.05)

    def placed(self, holders, slices):
        """``{host pid: (slice, slot index, user)}`` of the GPU's processes that hold a slot."""
        out = {}
        for pid in holders:
            found = self.slot_of(pid, slices)
            if found is not None:
                seen, slot, facts = found
                out[pid] = (seen.name, slot.index, facts.user)
        return out

    def _no(self, request, why, kind):
        self.decisions.refused(request, why, kind)
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


def _send(conn, line):
    try:
        conn.sendall(line)
    except OSError:
        pass


def _nothing_to_park(need, free, wanted, uuid, eligible, skipped, failed, parked):
    """Why no more room can be made, in one line."""
    note = f" ({len(failed)} park(s) failed)" if failed else ""
    if parked:
        note += f"; {len(parked)} kernel(s) were parked for it already"
    return (f"GPU {uuid} has {format_size(free)} free, {format_size(need)} short of the "
            f"{format_size(wanted)} needed; " + why_none(eligible, skipped, note))


def listening_socket(path):
    """A Unix socket listening at *path*, mode 0666 (any local user may ask;
    the broker checks who asks), put in place with one rename, so that a
    client never meets a socket nobody listens on."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o111)  # bind makes the file 0666 itself: no chmod of a path someone could swap
    try:
        server.bind(str(tmp))
        os.umask(umask)
        server.listen(64)
        os.replace(tmp, path)
    except BaseException:
        os.umask(umask)
        server.close()
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    return server
