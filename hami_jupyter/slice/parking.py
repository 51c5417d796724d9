"""Parking a kernel: its GPU state to host memory while it is idle, and back.

The moves themselves are the CUDA driver's process checkpoint API, run by
``hami-park`` (native/park/) on each process of the kernel that holds GPU
memory, and by the parked process itself when it wants its state back
(native/src/park.c). Here is what the fronts need, the Jupyter server
extension, ``hami-jupyter park|resume`` and the admin panel alike:

- :func:`park_kernel` checks that there is something to park and room in host
  memory for it, then parks every process of the kernel; if one fails, the
  ones already parked are asked back and the error says why (:func:`park_process`
  does the same for a process of no kernel);
- :func:`request_resume` marks the kernel's parked processes as wanted (one
  flag in each slot): each process's parking thread then finds room under the
  slice's cap and on the GPU, restores and unlocks itself;
  :func:`wait_resumed` watches that happen (and says what it waits for);
  :func:`cancel_resume` takes the wish back (the kernel stays parked).

All state lives in the slice file (each slot's park fields) and in the
driver, none in the caller: a server that restarts loses nothing, and a
parked process that calls CUDA by itself asks for its state back on its own.
"""

import os
import subprocess
import time
from dataclasses import dataclass

from .. import native
from .file import read_snapshot
from .layout import (
    HAMI_PARK_PARKED,
    HAMI_PARK_PARKING,
    HAMI_PARK_RUNNING,
    HamiSlot,
    slot_offset,
)
from .paths import default_root, list_slice_paths, open_trusted
from .size import format_size
from .status import PARK_REASONS, PARK_WAITS

HEARTBEAT_S = 2.0  # a process whose parking thread is silent this long cannot resume itself
MOVE_WAIT_S = 2.0  # its parking thread moves the charge to parked[] within a tick (20 ms)
LOCK_TIMEOUT_MS = 10000
# Why a kernel is parked, as hami-park writes it into each slot (park_reason):
# "idle" (the server's idle policy), "asked" (a user or administrator: REST,
# CLI, panel), "room" (the memory broker), "guard".
REASONS = tuple(PARK_REASONS.values())


class ParkError(RuntimeError):
    """A kernel was not parked, or not resumed; the message says why. *code*:
    hami-park's CUresult for it, when hami-park said (None otherwise)."""

    def __init__(self, why, code=None):
        super().__init__(why)
        self.code = code


class ResumeTimeout(ParkError):
    """A resume did not happen in time; the kernel stays parked, nothing lost."""


@dataclass
class ParkResult:
    kernel_id: str
    bytes: int  # moved to host memory, all processes together
    seconds: float
    pids: tuple
    held: tuple = ()  # of those, the ones held by the driver alone (an administrator brings them back)


def kernel_slots(snapshot, kernel_id):
    """The live slots (processes) of *kernel_id* in a slice *snapshot*."""
    return [s for s in snapshot.slots if s.kernel_id == kernel_id]


def park_state(snapshot, kernel_id):
    """"running", "parking", "parked" or "resuming" for the kernel, None when it
    has no process in the slice: the state of its process furthest from the GPU."""
    states = {s.park_stage() for s in kernel_slots(snapshot, kernel_id)}
    if not states:
        return None
    for state, name in ((HAMI_PARK_PARKED, "parked"), (HAMI_PARK_PARKING, "parking")):
        if state in states:
            return name
    return "running" if states == {HAMI_PARK_RUNNING} else "resuming"


def host_available():
    """MemAvailable of /proc/meminfo, in bytes (0 when it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tool_env():
    """The environment hami-park runs in: this one, without the preload library."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _refusal(done):
    """ParkError of a hami-park run that did not answer "ok": its reason and CUresult."""
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if answer.startswith("error "):
        _, code, why = (answer.split(" ", 2) + [""])[:3]
        return ParkError(why, int(code) if code.isdigit() else None)
    return ParkError(done.stderr.strip() or f"hami-park exited {done.returncode}")


def park_one(path, pid, lock_timeout_ms=LOCK_TIMEOUT_MS, reason="asked"):
    """Park process *pid* through its slot in the slice file at *path* for
    *reason* (one of :data:`REASONS`), with none of :func:`park_kernel`'s
    checks; ``(bytes, seconds)``, or ParkError with hami-park's reason and code."""
    tool = str(native.park_tool_path())
    try:
        done = subprocess.run([tool, "park", os.fspath(path), str(pid), str(lock_timeout_ms), reason],
                              env=_tool_env(), capture_output=True, text=True,
                              timeout=lock_timeout_ms / 1000 + 600)
    except subprocess.TimeoutExpired:
        raise ParkError(f"hami-park did not finish parking process {pid}") from None
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if answer.startswith("ok "):
        # "ok BYTES SECONDS [fast|checkpoint]": the path is hami-park's word on how
        _, moved, seconds = answer.split()[:3]
        return int(moved), float(seconds)
    raise _refusal(done)


