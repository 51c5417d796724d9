"""The one actor of the node: it parks, holds and kills, one action on a process at a time.

Both policies act on processes: the guard parks (or ends) what passes a cap,
the room policy parks idle kernels for another's allocation. Through one
actor they cannot race: while it works on a process, no other action on that
process starts (:meth:`Actor.busy`; a second one is refused with
:class:`Busy`), and each policy sees what the actor is at work on when it
chooses. And a park that fails because someone else (a Jupyter server's idle
policy, say) is parking the same process ends nothing: the driver's own
state says the process is on its way off the GPU (:class:`ParkedElsewhere`).

Every action is on a process the agent matched itself: a host PID with the
start time it had in the look (checked again right before the act, so that a
PID reused in between is never hit), whose owner owns the slice it is
charged to.

- :meth:`Actor.park_kernel`: the room policy's park of a kernel. Host memory
  is checked against NVML's bytes (not the slots' claims). Each process is
  parked through its slot (``hami-park park``: its next cell brings it back by
  itself); one whose slot refuses (it says the process is parked or being
  parked, a parker holds it, or it claims more than host memory has) while the
  agent's facts say it holds idle memory is *held* instead (``hami-park
  hold``, as the guard parks): its user's claims make her kernel more
  parkable, never less, and an administrator brings it back. A step of the
  driver that fails undoes what was parked of the kernel.
- :meth:`Actor.hold`: the guard's park of one process, with or without the
  preload library (``hami-park hold``): only an administrator brings it back.
  Host memory is checked first, as for a kernel: NVML's bytes of the process
  plus the reserve must fit in what the host has available.
- :meth:`Actor.kill`: SIGKILL through a pidfd, if the PID still names the
  process looked at.

The processes held (by either policy) are kept in :attr:`Actor.held` until
they are gone or back on the GPU; the guard's report lists them, which is
where an administrator resumes or ends them (``hami-jupyter guard --resume``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from ..processes import end_process, start_ticks
from ..slice import parking
from ..slice.layout import HAMI_PARK_REFUSED_HOST, HAMI_PARK_REFUSED_PARKER, HAMI_PARK_REFUSED_STATE
from ..slice.size import format_size

# hami-park's own refusals, from what a slot says, never the driver's codes:
# "not running on the GPU (park state N)", "another parker is working on it",
# "host memory too low" (by the slot's charge). The agent's facts say otherwise.
# (The driver's out of memory, 2, is a checkpoint that found the GPU full: it
# is tried again once there is room, never held instead.)
CLAIM_REFUSALS = {HAMI_PARK_REFUSED_STATE, HAMI_PARK_REFUSED_PARKER, HAMI_PARK_REFUSED_HOST}

log = logging.getLogger("hami_jupyter.agent")


class Busy(parking.ParkError):
    """The actor is at work on that process already (for the other policy)."""


class ParkedElsewhere(parking.ParkError):
    """The driver holds the process locked or checkpointed: someone else parks it."""


class Actor:
    """Parks, holds and kills. *host_reserve*: host memory kept available after
    a park; *park_one*, *hold*, *state*, *end*: the tools (tests replace them)."""

    def __init__(self, host_reserve=0, proc="/proc", park_one=parking.park_one, hold=parking.hold_process,
                 state=parking.checkpoint_state, end=end_process, restore=parking.restore_process,
                 want_back=parking.want_back):
        self.host_reserve = host_reserve
        self.proc = proc
        self._park_one, self._hold, self._state = park_one, hold, state
        self._end, self._restore, self._want_back = end, restore, want_back
        self._lock = threading.Lock()
        self._acting = {}  # pid -> what for, while an action on it runs
        self.held = {}  # pid -> the record of a process held off the GPU (guard.json's "parked")

    # ---- one action at a time ---------------------------------------------------------

    def acting(self):
        """The PIDs the actor is at work on now."""
        with self._lock:
            return set(self._acting)

    def busy(self, pid):
        with self._lock:
            return pid in self._acting

    @contextlib.contextmanager
    def _on(self, pids, what):
        with self._lock:
            taken = [pid for pid in pids if pid in self._acting]
            if taken:
                raise Busy(f"process {taken[0]} is being acted on already ({self._acting[taken[0]]})")
            for pid in pids:
                self._acting[pid] = what
        try:
            yield
        finally:
            with self._lock:
                for pid in pids:
                    self._acting.pop(pid, None)

    def _same(self, pid, ticks):
        if start_ticks(pid, self.proc) != ticks:
            raise parking.ParkError(f"process {pid} is gone (or its PID names another process now)")

    # ---- the guard's acts -------------------------------------------------------------

    def hold(self, pid, ticks, record):
        """Park process *pid* (started at *ticks*) off the GPU until an
        administrator brings it back; seconds taken. *record*: what the report
        keeps of it while it is held (its ``process_bytes``, NVML's, are what
        host memory must hold). ParkedElsewhere when the driver holds it for
        someone else already; Busy; ParkError (host memory too low included)."""
        with self._on([pid], record.get("why", "a park")):
            self._same(pid, ticks)
            self._host_room(record.get("process_bytes") or 0, f"process {pid}")
            try:
                seconds = self._hold(pid)
            except parking.ParkError as e:
                raise self._elsewhere(pid, e) from None
            self.held[pid] = dict(record, pid=pid, start_ticks=ticks)
            return seconds

    def _elsewhere(self, pid, error):
        """*error* of a failed hold, or ParkedElsewhere when the driver says the
        process is locked or checkpointed (another parker's doing)."""
        try:
            state = self._state(pid)
        except (parking.ParkError, OSError):
            return error
        if state in ("locked", "checkpointed"):
            return ParkedElsewhere(f"the driver holds process {pid} {state} already (another parker's "
                                   f"work: a Jupyter server's idle park, say): {error}")
        return error

    def kill(self, pid, ticks):
        """SIGKILL *pid* if it still started at *ticks*: True when signalled,
        False when it is gone; PermissionError, Busy."""
        with self._on([pid], "an end"):
            return self._end(pid, ticks, self.proc)

    # ---- the room policy's act --------------------------------------------------------

    def park_kernel(self, kernel, reason="room", record=None):
        """Park every process of *kernel* (a :class:`~.room.kernels.Kernel`);
        a :class:`~hami_jupyter.slice.parking.ParkResult` whose ``held`` names
        the processes held instead of parked through their slots. ParkError,
        with the kernel left running, when it cannot be parked."""
        pids = [pid for pid, _ in kernel.processes]
        with self._on(pids, f"a park of {kernel.label}"):
            self._host_room(kernel.bytes, kernel.label)
            started, parked, held, moved = time.monotonic(), [], [], 0
            try:
                for (pid, ticks), index in zip(kernel.processes, kernel.slots):
                    self._same(pid, ticks)
                    try:
                        moved += self._park_one(kernel.path, pid, parking.LOCK_TIMEOUT_MS, reason)[0]
                        parked.append(index)
                    except parking.ParkError as e:
                        if e.code not in CLAIM_REFUSALS:
                            raise
                        log.warning("agent: %s of slice %s: its slot refuses a park (%s) while it holds "
                                    "idle memory on the GPU: held instead", kernel.label, kernel.slice, e)
                        self._hold(pid)
                        held.append(pid)
                        self.held[pid] = dict(record or {}, pid=pid, start_ticks=ticks, slice=kernel.slice,
                                              user=kernel.user, why=f"parked to make room; its slot said: {e}")
                        moved += dict(kernel.bytes_of).get(pid, 0)
            except parking.ParkError as e:
                self._undo(kernel, parked, held)
                raise parking.ParkError(f"{kernel.label} was not parked: {e}", e.code) from None
            return parking.ParkResult(kernel.kernel_id, moved, time.monotonic() - started, tuple(pids),
                                      tuple(held))

    def _host_room(self, needed, label):
        """ParkError unless host memory can take *needed* bytes of *label*'s GPU
        state with the reserve left over."""
        available = parking.host_available()
        if available and needed + self.host_reserve > available:
            raise parking.ParkError(
                f"host memory too low to hold {label}'s GPU state: it needs "
                f"{format_size(needed)} plus {format_size(self.host_reserve)} kept free, and "
                f"{format_size(available)} is available: not parked")

    def _undo(self, kernel, parked, held):
        if parked:
            try:
                self._want_back(kernel.path, parked)
            except OSError as e:
                log.error("agent: %s: could not ask its parked processes back: %s", kernel.label, e)
        for pid in held:
            self.held.pop(pid, None)
            try:
                self._restore(pid)
            except parking.ParkError as e:
                log.error("agent: %s: could not bring process %d back: %s", kernel.label, pid, e)

    # ---- what is held ----------------------------------------------------------------------

    def prune(self, on_gpu, fresh=()):
        """Forget the held processes that are gone (their PID gone, or another
        process's now) or back on a GPU (*on_gpu*: PIDs NVML lists with bytes:
        an administrator resumed them). *fresh*: held during this look, whose
        reading is from before the hold."""
        for pid, record in list(self.held.items()):
            if pid in fresh:
                continue
            ticks = start_ticks(pid, self.proc)
            if pid in on_gpu or ticks is None or ticks != record.get("start_ticks", ticks):
                del self.held[pid]
