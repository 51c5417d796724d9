"""When each GPU process last used the GPU, as far as the agent knows it.

A process's slot records its last driver call (``gpu_active_unix_ns``), and
its Jupyter server's registry entry the kernel's last message and whether a
cell runs: both written by the user's own processes, so both are her claims.
Believed, a claim of activity kept an idle kernel from being parked while
another user's was parked in its place (issue 33). Activity here rests on
facts instead:

- the driver's per-process utilization samples (the NVML reader's ``busy``
  set): a process whose kernels or copies ran since the last look is active;
- what the agent sees change: a process whose NVML bytes on a GPU differ from
  its last look allocated, freed, was parked or came back: it is active;
- when the agent began to watch it (its first look at it): of the time
  before, the agent knows nothing, so it counts the process active then.

A claim may only make a process look idler than that. A claimed last
activity counts for the time the agent did not watch, never for the time it
did: a kernel watched for an hour with nothing seen is idle for an hour
whatever its slot says; one watched for ten seconds is idle for ten seconds,
or for as long as its claim says if that is longer (a kernel of hers she
says is idle is hers to have parked).

The same looks tell how long a slot has said its process is away from the GPU
(parked, being parked or coming back) while NVML still lists its bytes
(:meth:`Activity.away_for`): a park's first steps take a moment, so the room
policy believes such a slot briefly, and after that only while the driver
holds the process locked or checkpointed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ...slice.layout import HAMI_PARK_RUNNING

FORGET_S = 600.0  # a process not listed for this long is forgotten (a parked one may leave NVML's list)


@dataclass
class Watched:
    """What the agent saw of one process (by PID and start time)."""

    since: float  # its first look at it
    seen: float  # its latest look at it
    active: float | None = None  # the latest activity it saw
    bytes: dict = field(default_factory=dict)  # uuid -> bytes at the latest look that read that GPU
    away_since: float | None = None  # since when its slot says it is off the GPU while NVML lists its bytes


class Activity:
    """The agent's own record of GPU activity, kept across its looks."""

    def __init__(self):
        self._watched = {}  # (pid, start ticks) -> Watched
        self._lock = threading.Lock()

    def observe(self, placed, read, busy, now):
        """One look: *placed* (:class:`~.look.Placed` entries), *read* the UUIDs
        whose processes were read, *busy* the pids the driver saw busy."""
        bytes_of, slot_of, facts_of = {}, {}, {}
        for p in placed:
            key = (p.facts.pid, p.facts.start_ticks)
            facts_of[key] = p.facts
            bytes_of.setdefault(key, {})[p.uuid] = p.used_bytes
            if p.attribution.slot is not None:
                slot_of[key] = p.attribution.slot
        with self._lock:
            for key, facts in facts_of.items():
                w = self._watched.get(key)
                if w is None:
                    w = self._watched[key] = Watched(since=now, seen=now)
                now_bytes = {uuid: bytes_of[key].get(uuid, 0) for uuid in read}
                changed = any(w.bytes.get(uuid) != n for uuid, n in now_bytes.items() if uuid in w.bytes)
                w.bytes.update(now_bytes)
                if changed or facts.pid in busy:
                    w.active = now
                w.seen = now
                slot = slot_of.get(key)
                away = slot is not None and slot.park_state != HAMI_PARK_RUNNING and any(now_bytes.values())
                w.away_since = (w.away_since or now) if away else None
            # Listed no more on a GPU read now: it holds nothing there (it freed,
            # ended, or was parked). Its history stays a while; a change it is.
            for key, w in list(self._watched.items()):
                if key in facts_of:
                    continue
                if any(w.bytes.get(uuid) for uuid in read):
                    w.active = now
                    for uuid in read:
                        w.bytes[uuid] = 0
                if now - w.seen > FORGET_S:
                    del self._watched[key]

    def last_active(self, facts, claim_unix, now):
        """When process *facts* (a :class:`~.procs.ProcessFacts`) last used the GPU
        as far as the agent knows: its latest activity seen, else when the agent
        began to watch it. *claim_unix*: what its user's files say (None: nothing),
        taken only where it is earlier than the watch began. *now* for a process
        the agent has not looked at yet: active now."""
        with self._lock:
            w = self._watched.get((facts.pid, facts.start_ticks))
            if w is None:
                return now
            unwatched = w.since if claim_unix is None else min(claim_unix, w.since)
            return max(w.active or 0.0, unwatched)

    def away_for(self, facts, now):
        """Seconds the process's slot has said it is off the GPU while NVML listed
        its bytes (0 when it does not say so, or the agent has not seen it)."""
        with self._lock:
            w = self._watched.get((facts.pid, facts.start_ticks))
            return 0.0 if w is None or w.away_since is None else now - w.away_since
