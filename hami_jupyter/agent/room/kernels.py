"""Which kernels hold memory on a GPU, how long each has been idle, and which may be parked.

A *kernel* is the processes of one Jupyter kernel id in one slice (the
provisioner gives each its ``HAMI_KERNEL_ID``, which its slot records); a
process with no kernel id is a kernel of its own. Parking one process of a
kernel and not the others would stop the kernel just the same and free less,
so whole kernels are parked.

Every kernel here is made of facts (:func:`gather`): processes NVML lists on
the GPU with bytes, each matched by the agent to a live slot of a slice whose
file its owner owns (:mod:`hami_jupyter.agent.facts.attribution`), with its
host PID, its NVML bytes, its slice's NVML bytes on that GPU, the limits and
guarantee in force from the root-owned limits file, and its last activity as
the agent knows it (:mod:`hami_jupyter.agent.facts.activity`). A slot that
names no process the agent sees is no kernel at all. What a slot claims (its
last GPU call, its park state, its wait, its charge) and what its Jupyter
server publishes (its last message, a running cell) are its user's word: they
may make her kernel idler, never busier, never another's.

A kernel may be parked to make room for another's allocation when all of
these hold (:func:`judge`):

- it is not the requester's kernel;
- it runs on the GPU: the agent is not parking it already, and its slots do
  not say it is being parked or coming back while the driver holds it so
  (locked or checkpointed: someone else's park or its own resume), or for less
  than :data:`AWAY_GRACE_S` (a park's first steps come before the driver's
  lock), or that it parked itself (the fast park) while NVML lists no more
  than :data:`PARKED_ITSELF_MAX` for it. A slot that says so otherwise while
  NVML lists its bytes and the driver has it running is not believed;
- none of its processes asks the agent for room itself (it is in the queue,
  or was answered a moment ago: it asks again in a second);
- it is idle: its last GPU activity as the agent knows it is at least
  ``min_idle_seconds`` ago;
- its slice holds more than its guarantee on that GPU, by NVML (the guarantee
  is the limit when none is set: a slice that is not oversubscribed is never
  parked for room). A slice whose limits are its user's own word (no limits
  file) has no guarantee.

The idlest is parked first (:func:`plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...slice import registry
from ...slice.layout import HAMI_FAST_DONE, HAMI_PARK_PARKED, HAMI_PARK_PARKING, HAMI_PARK_RUNNING
from ...slice.size import format_size

AWAY_GRACE_S = 3.0  # a slot saying its process is away, the driver disagreeing, is believed this long
# A process parked by itself (the fast park: its memory in host memory, its
# context and small allocations left on the GPU) runs for the driver; its slot
# saying so is believed while NVML lists no more than this for it: parking it
# again would free little, and a checkpoint (the hold) would leave it for an
# administrator to bring back.
PARKED_ITSELF_MAX = 2 << 30


@dataclass
class Kernel:
    """One kernel on one GPU.

    *pids*: its processes' host PIDs; *processes*: ``(pid, start ticks)`` of
    each, what the actor checks before it acts; *bytes*: what it holds on the
    GPU (NVML); *last_active_unix*: its last GPU activity as the agent knows
    it; *state*: ``running``, or what its slots say while believed
    (``parking``, ``parked``, ``resuming``); *held*/*guarantee*: its slice's
    NVML bytes and guarantee on the GPU (a guarantee of 0 with trusted limits:
    the slice may hold all of it).
    """

    slice: str
    path: Path
    kernel_id: str
    pids: tuple
    user: str | None
    bytes: int = 0
    last_active_unix: float = 0.0
    state: str = "running"
    waiting: bool = False
    held: int = 0
    guarantee: int = 0
    limits_trusted: bool = True
    processes: tuple = field(default=())  # (host pid, start ticks) of each
    slots: tuple = field(default=())  # each one's slot index in the slice file
    bytes_of: tuple = field(default=())  # (host pid, NVML bytes) of each

    @property
    def label(self):
        return f"kernel {self.kernel_id}" if self.kernel_id else f"process {self.pids[0]}"

    def idle_s(self, now):
        return max(0.0, now - self.last_active_unix)

    def record(self):
        """The kernel as the report and the audit log name it."""
        return {"slice": self.slice, "kernel": self.kernel_id or None, "pids": list(self.pids),
                "user": self.user, "bytes": self.bytes}


def guarantee_bytes(limits):
    """The bytes a slice is guaranteed under *limits* (a :class:`~hami_jupyter.slice.limits.Limits`):
    its guarantee, else its limit; 0 when it has neither (all of the GPU)."""
    return limits.memory_guarantee or limits.memory_limit


def _stage(slots):
    stages = {s.park_stage() for s in slots}
    for stage, name in ((HAMI_PARK_PARKED, "parked"), (HAMI_PARK_PARKING, "parking")):
        if stage in stages:
            return name
    return "running" if stages == {HAMI_PARK_RUNNING} else "resuming"


def claimed_activity(slot, entry=None):
    """When the slot (and the kernel's registry *entry*) say the process last
    used the GPU or got a message, in Unix seconds: its user's word."""
    resumed = slot.park_unix_ns if slot.park_state == HAMI_PARK_RUNNING else 0
    ns = max(slot.gpu_active_unix_ns or slot.started_unix_ns, resumed)
    return max(ns / 1e9, entry.last_activity_unix if entry is not None else 0.0)


def _registry(path, cache):
    """``{kernel id: registry entry}`` of the slice at *path* (read once per look)."""
    if path not in cache:
        try:
            cache[path] = {e.kernel_id: e for e in registry.kernels(path, include_dead=True)}
        except OSError:
            cache[path] = {}
    return cache[path]


def gather(look, uuid, activity, now, asking=frozenset(), acting=frozenset()):
    """The kernels on GPU *uuid* in *look* (a :class:`~hami_jupyter.agent.facts.look.Look`,
    whose ``driver_states`` hold the driver's word on processes whose slots say
    they are off the GPU).

    *activity*: the agent's :class:`~hami_jupyter.agent.facts.activity.Activity`;
    *asking*: host PIDs that ask the agent for room now; *acting*: host PIDs the
    actor is at work on.
    """
    groups = {}
    for p in look.on(uuid):
        a = p.attribution
        if a.seen is None or a.slot is None or p.used_bytes <= 0:
            continue  # a process of no slice, without the library, or holding nothing here
        groups.setdefault((a.seen.name, a.slot.kernel_id or f"\0{p.facts.pid}"), []).append(p)
    found, cache = [], {}
    for (name, _), procs in sorted(groups.items()):
        seen = procs[0].attribution.seen
        kernel_id = procs[0].attribution.slot.kernel_id
        entry = _registry(seen.path, cache).get(kernel_id) if kernel_id else None
        slots = [p.attribution.slot for p in procs]
        last = max(activity.last_active(p.facts, claimed_activity(p.attribution.slot, entry), now) for p in procs)
        state = _stage(slots) if any(_away(p, activity, now, look.driver_states) for p in procs) else "running"
        if any(p.facts.pid in acting for p in procs):
            state = "parking"
        limits = seen.limits(uuid)
        found.append(Kernel(
            slice=name, path=seen.path, kernel_id=kernel_id, pids=tuple(p.facts.pid for p in procs),
            user=next((p.facts.user for p in procs if p.facts.user), None),
            bytes=sum(p.used_bytes for p in procs), last_active_unix=last, state=state,
            waiting=any(p.facts.pid in asking for p in procs), held=look.slice_bytes(name, uuid),
            guarantee=guarantee_bytes(limits) if seen.limits_trusted else 0,
            limits_trusted=seen.limits_trusted,
            processes=tuple((p.facts.pid, p.facts.start_ticks) for p in procs),
            slots=tuple(p.attribution.slot.index for p in procs),
            bytes_of=tuple((p.facts.pid, p.used_bytes) for p in procs)))
    return found


def _away(p, activity, now, driver_states):
    """Whether process *p*'s slot, saying it is off the GPU while NVML lists its
    bytes, is believed: for :data:`AWAY_GRACE_S`, and after that only while the
    driver holds it locked or checkpointed, or while it says it parked itself
    and NVML lists no more than :data:`PARKED_ITSELF_MAX` for it."""
    away = activity.away_for(p.facts, now)
    if not away:
        return False
    if away < AWAY_GRACE_S or driver_states.get(p.facts.pid) in ("locked", "checkpointed"):
        return True
    slot = p.attribution.slot
    return (slot.park_state == HAMI_PARK_PARKED and slot.park_fast == HAMI_FAST_DONE
            and p.used_bytes <= PARKED_ITSELF_MAX)


@dataclass(frozen=True)
class Requester:
    """Whose request it is: its slice, kernel id ("" for none) and host PID.
    :data:`NOBODY` (no slice) owns no kernel: the headroom's parks are for no one's."""

    slice: str
    kernel_id: str
    pid: int

    def owns(self, kernel):
        if not self.slice or kernel.slice != self.slice:
            return False
        return kernel.kernel_id == self.kernel_id if self.kernel_id else self.pid in kernel.pids


NOBODY = Requester("", "", 0)


def why_not(kernel, requester, min_idle, now):
    """Why *kernel* may not be parked for *requester*, or None when it may."""
    if requester.owns(kernel):
        return "the requester's own kernel"
    if kernel.state != "running":
        return f"{kernel.state} already"
    if kernel.waiting:
        return "it waits for GPU room itself"
    idle = kernel.idle_s(now)
    if idle < min_idle:
        return f"active {idle:.0f} s ago (parked only after {min_idle:g} s idle)"
    if kernel.limits_trusted and not kernel.guarantee:
        return f"slice {kernel.slice} has neither a limit nor a guarantee on this GPU"
    if kernel.held <= kernel.guarantee:
        return (f"slice {kernel.slice} holds {format_size(kernel.held)}, within its "
                f"{format_size(kernel.guarantee)} guarantee")
    return None


def judge(kernels, requester, min_idle, now):
    """``(eligible, skipped)``: the kernels that may be parked, idlest first, and
    ``[(kernel, why not)]`` of the others."""
    eligible, skipped = [], []
    for k in kernels:
        why = why_not(k, requester, min_idle, now)
        if why is None:
            eligible.append(k)
        else:
            skipped.append((k, why))
    eligible.sort(key=lambda k: (k.last_active_unix, k.slice, k.kernel_id, k.pids))
    return eligible, skipped


def plan(eligible, need):
    """The idlest kernels, in order, whose bytes together cover *need*: the
    last one chosen is the one that covers the rest, and none after it. None
    when all of them together do not. A slice's kernels count only while the
    slice, less what is chosen of it, still holds more than its guarantee."""
    chosen, total = _take(eligible, need)
    return chosen if total >= need else None


def coverable(eligible):
    """The bytes all of *eligible* could free together, by :func:`plan`'s rule."""
    return _take(eligible, float("inf"))[1]


def why_none(eligible, skipped, failed_note="", need=None):
    """Why no kernel was parked, from what :func:`judge` found: how little the
    kernels that may be parked could free against *need* (or that none may),
    *failed_note*, then ``. Not parked: ...`` with each other kernel's reason.
    One line; sizes that round alike are said in bytes too."""
    if eligible:
        could = coverable(eligible)
        said = format_size(could)
        if need is not None and format_size(need) == said and need != could:
            said = f"{said} ({could} bytes, {need} needed)"
        text = f"the {len(eligible)} kernel(s) that may be parked could free only {said}, so none was parked"
    else:
        text = "no kernel may be parked"
    text += failed_note
    if skipped:
        text += ". Not parked: " + "; ".join(f"{k.label} of {k.slice}: {why}" for k, why in skipped)
    return text


def _take(eligible, need):
    chosen, total, held = [], 0, {}
    for k in eligible:
        if total >= need:
            break
        left = held.get(k.slice, k.held)
        if left <= k.guarantee:
            continue  # the slice's earlier kernels took it down to its guarantee
        chosen.append(k)
        total += k.bytes
        held[k.slice] = left - k.bytes
    return chosen, total
