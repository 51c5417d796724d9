"""Headroom: free memory kept on each GPU before anyone asks for it (``--headroom SIZE``).

Without it the agent parks only once someone waits: a cell that meets a full
GPU waits for a park (4.7 s for 8 GiB on an H100) and then, if it was parked
itself, for its own resume (2.3 s). With a headroom *H*, the agent keeps at
least *H* free on each GPU it serves (the GPUs the slices under its root have
met), so that the next resume or allocation of up to *H* finds the room at
once. The cost: idle kernels are parked sooner, before anyone asked.

:class:`Keeper` looks at each GPU every :data:`CHECK_S` seconds and after
each request answered. While a GPU's NVML free bytes are below *H*, it parks
idle kernels there under the very rules a waiting request uses
(:func:`~.room.kernels.judge` and :func:`~.room.kernels.plan`: the idlest
first, none active within ``--min-idle-seconds``, never a slice at or below
its guarantee, none beyond what brings the free bytes to *H*; when those that
may be parked cannot bring it to *H*, none is parked, as for a request), one
at a time, measuring again after each. Requests come first:

- nothing is parked for the headroom on a GPU where a request waits or is
  served, or whose process was answered a moment ago (it asks again in a
  second): what the agent itself knows of who asks, never a slot's word, so
  no user stops the keeper by writing a wait into her own slot;
- a request that arrives while a headroom park is under way waits only for
  that park (its room counts for the request), and no other headroom park
  follows until the GPU's queue is empty again.

No loops: a kernel its user resumed has just used the GPU, so it is not idle
until ``--min-idle-seconds`` have passed; a kernel whose park failed is not
tried for the headroom again for :data:`FAILED_RETRY_S`. When nothing can be
parked, the keeper waits for its next look; it logs one line when a GPU's
headroom cannot be kept and one when it is kept again. Each park is audited
like any room park (``broker-park``), with ``requester`` naming the headroom
(``{"for": "headroom", ...}``) instead of a user; the parked kernel's slot
says ``room``, so its user reads "parked to make room for another user's
work".
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ..slice.size import format_size
from .room.kernels import NOBODY, gather, judge, plan, why_none

# A look costs one NVML free-memory read per GPU and one read of the slice
# files (the guard reads them every 0.5 s); a second is short beside the park
# it starts (seconds for GiBs), so a resume that took the room is answered
# by the next park about as soon as it could be.
CHECK_S = 1.0
# A park that failed (host memory short, a process whose parking thread does
# not answer) may succeed later; tried again after this, one audit record
# per failing kernel every few minutes at most.
FAILED_RETRY_S = 300.0

log = logging.getLogger("hami_jupyter.broker")


@dataclass
class ForHeadroom:
    """The requester of a headroom park, as :class:`~.records.Records` names
    requesters: no user, no slice; the GPU, the headroom and its free bytes."""

    uuid: str
    headroom: int
    free: int
    uid: int | None = None  # the audit record takes the agent's own

    def who(self):
        return (f"the {format_size(self.headroom)} headroom of GPU {self.uuid} "
                f"({format_size(self.free)} free)")

    def record(self):
        return {"for": "headroom", "slice": None, "pid": None, "user": None, "kernel": None,
                "bytes": max(0, self.headroom - self.free), "headroom_bytes": self.headroom,
                "free_bytes": self.free}


def served_gpus(slices):
    """The UUIDs of the GPUs the slices in *slices* (a SliceSet) have met."""
    return sorted({d.uuid for seen in slices.readable.values() for d in seen.snapshot.devices if d.uuid})


class Keeper:
    """Keeps *headroom* bytes free on each GPU of *rooms* (a :class:`~.rooms.Rooms`)."""

    def __init__(self, rooms, headroom, check_s=CHECK_S):
        self.rooms = rooms
        self.headroom = headroom
        self.check_s = check_s
        self._state = {}  # uuid -> the report's entry
        self._state_lock = threading.Lock()
        self._short = set()  # GPUs whose "cannot be kept" was logged

    # ---- the report ---------------------------------------------------------------

    def view(self):
        """``{uuid: {"kept", "free_bytes", "why", "since_unix", "checked_unix"}}`` for the report."""
        with self._state_lock:
            return {uuid: dict(entry) for uuid, entry in self._state.items()}

    def _say(self, uuid, kept, free, why=None):
        now = time.time()
        with self._state_lock:
            entry = self._state.get(uuid)
            if entry is None or entry["kept"] != kept:
                entry = self._state[uuid] = {"kept": kept, "since_unix": now}
            entry.update(free_bytes=free, why=why, checked_unix=now)
        if kept and uuid in self._short:
            self._short.discard(uuid)
            log.info("broker: GPU %s: the %s headroom is kept again (%s free)", uuid,
                     format_size(self.headroom), format_size(free))

    def _cannot(self, uuid, free, why):
        """The headroom of *uuid* cannot be kept now: said in the report, logged once."""
        self._say(uuid, False, free, why)
        if uuid not in self._short:
            self._short.add(uuid)
            log.warning("broker: GPU %s: the %s headroom cannot be kept: %s", uuid,
                        format_size(self.headroom), why)

    # ---- the loop -----------------------------------------------------------------

    def run(self):
        """Look at every GPU each :attr:`check_s` and after each request answered, until the agent stops."""
        rooms = self.rooms
        while not rooms.stop.is_set():
            rooms.served.clear()
            try:
                self.look()
            except Exception:  # one look's trouble never ends the keeper
                log.exception("broker: the headroom look failed")
            rooms.served.wait(self.check_s)

    def look(self):
        """One look at every GPU the slices have met."""
        gpus = served_gpus(self.rooms.node.look(within=self.check_s / 2).slices)
        with self._state_lock:
            for uuid in set(self._state) - set(gpus):  # no slice has met it any more
                del self._state[uuid]
        for uuid in gpus:
            if self.rooms.stop.is_set():
                return
            self.keep(uuid)

    def keep(self, uuid):
        """Park idle kernels on GPU *uuid* until it has the headroom free, while no request needs it."""
        rooms = self.rooms
        while not rooms.stop.is_set():
            errors = []
            free = rooms.node.free(uuid, errors)
            if free is None:
                self._cannot(uuid, None, f"the agent cannot read the GPU's free memory: {'; '.join(errors)}")
                return
            if free >= self.headroom:
                self._say(uuid, True, free)
                return
            if rooms.queues.busy(uuid):
                self._say(uuid, False, free, "a request for room is served on this GPU first")
                return
            if rooms.cannot_park:
                self._cannot(uuid, free, f"this driver cannot park processes ({rooms.cannot_park})")
                return
            lock = rooms.gpu_lock(uuid)
            if not lock.acquire(blocking=False):
                self._say(uuid, False, free, "a request for room is served on this GPU first")
                return
            try:
                if not self._park_one(uuid, free):
                    return
            finally:
                lock.release()

    def _park_one(self, uuid, free):
        """Park the idlest kernel that may be parked toward the headroom; True when
        one was parked or tried (measure again), False when this look is over."""
        rooms = self.rooms
        if rooms.queues.busy(uuid):  # asked while the lock was taken
            self._say(uuid, False, free, "a request for room is served on this GPU first")
            return False
        if rooms.asking(uuid):
            self._say(uuid, False, free, "a process waits for room on this GPU: its request comes first")
            return False
        look = rooms.node.look()
        if uuid not in look.reading.gpus:
            self._cannot(uuid, free, f"the agent cannot read the GPU's processes: {'; '.join(look.errors)}")
            return False
        now = time.time()
        kernels = gather(look, uuid, rooms.node.activity, now, acting=rooms.actor.acting(),
                         driver=rooms.node.driver_state)
        if any(k.state == "parking" for k in kernels):
            self._say(uuid, False, free, "a park is under way on this GPU: measured again when it is done")
            return False
        eligible, skipped = judge(kernels, NOBODY, rooms.min_idle, now)
        failed = [k for k in eligible if rooms.failed_lately(uuid, k, FAILED_RETRY_S)]
        eligible = [k for k in eligible if k not in failed]
        need = self.headroom - free
        chosen = plan(eligible, need)
        if not chosen:
            self._cannot(uuid, free, _why_short(need, free, eligible, skipped, failed))
            return False
        kernel = chosen[0]
        self._say(uuid, False, free, f"parking {kernel.label} of slice {kernel.slice} for the headroom")
        if rooms.park(ForHeadroom(uuid, self.headroom, free), kernel, now, set()):  # a failure is remembered there
            rooms.await_freed(uuid, free)
        return True


def _why_short(need, free, eligible, skipped, failed):
    """Why the headroom cannot be kept now, in one line."""
    note = f" ({len(failed)} whose park failed lately not tried again yet)" if failed else ""
    return f"{format_size(free)} free, {format_size(need)} short; " + why_none(eligible, skipped, note)
