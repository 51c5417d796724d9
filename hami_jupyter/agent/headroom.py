"""Headroom: free memory kept on each GPU before anyone asks for it (``--headroom SIZE``).

Without it the agent parks only once someone waits: a cell that meets a full
GPU waits for a park (4.7 s for 8 GiB on an H100) and then, if it was parked
itself, for its own resume (2.3 s). With a headroom *H*, the agent keeps at
least *H* free on each GPU it serves (the GPUs the slices under its root have
met), so that the next resume or allocation of up to *H* finds the room at
once. The cost: idle kernels are parked sooner, before anyone asked.

:class:`Keeper` looks at each GPU every :data:`CHECK_S` seconds and after
each request answered. While a GPU's NVML free bytes (less the room granted
to requesters in the room ledger) are below *H*, it has the room loop take
one step toward *H* at a time (:meth:`~.rooms.Rooms.keep_free`), under the
very rules a waiting request's steps follow (:mod:`.room.plan`: the idlest
first, none active within ``--min-idle-seconds``, never a slice at or below
its guarantee, none beyond what brings the free bytes to *H*; when those
that may be parked cannot bring it to *H*, none is parked, as for a
request), measuring again after each. Without ``--headroom`` the keeper
keeps the reserve (``--reserve``, 256 MiB by default): the GPU never fills,
so that a checkpoint always has the device memory it needs. Requests come first:

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

from ..slice.size import format_size

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
        """Steps toward the headroom on GPU *uuid* until it is kept, or cannot be now."""
        while not self.rooms.stop.is_set():
            outcome, free, why = self.rooms.keep_free(uuid, self.headroom, FAILED_RETRY_S)
            if outcome == "kept":
                self._say(uuid, True, free)
                return
            if outcome == "short":
                self._cannot(uuid, free, why)
                return
            self._say(uuid, False, free, why)
            if outcome == "waits":
                return
