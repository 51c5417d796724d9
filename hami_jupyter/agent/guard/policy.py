"""Real use against the cap, per slice and GPU, and whom to act on when it is over.

For each slice and each GPU, all of it facts:

- **real**: the sum of NVML's figures for the slice's processes on that GPU;
- **limit**: the slice's memory cap in force on that GPU (its own entry, else
  the default entry; the hub's limits file when there is one), when it is
  no word of the slice's user (:attr:`~..facts.slices.SliceSeen.limits_trusted`:
  a limits file is in force, or the slice file is the agent's own user's).
  A cap the user wrote herself (a slice file of hers and no limits file) is
  none the guard holds her to: she may write any other. 0 means no cap, and
  then the guard never acts (issue 39: it enforced what the user wrote);
- **tolerance**: the guard's own (``--tolerance``, 64 MiB by default), for
  every slice. Nothing a user sets moves it: at 802aae2 it was the largest
  ``HAMI_CONTEXT_OVERHEAD`` among a slice's processes, so one process of hers
  with ``HAMI_CONTEXT_OVERHEAD=1g`` hid a 1 GiB bypass (issue 39);
- **allowance**: what the agent saw the slice hold while it was within its
  cap: memory every process got within the cap in force when it got it. The
  agent keeps it from look to look (in its report, so a restart keeps it
  too): within the cap it is all the slice holds; past the cap it can only
  shrink (as processes free memory), never grow. A slice the agent has no
  history of has none: nothing it holds past its cap was seen allowed.

The slice is **over** when real > max(limit, allowance) + tolerance: only bytes
no cap ever allowed make it over (a process without the library, counters
rewritten by hand, anything past what the library let through). A slice whose
real use passes a lowered cap by memory it held before the change is
**held**: the library refuses it new memory until its use falls; nobody is
ended or parked for it.

None of this reads what a slice's processes charged themselves in their
slice file: the user writes that file, and a counter she zeroed, or a slot
charged with what it holds, must not make the guard look away (issue 33).
Each process has an allowance of its own as well, what the agent saw it hold
while its slice was within its cap, and shrinking past it the same way.

Why a tolerance at all: the library charges what a program allocates, while
the driver reports the process's whole footprint, and the two part by about
one context. One context's worth keeps an honest slice from ever being over,
and is far below what a bypass takes. How large a context is on the GPUs of
a node is the administrator's to say (``--tolerance``), beside the library's
``HAMI_CONTEXT_OVERHEAD`` in the kernels' environment: a process's own
environment is its user's to set, and is not read here.

Only over slices are acted on, and only their own processes: every process
considered here was attributed to that slice (:mod:`..facts.attribution`).
When a slice is over, processes are chosen one at a time, in this order,
until the slice's real bytes (NVML's figures less what the chosen processes
held) are within max(limit, allowance) + tolerance:

1. processes without the preload library first, the newest first: the
   slice's own accounting does not see them;
2. then processes under the library holding more than their own allowance,
   the largest excess first (the newest first among equals).

A process holding no more than its allowance is never chosen: it got its
memory within the cap in force. Neither is a process holding no memory on
that GPU, PID 1 or the agent itself. When one process is chosen for one GPU,
its bytes on the slice's other GPUs count as freed there too, and so do they
in later intervals while NVML still lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MiB = 1 << 20
DEFAULT_TOLERANCE = 64 * MiB
OK, OVER, HELD = "ok", "over", "held"


@dataclass
class ProcessUse:
    """One process of a slice on one GPU. *allowed_bytes*: what the agent saw it
    hold while its slice was within the cap (None: never seen so: nothing);
    *charged_bytes*: what its slot says it was charged (shown, never decided on)."""

    pid: int
    start_ticks: int
    real_bytes: int
    preload: bool
    attributed_by: str
    uid: int | None = None
    user: str | None = None
    charged_bytes: int | None = None
    command: str | None = None
    allowed_bytes: int | None = None

    def excess_bytes(self):
        """What it holds beyond what it was seen allowed."""
        return max(0, self.real_bytes - (self.allowed_bytes or 0))

    def next_allowed(self, within):
        """Its allowance for the next look: all it holds while its slice is
        *within* its cap, else never more than before."""
        return self.real_bytes if within else min(self.allowed_bytes or 0, self.real_bytes)

    def as_report(self):
        return {"pid": self.pid, "start_ticks": self.start_ticks, "real_bytes": self.real_bytes,
                "preload": self.preload, "attributed_by": self.attributed_by, "user": self.user,
                "charged_bytes": self.charged_bytes, "allowed_bytes": self.allowed_bytes}


@dataclass
class SliceGpu:
    """One slice on one GPU at one look. *device* is the slice device index
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
    allowance_bytes: int | None = None  # see the module; None: no history of it
    limits_trusted: bool = True  # False: its limits are its user's word, and limit_bytes is 0
    error: str | None = None  # why its slice file could not be read (held to its limits file)

    @property
    def held_bytes(self):
        """What it holds that the cap in force when it was taken allowed."""
        return min(self.real_bytes, self.allowance_bytes or 0)

    @property
    def allowed_bytes(self):
        return max(self.limit_bytes, self.held_bytes)

    @property
    def within_cap(self):
        return not is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes)

    @property
    def over(self):
        return is_over(self.real_bytes, self.limit_bytes, self.tolerance_bytes, self.held_bytes)

    @property
    def state(self):
        if self.over:
            return OVER
        return OK if self.within_cap else HELD

    def next_allowance(self):
        """The allowance for the next look: within the cap, all it holds (the cap
        in force allowed it); past it, never more than before."""
        return self.real_bytes if self.within_cap else min(self.allowance_bytes or 0, self.real_bytes)

    def as_report(self):
        return {"real_bytes": self.real_bytes, "reported_bytes": self.reported_bytes,
                "limit_bytes": self.limit_bytes, "tolerance_bytes": self.tolerance_bytes,
                "held_bytes": self.held_bytes, "allowance_bytes": self.allowance_bytes,
                "state": self.state, "limits_trusted": self.limits_trusted,
                "processes": [p.as_report() for p in sorted(self.processes, key=lambda p: p.pid)]}


