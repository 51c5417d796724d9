"""Real use against the cap, per slice and GPU, and whom to act on when it is over.

For each slice and each GPU:

- **real**: the sum of NVML's figures for the slice's processes on that GPU;
- **limit**: the slice's memory cap in force on that GPU (its own entry, else
  the default entry); 0 means no cap, and then the guard never acts;
- **tolerance**: what the library charges for one CUDA context in that
  slice (``HAMI_CONTEXT_OVERHEAD`` of its processes, the largest one), else
  the guard's default (64 MiB, ``--tolerance``);
- **kept**: what the slice's processes under the preload library hold that
  the library allowed them (each process's NVML figure, up to what its hooks
  charged it plus the tolerance for the driver's own memory): memory they got
  through the library, within the cap in force when they got it. What the
  library's true-up charged on top is not counted: it follows memory taken
  past the library as well as the driver's own;
- **held**: the kept bytes the guard lets stand above a cap lowered since
  (an administrator's shrink): at most what it saw the library's processes
  hold while the slice was within its cap, and never more than they hold now.
  The guard keeps it from interval to interval (in its report, so a restart
  keeps it too); a slice it sees for the first time gets its kept bytes.

The slice is **over** when real > max(limit, held) + tolerance: only bytes
no cap ever allowed make it over (a process without the library, counters
zeroed by hand, anything past what the library charged). A slice whose real
use passes a lowered cap by memory it held before the change is **held**:
the library refuses it new memory until its use falls; nobody is ended or
parked for it.

Why a tolerance at all: the library charges what a program allocates, while
the driver reports the process's whole footprint, and the two part by about
one context. A process's first context is measured after the driver made it,
so for a moment the slice holds one context more than its cap
(docs/preload.md); a program's memory and the driver's rounding of it differ
by small amounts. One context's worth keeps an honest slice from ever being
over, and is far below what a bypass takes.

Only over slices are acted on, and only their own processes: every process
considered here was attributed to that slice (:mod:`.attribution`). When a
slice is over, processes are chosen one at a time, in this order, until the
slice's real bytes (NVML's figures less what the chosen processes held) are
within max(limit, held) + tolerance:

1. processes without the preload library first, the newest first: the
   slice's own accounting does not see them, so they are what put it over;
2. then processes under the library that hold more than it charged them
   (by more than the tolerance), the largest excess first.

A process under the library that holds no more than it was charged is never
chosen: it got its memory within the cap in force. Neither is a process
holding no memory on that GPU, PID 1 or the guard itself. When one process
is chosen for one GPU, its bytes on the slice's other GPUs count as freed
there too, and so do they in later intervals while NVML still lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MiB = 1 << 20
DEFAULT_TOLERANCE = 64 * MiB
OK, OVER, HELD = "ok", "over", "held"


@dataclass
class ProcessUse:
    """One process of a slice on one GPU."""

    pid: int
    start_ticks: int
    real_bytes: int
    preload: bool
    attributed_by: str
    uid: int | None = None
    user: str | None = None
    # What its hooks charged it on this GPU: its slot's charge less what the
    # library's true-up added for the driver's own memory (None: no slot). A
    # true-up also follows memory taken past the library, so it is not taken
    # for memory the library allowed; the tolerance covers the driver's own.
    charged_bytes: int | None = None
    command: str | None = None

    def kept_bytes(self, tolerance):
        """What it holds that the library allowed it (0 without the library)."""
        if not self.preload or self.charged_bytes is None:
            return 0
        return min(self.real_bytes, self.charged_bytes + tolerance)

    def excess_bytes(self, tolerance):
        """What it holds beyond that (all of it without the library)."""
        if not self.preload or self.charged_bytes is None:
            return self.real_bytes
        return max(0, self.real_bytes - self.charged_bytes - tolerance)

    def as_report(self):
        return {"pid": self.pid, "real_bytes": self.real_bytes, "preload": self.preload,
                "attributed_by": self.attributed_by, "user": self.user,
                "charged_bytes": self.charged_bytes}


@dataclass
class SliceGpu:
    """One slice on one GPU this interval. *device* is the slice device index
    (None: a GPU the slice's own processes never met)."""

    slice: str
    path: str
    uuid: str
    device: int | None
    real_bytes: int
    reported_bytes: int
    limit_bytes: int
    tolerance_bytes: int
    processes: list = field(default_factory=list)
    allowance_bytes: int | None = None  # see held_bytes; None: the guard has no history of it yet

    @property
    def kept_bytes(self):
        return sum(p.kept_bytes(self.tolerance_bytes) for p in self.processes)

    @property
    def held_bytes(self):
        """Kept bytes let stand above a lowered cap: no more than the allowance."""
        kept = self.kept_bytes
        return kept if self.allowance_bytes is None else min(kept, self.allowance_bytes)

    @property
    def allowed_bytes(self):
        return max(self.limit_bytes, self.held_bytes)

    @property
    def over(self):
        return is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes, self.held_bytes)

    @property
    def state(self):
        if self.over:
            return OVER
        return HELD if is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes) else OK

    def next_allowance(self):
        """The allowance for the next interval: within the cap, all the kept
        bytes (the cap in force allowed them); past it, never more than before."""
        if not is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes) or self.allowance_bytes is None:
            return self.kept_bytes
        return min(self.allowance_bytes, self.kept_bytes)

    def as_report(self):
        return {"real_bytes": self.real_bytes, "reported_bytes": self.reported_bytes,
                "limit_bytes": self.limit_bytes, "tolerance_bytes": self.tolerance_bytes,
                "held_bytes": self.held_bytes, "allowance_bytes": self.allowance_bytes,
                "state": self.state,
                "processes": [p.as_report() for p in sorted(self.processes, key=lambda p: p.pid)]}


