"""Real use against the cap, per slice and GPU, and whom to end when it is over.

For each slice and each GPU:

- **real**: the sum of NVML's figures for the slice's processes on that GPU;
- **limit**: the slice's memory cap in force on that GPU (its own entry, else
  the default entry); 0 means no cap, and then the guard never acts;
- **tolerance**: what the library charges for one CUDA context in that
  slice (``HAMI_CONTEXT_OVERHEAD`` of its processes, the largest one), else
  the guard's default (64 MiB, ``--tolerance``).

The slice is **over** when real > limit + tolerance. Why a tolerance at all:
the library charges what a program allocates, while the driver reports the
process's whole footprint, and the two part by about one context. A
process's first context is measured after the driver made it, so for a
moment the slice holds one context more than its cap (docs/preload.md); a
program's memory and the driver's rounding of it differ by small amounts.
One context's worth keeps an honest slice from ever being over, and is far
below what a bypass takes (a process without the library is not charged at
all, so the whole of it counts).

Only over slices are acted on, and only their own processes: every process
considered here was attributed to that slice (:mod:`.attribution`). When a
slice is over, processes are ended one at a time, in this order, until the
slice's real bytes (NVML's figures less what the ended processes held) are
within limit + tolerance:

1. processes without the preload library first: they are the ones the
   slice's own accounting does not see, so they are what put it over;
2. then the newest first (start time): the process that started last is the
   likeliest to have brought the slice over, and the oldest has the most
   work to lose.

A process holding no memory on that GPU is never chosen (ending it frees
nothing there), nor PID 1, nor the guard itself. When one process is ended
for one GPU, its bytes on the slice's other GPUs count as freed there too,
and so do they in later intervals while NVML still lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MiB = 1 << 20
DEFAULT_TOLERANCE = 64 * MiB
OK, OVER = "ok", "over"


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

    def as_report(self):
        return {"pid": self.pid, "real_bytes": self.real_bytes, "preload": self.preload,
                "attributed_by": self.attributed_by, "user": self.user}


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

    @property
    def over(self):
        return is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes)

    @property
    def state(self):
        return OVER if self.over else OK

    def as_report(self):
        return {"real_bytes": self.real_bytes, "reported_bytes": self.reported_bytes,
                "limit_bytes": self.limit_bytes, "tolerance_bytes": self.tolerance_bytes,
                "state": self.state,
                "processes": [p.as_report() for p in sorted(self.processes, key=lambda p: p.pid)]}


def is_over(real, limit, tolerance):
    """Over the cap: a cap is set (0 is none) and real passes it by more than the tolerance."""
    return limit > 0 and real > limit + tolerance


def tolerance_for(overheads, default=DEFAULT_TOLERANCE):
    """The largest context overhead the slice's processes declare, else *default*."""
    known = [o for o in overheads if o]
    return max(known) if known else default


def protected_pids():
    """Never ended, whatever they are charged to: PID 1 and the guard itself."""
    return {1, os.getpid()}


def victim_order(processes):
    """Processes without the preload first, then the newest first."""
    return sorted(processes, key=lambda p: (p.preload, -p.start_ticks, -p.pid))


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
        for p in victim_order(g.processes):
            if not is_over(real, g.limit_bytes, g.tolerance_bytes):
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
        g.processes.append(ProcessUse(p.facts.pid, p.facts.start_ticks, p.used_bytes,
                                      p.attribution.preload, p.attribution.by, p.facts.uid,
                                      p.facts.user))
    return out, unattributed


def _slice_gpu(seen, uuid, tolerance):
    d = seen.device(uuid)
    return SliceGpu(seen.name, str(seen.path), uuid, d.index if d else None, 0,
                    seen.reported_bytes(uuid), seen.limit_bytes(uuid), tolerance)