def is_over(real, limit, tolerance, held=0):
    """Over the cap: a cap is set (0 is none) and real passes it, or the bytes
    held from before a lowered cap if more, by more than the tolerance."""
    return limit > 0 and real > max(limit, held) + tolerance


def protected_pids():
    """Never ended, whatever they are charged to: PID 1 and the agent itself."""
    return {1, os.getpid()}


def victim_order(processes):
    """Processes without the preload first (the newest first), then those under
    it holding more than their allowance (the largest excess first); never one
    that holds no more than its allowance."""
    bypass = [p for p in processes if not p.preload]
    excess = [p for p in processes if p.preload and p.excess_bytes() > 0]
    return (sorted(bypass, key=lambda p: (-p.start_ticks, -p.pid))
            + sorted(excess, key=lambda p: (-p.excess_bytes(), -p.start_ticks, -p.pid)))


@dataclass(frozen=True)
class Kill:
    """Act on *process* because of *gpu*; *real_before*: the slice's real bytes on
    that GPU (less what was already acted on) when this one was chosen."""

    gpu: SliceGpu
    process: ProcessUse
    real_before: int


def plan_kills(gpus, protected=None, only=None, ended=()):
    """The processes to act on for one slice's *gpus* (its :class:`SliceGpu` list),
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
        for p in victim_order(g.processes):
            if not is_over(real, g.limit_bytes, g.tolerance_bytes, held):
                break
            if p.pid in ended or p.pid in protected or p.real_bytes <= 0:
                continue
            plan.append(Kill(g, p, real))
            ended.add(p.pid)
            real -= p.real_bytes
    return plan


def measure(gpus, placed, slices, default_tolerance=DEFAULT_TOLERANCE, memory=None):
    """``({slice name: {uuid: SliceGpu}}, unattributed)`` for this look.

    *gpus*: the UUIDs whose processes were read; *placed*: the look's
    :class:`~..facts.look.Placed` entries; *slices*: the
    :class:`~..facts.slices.SliceSet`; *memory*: the allowances kept so far
    (:class:`Allowances`); *default_tolerance*: the guard's tolerance (every
    slice's). Every enforced slice gets an entry for each GPU read that it
    has met or where it has processes; a GPU that could not be read gets none
    (nothing is known there, so nothing is acted on).
    """
    memory = memory if memory is not None else Allowances()
    out = {name: {d.uuid: _slice_gpu(seen, d.uuid, default_tolerance, memory)
                  for d in (seen.snapshot.devices if seen.snapshot else ()) if d.uuid in gpus}
           for name, seen in slices.enforced.items()}
    unattributed = []
    for p in placed:
        seen = p.attribution.seen
        if seen is None:
            unattributed.append({"pid": p.facts.pid, "uuid": p.uuid, "real_bytes": p.used_bytes,
                                 "user": p.facts.user, "uid": p.facts.uid, "why": p.attribution.why})
            continue
        g = out[seen.name].get(p.uuid)
        if g is None:  # a GPU the slice's own processes never met: its default entry holds
            g = out[seen.name][p.uuid] = _slice_gpu(seen, p.uuid, default_tolerance, memory)
        g.real_bytes += p.used_bytes
        slot = p.attribution.slot
        charged = None
        if slot is not None and g.device is not None:
            charged = max(0, (slot.memory_used or {}).get(g.device, 0) - (slot.driver_bytes or {}).get(g.device, 0))
        g.processes.append(ProcessUse(
            p.facts.pid, p.facts.start_ticks, p.used_bytes, p.attribution.preload, p.attribution.by,
            p.facts.uid, p.facts.user, charged, getattr(p.facts, "command", None),
            memory.process.get((seen.name, p.uuid, p.facts.pid, p.facts.start_ticks))))
    return out, unattributed


def _slice_gpu(seen, uuid, tolerance, memory):
    d = seen.device(uuid)
    trusted = seen.limits_trusted
    return SliceGpu(seen.name, str(seen.path), uuid, d.index if d else None, 0,
                    seen.reported_bytes(uuid), seen.limit_bytes(uuid) if trusted else 0, tolerance,
                    allowance_bytes=memory.slice.get((seen.name, uuid)), limits_trusted=trusted,
                    error=seen.error if seen.snapshot is None else None)


@dataclass
class Allowances:
    """What the agent saw allowed, kept from look to look: per ``(slice, uuid)``
    and per ``(slice, uuid, pid, start ticks)``."""

    slice: dict = field(default_factory=dict)
    process: dict = field(default_factory=dict)

    def advance(self, measured, read):
        """The allowances after this look's *measured* slices; a GPU not *read*
        keeps what was known of it."""
        keep = {k: v for k, v in self.slice.items() if k[1] not in read}
        keep_p = {k: v for k, v in self.process.items() if k[1] not in read}
        for name, gpus in measured.items():
            for uuid, g in gpus.items():
                keep[(name, uuid)] = g.next_allowance()
                for p in g.processes:
                    keep_p[(name, uuid, p.pid, p.start_ticks)] = p.next_allowed(g.within_cap)
        return Allowances(keep, keep_p)