def _run_tool(args, timeout):
    """``hami-park ARGS``: the rest of its "ok ..." answer, or ParkError with its reason."""
    tool = str(native.park_tool_path())
    try:
        done = subprocess.run([tool, *args], env=_tool_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ParkError(f"hami-park {args[0]} {args[1]} did not finish within {timeout:.0f} s") from None
    answer = (done.stdout.strip().splitlines() or [""])[-1]
    if answer == "ok" or answer.startswith("ok "):
        return answer[3:]
    raise _refusal(done)


def hold_process(pid, lock_timeout_ms=LOCK_TIMEOUT_MS):
    """The guard's park of *pid*, with or without the preload library: its GPU
    state to host memory, kept there until :func:`restore_process`. Seconds
    taken, or ParkError."""
    return float(_run_tool(["hold", str(pid), str(lock_timeout_ms)], lock_timeout_ms / 1000 + 600) or 0)


def restore_process(pid):
    """Bring a held process's GPU state back and let it run; ParkError if the driver refuses."""
    _run_tool(["restore", str(pid)], 600)


def checkpoint_state(pid):
    """The driver's word on *pid*: "running", "locked", "checkpointed" or "failed"; ParkError."""
    return _run_tool(["state", str(pid)], 60)


def checkpoint_api():
    """None when the driver here has the process checkpoint API, else why not."""
    try:
        checkpoint_state(os.getpid())
    except ParkError as e:
        text = str(e)
        if "checkpoint API" in text or "cannot load libcuda" in text:
            return text
    except OSError as e:
        return f"cannot run hami-park: {e}"
    return None


def want_back(path, indexes, value=1):
    """Set park_wanted of the slots at *indexes* of the slice file at *path*
    (one aligned 4-byte write each): their processes bring their state back
    themselves (0: the wish taken back)."""
    fd, _, _ = open_trusted(path, os.O_RDWR, "slice file")
    try:
        for index in indexes:
            os.pwrite(fd, int(value).to_bytes(4, "little"), slot_offset(index) + HamiSlot.park_wanted.offset)
    finally:
        os.close(fd)


def find_kernel(kernel_id, root=None):
    """The slice under *root* (default: the slice root) that a process of
    *kernel_id* runs in; ParkError when there is none."""
    root = root or default_root()
    for path in list_slice_paths(root):
        try:
            if kernel_slots(read_snapshot(path), kernel_id):
                return path
        except (OSError, ValueError):
            continue
    raise ParkError(f"no process of kernel {kernel_id} runs in a slice under {root}: check the "
                    "kernel id (hami-jupyter status lists them), and HAMI_SLICE_ROOT or --root "
                    "for the folder")


def park_kernel(path, kernel_id, *, host_reserve=0, lock_timeout_ms=LOCK_TIMEOUT_MS, reason="asked"):
    """Park every process of *kernel_id* in the slice at *path* that holds GPU
    memory; returns a :class:`ParkResult`. ParkError, with the kernel left
    running (every process unlocked), when it cannot: nothing to park, a
    process that could not resume itself, too little host memory (less than
    the bytes plus *host_reserve* available), or a step of the driver's.
    *reason* (one of :data:`REASONS`) goes into each slot, so that the
    kernel's user sees why (``%hami status``, the panel)."""
    if reason not in REASONS:
        raise ValueError(f"park reason must be one of {', '.join(REASONS)}, not {reason!r}")
    snap = read_snapshot(path)
    slots = kernel_slots(snap, kernel_id)
    if not slots:
        raise ParkError(f"kernel {kernel_id} has no process on the GPU in slice {snap.name!r}")
    if any(s.park_state != HAMI_PARK_RUNNING for s in slots):
        raise ParkError(f"kernel {kernel_id} is {park_state(snap, kernel_id)} already")
    return _park_slots(path, slots, f"kernel {kernel_id}", kernel_id, host_reserve, lock_timeout_ms, reason)


def park_process(path, pid, *, host_reserve=0, lock_timeout_ms=LOCK_TIMEOUT_MS, reason="asked"):
    """Park the one process *pid* (its slot's PID) of the slice at *path*, as
    :func:`park_kernel` parks a kernel's: for a process that belongs to no
    kernel (started outside Jupyter with ``HAMI_SLICE``), which is a kernel of
    its own. ParkError, with the process left running, when it cannot."""
    if reason not in REASONS:
        raise ValueError(f"park reason must be one of {', '.join(REASONS)}, not {reason!r}")
    slots = [s for s in read_snapshot(path).slots if s.pid == pid]
    if not slots:
        raise ParkError(f"process {pid} has no live slot in {path}")
    if slots[0].park_state != HAMI_PARK_RUNNING:
        raise ParkError(f"process {pid} is not running on the GPU (parked or being parked)")
    return _park_slots(path, slots[:1], f"process {pid}", slots[0].kernel_id, host_reserve, lock_timeout_ms,
                       reason)


def _park_slots(path, slots, what, kernel_id, host_reserve, lock_timeout_ms, reason):
    holding = [s for s in slots if sum(s.memory_used.values())]
    if not holding:
        raise ParkError(f"{what} holds no GPU memory: nothing to park")
    now = time.time_ns()
    silent = [s.pid for s in holding if now - s.active_unix_ns > HEARTBEAT_S * 1e9]
    if silent:
        raise ParkError(f"process(es) {silent} of {what} do not answer (their "
                        "parking thread is not running), so they could not bring their state "
                        "back: not parked")
    need = sum(sum(s.memory_used.values()) for s in holding)
    available = host_available()
    if available and need + host_reserve > available:
        raise ParkError(f"host memory too low to hold {what}'s GPU state: it needs "
                        f"{format_size(need)} plus {format_size(host_reserve)} kept free, and "
                        f"{format_size(available)} is available: not parked")
    started, parked, moved = time.monotonic(), [], 0
    try:
        for s in holding:
            bytes_, _ = park_one(path, s.pid, lock_timeout_ms, reason)
            parked.append(s)
            moved += bytes_
    except ParkError as e:
        if parked:
            want_back(path, [x.index for x in parked])
        raise ParkError(f"{what} was not parked: {e}") from None
    _wait_moved(path, {s.pid for s in parked})
    return ParkResult(kernel_id, moved, time.monotonic() - started, tuple(s.pid for s in parked))


def _wait_moved(path, pids):
    """Until each parked process's parking thread has moved its charge to parked[]."""
    deadline = time.monotonic() + MOVE_WAIT_S
    while time.monotonic() < deadline:
        slots = [s for s in read_snapshot(path).slots if s.pid in pids]
        if not any(s.charge_unmoved() for s in slots):
            return
        time.sleep(0.01)


def parked_bytes(snapshot, kernel_id):
    return sum(sum((s.parked or {}).values()) for s in kernel_slots(snapshot, kernel_id))


def request_resume(path, kernel_id):
    """Ask the kernel's parked (or parking) processes for their GPU state back.
    Returns the pids asked (none: nothing was parked)."""
    snap = read_snapshot(path)
    away = [s for s in kernel_slots(snap, kernel_id) if s.park_state != HAMI_PARK_RUNNING]
    if away:
        want_back(path, [x.index for x in away])
    return {s.pid for s in away}


def cancel_resume(path, kernel_id):
    """Take a resume wish back: the kernel stays parked (what it holds stays in host memory)."""
    snap = read_snapshot(path)
    wanted = [s for s in kernel_slots(snap, kernel_id) if s.park_wanted]
    if wanted:
        want_back(path, [x.index for x in wanted], 0)


def waiting_for(snapshot, kernel_id):
    """What a wanted resume of the kernel waits for, in words, or None."""
    for s in kernel_slots(snapshot, kernel_id):
        if s.park_wanted and s.park_wait in PARK_WAITS:
            return PARK_WAITS[s.park_wait]
    return None


def wait_resumed(path, kernel_id, timeout, on_wait=None, poll=0.02):
    """Until every process of the kernel runs on the GPU again (after
    :func:`request_resume`); returns the seconds it took. *on_wait(why)* hears,
    once per change, what the resume waits for. ResumeTimeout after *timeout*
    seconds, naming what it waited for."""
    started = time.monotonic()
    told = None
    while True:
        snap = read_snapshot(path)
        state = park_state(snap, kernel_id)
        if state in (None, "running"):
            return time.monotonic() - started
        why = waiting_for(snap, kernel_id)
        if why != told and on_wait is not None and why:
            on_wait(why)
        told = why
        if time.monotonic() - started > timeout:
            reason = f"it waited {timeout:g} s for {why}" if why else f"it took over {timeout:g} s"
            raise ResumeTimeout(f"kernel {kernel_id}'s GPU memory was not restored: {reason}; "
                                "it stays parked in host memory, nothing is lost")
        time.sleep(poll)


def resume_kernel(path, kernel_id, timeout=300.0, on_wait=None):
    """Ask for the kernel's GPU state back and wait; ``(bytes, seconds)``, bytes
    being what its parked processes hold on the GPU again (0: none was parked).
    ResumeTimeout (the wish taken back, the kernel still parked) after *timeout*."""
    asked = request_resume(path, kernel_id)
    if not asked:
        return 0, 0.0
    try:
        seconds = wait_resumed(path, kernel_id, timeout, on_wait)
    except ResumeTimeout:
        cancel_resume(path, kernel_id)
        raise
    back = [s for s in kernel_slots(read_snapshot(path), kernel_id) if s.pid in asked]
    return sum(sum((s.memory_used or {}).values()) for s in back), seconds
