"""Which kernels hold memory on a GPU, how long each has been idle, and which may be parked.

A *kernel* is the processes of one Jupyter kernel id in one slice (the
provisioner gives each its ``HAMI_KERNEL_ID``, which its slot records); a
process with no kernel id is a kernel of its own. Parking one process of a
kernel and not the others would stop the kernel just the same and free less,
so the broker parks whole kernels.

A kernel may be parked to make room for another's allocation when all of
these hold (:func:`judge`):

- it is not the requester's kernel;
- it runs on the GPU (not parked, parking or resuming) and none of its
  processes waits for GPU room itself (a waiting process makes no driver
  call, so it would look idle);
- it is idle: no cell runs in it (its Jupyter server says ``busy``), and the
  latest of its processes' driver calls (``gpu_active_unix_ns``), of their
  last resume from a park (``park_unix_ns``: a parked process comes back
  only when something in it calls the driver) and of its server's last
  activity (``last_activity_unix``, kernel registry) is at least
  ``min_idle_seconds`` ago;
- its slice holds more than its guarantee on that GPU (the guarantee is the
  limit when none is set: a slice that is not oversubscribed is never parked
  for room);
- the broker can park it: every process of it lives in the broker's PID
  namespace, as ``hami-park`` finds slots by the PID it is given.

The idlest is parked first (:func:`plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..slice import registry
from ..slice.layout import HAMI_PARK_PARKED, HAMI_PARK_PARKING, HAMI_PARK_RUNNING
from ..slice.size import format_size


@dataclass
class Kernel:
    """One kernel on one GPU.

    *pids*: its processes as its slots record them (PIDs of their own
    namespace); *bytes*: what it holds on the GPU (NVML's figure for each
    process the broker can see, else the process's charge in the slice file);
    *last_active_unix*: the latest of its driver calls and its server's
    activity; *state*: ``running``, ``parking``, ``parked`` or ``resuming``;
    *held*/*guarantee*: its slice's charge and guarantee on the GPU (a
    guarantee of 0: the slice may hold all of it).
    """

    slice: str
    path: Path
    kernel_id: str
    pids: tuple
    user: str | None
    bytes: int = 0
    last_active_unix: float = 0.0
    busy: bool = False
    state: str = "running"
    waiting: bool = False
    foreign: bool = False  # a process of it lives in another PID namespace
    held: int = 0
    guarantee: int = 0
    host_pids: tuple = field(default=())

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


def _last_call(slot):
    """When the process last used the GPU, in Unix ns: its latest driver call,
    or its latest resume (which only a call asks for) while it runs."""
    resumed = slot.park_unix_ns if slot.park_state == HAMI_PARK_RUNNING else 0
    return max(slot.gpu_active_unix_ns or slot.started_unix_ns, resumed)


def _activity(path, cache):
    """``{kernel id: registry entry}`` of the slice at *path* (read once per look).
    Entries whose process this PID namespace does not see are kept, never
    deleted: a kernel in a container's PID namespace is alive there, and its
    id is only looked up for a kernel that holds live slots."""
    if path not in cache:
        cache[path] = {e.kernel_id: e for e in registry.kernels(path, include_dead=True)}
    return cache[path]


def gather(slices, uuid, holders, placed, own_ns):
    """The kernels of every slice in *slices* (a guard :class:`~hami_jupyter.guard.slices.SliceSet`)
    that hold memory on GPU *uuid*, or are being parked or resumed there.

    *holders*: ``{host pid: bytes}`` NVML lists on the GPU; *placed*: ``{host
    pid: (slice name, slot index, user)}`` of those the broker matched to a
    slot; *own_ns*: the broker's PID namespace (its inode).
    """
    by_slot = {(name, index): (pid, user) for pid, (name, index, user) in placed.items()}
    found, activity = [], {}
    for name, seen in sorted(slices.readable.items()):
        device = seen.device(uuid)
        if device is None:
            continue  # the slice never met this GPU
        limits = device.limit
        groups = {}
        for slot in seen.snapshot.slots:
            key = slot.kernel_id or f"\0{slot.pid}"
            groups.setdefault(key, []).append(slot)
        for key, slots in sorted(groups.items()):
            kernel_id = slots[0].kernel_id
            host, users, total = [], set(), 0
            for s in slots:
                hit = by_slot.get((name, s.index))
                if hit is not None:
                    host.append(hit[0])
                    users.add(hit[1])
                    total += holders.get(hit[0], 0)
                else:
                    total += s.memory_used.get(device.index, 0)
            state = _stage(slots)
            if total <= 0 and state == "running":
                continue
            k = Kernel(
                slice=name, path=seen.path, kernel_id=kernel_id, pids=tuple(s.pid for s in slots),
                user=next(iter(sorted(u for u in users if u)), None), bytes=total,
                last_active_unix=max((_last_call(s) for s in slots), default=0) / 1e9,
                state=state, waiting=any(s.room_wait_since_unix_ns for s in slots),
                foreign=any(s.pid_ns not in (0, own_ns) for s in slots),
                held=device.memory_used, guarantee=guarantee_bytes(limits), host_pids=tuple(host))
            if kernel_id:
                entry = _activity(seen.path, activity).get(kernel_id)
                if entry is not None:
                    k.busy = entry.busy
                    k.last_active_unix = max(k.last_active_unix, entry.last_activity_unix)
            found.append(k)
    return found


@dataclass(frozen=True)
class Requester:
    """Whose request it is: its slice, kernel id ("" for none) and PID (its slot's).
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
    if kernel.busy:
        return "a cell runs in it"
    idle = kernel.idle_s(now)
    if idle < min_idle:
        return f"active {idle:.0f} s ago (parked only after {min_idle:g} s idle)"
    if not kernel.guarantee:
        return f"slice {kernel.slice} has neither a limit nor a guarantee on this GPU"
    if kernel.held <= kernel.guarantee:
        return (f"slice {kernel.slice} holds {format_size(kernel.held)}, within its "
                f"{format_size(kernel.guarantee)} guarantee")
    if kernel.foreign:
        return "it runs in another PID namespace (a container) than the broker's: hami-park cannot park it"
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


def why_none(eligible, skipped, failed_note=""):
    """Why no kernel was parked, from what :func:`judge` found: how little the
    kernels that may be parked could free (or that none may), *failed_note*,
    then ``. Not parked: ...`` with each other kernel's reason. One line."""
    if eligible:
        text = (f"the {len(eligible)} kernel(s) that may be parked could free only "
                f"{format_size(coverable(eligible))}, so none was parked")
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