def is_over(real, limit, tolerance, held=0):
    """Over the cap: a cap is set (0 is none) and real passes it, or the bytes
    held from before a lowered cap if more, by more than the tolerance."""
    return limit > 0 and real > max(limit, held) + tolerance


def tolerance_for(overheads, default=DEFAULT_TOLERANCE):
    """The largest context overhead the slice's processes declare, else *default*."""
    known = [o for o in overheads if o]
    return max(known) if known else default


def protected_pids():
    """Never ended, whatever they are charged to: PID 1 and the guard itself."""
    return {1, os.getpid()}


def victim_order(processes, tolerance):
    """Processes without the preload first (the newest first), then those under
    it holding more than they were charged (the largest excess first); never
    one that holds no more than its charge."""
    bypass = [p for p in processes if not p.preload or p.charged_bytes is None]
    excess = [p for p in processes if p not in bypass and p.excess_bytes(tolerance) > 0]
    return (sorted(bypass, key=lambda p: (-p.start_ticks, -p.pid))
            + sorted(excess, key=lambda p: (-p.excess_bytes(tolerance), -p.start_ticks, -p.pid)))


@dataclass(frozen=True)
class Kill:
    """End *process* because of *gpu*; *real_before*: the slice's real bytes on
    that GPU (less what was already ended) when this one was chosen."""

    gpu: SliceGpu
    process: ProcessUse
    real_before: int


def plan_kills(gpus, protected=None, only=None, ended=()):
    """The processes to end for one slice's *gpus* (its :class:`SliceGpu` list),
    in order, as :class:`Kill`. Empty when no GPU of it is over. *only*: the
    UUIDs to act on (default: every GPU that is over). *ended*: PIDs already
    sent SIGKILL whose memory NVML still lists (a driver takes a moment to free
    a large process): their bytes count as freed, so that nobody else is ended
    for them."""
    protected = protected_pids() if protected is None else protected
    ended = set(ended)  # its bytes on the slice's other GPUs are freed as well
    by_pid = {}
    for g in gpus:
        for p in g.processes:
            by_pid.setdefault(p.pid, {})[g.uuid] = p.real_bytes
    plan = []
    for g in sorted(gpus, key=lambda g: g.uuid):
        if not g.over or (only is not None and g.uuid not in only):
            continue
        real = g.real_bytes - sum(by_pid.get(pid, {}).get(g.uuid, 0) for pid in ended)
        held = g.held_bytes
        for p in victim_order(g.processes, g.tolerance_bytes):
            if not is_over(real, g.limit_bytes, g.tolerance_bytes, held):
                break
            if p.pid in ended or p.pid in protected or p.real_bytes <= 0:
                continue
            plan.append(Kill(g, p, real))
            ended.add(p.pid)
            real -= p.real_bytes
    return plan


@dataclass(frozen=True)
class Placed:
    """One NVML process on one GPU, with its facts and attribution."""

    uuid: str
    used_bytes: int
    facts: object  # procs.ProcessFacts
    attribution: object  # attribution.Attribution


def measure(gpus, placed, slices, default_tolerance=DEFAULT_TOLERANCE):
    """``({slice name: {uuid: SliceGpu}}, unattributed)`` for this interval.

    *gpus*: the UUIDs whose processes were read; *placed*: :class:`Placed`
    entries; *slices*: the :class:`~.slices.SliceSet`. Every readable slice
    gets an entry for each GPU read that it has met or where it has
    processes; a GPU that could not be read gets none (nothing is known
    there, so nothing is acted on).
    """
    overheads = {}
    for p in placed:
        if p.attribution.seen is not None:
            overheads.setdefault(p.attribution.seen.name, []).append(p.facts.context_overhead)
    tolerance = {name: tolerance_for(overheads.get(name, ()), default_tolerance)
                 for name in slices.readable}
    out = {name: {d.uuid: _slice_gpu(seen, d.uuid, tolerance[name])
                  for d in seen.snapshot.devices if d.uuid in gpus}
           for name, seen in slices.readable.items()}
    unattributed = []
    for p in placed:
        seen = p.attribution.seen
        if seen is None:
            unattributed.append({"pid": p.facts.pid, "uuid": p.uuid, "real_bytes": p.used_bytes,
                                 "user": p.facts.user, "why": p.attribution.why})
            continue
        g = out[seen.name].get(p.uuid)
        if g is None:  # a GPU the slice's own processes never met: its default entry holds
            g = out[seen.name][p.uuid] = _slice_gpu(seen, p.uuid, tolerance[seen.name])
        g.real_bytes += p.used_bytes
        slot = p.attribution.slot
        charged = None
        if slot is not None and g.device is not None:
            charged = max(0, (slot.memory_used or {}).get(g.device, 0) - (slot.driver_bytes or {}).get(g.device, 0))
        g.processes.append(ProcessUse(p.facts.pid, p.facts.start_ticks, p.used_bytes,
                                      p.attribution.preload, p.attribution.by, p.facts.uid,
                                      p.facts.user, charged, getattr(p.facts, "command", None)))
    return out, unattributed


def _slice_gpu(seen, uuid, tolerance):
    d = seen.device(uuid)
    return SliceGpu(seen.name, str(seen.path), uuid, d.index if d else None, 0,
                    seen.reported_bytes(uuid), seen.limit_bytes(uuid), tolerance)
