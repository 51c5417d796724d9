"""One look at the node: every GPU process, its facts, and the slice it is charged to.

:class:`Node` holds what is worth keeping between looks (NVML started, the
slice files open and mapped, each process's ``/proc`` facts, which file a
process's environment names, the activity seen) and gives each policy a
:class:`Look`: NVML's processes and bytes, the slices under the root, and
each process placed, with its facts and its attribution. The guard's watch
looks every interval, a request for room and the headroom keeper look when
they need to; each look is also an observation of activity
(:mod:`.activity`), so that the agent's record of who used the GPU is built
from every look it takes.

The watch, the requests and the headroom keeper run in threads of their
own. A look is taken by one thread at a time (the slice files' and the
process table's caches are not for two at once); NVML's reader and the
attribution cache have locks of their own, held for one call at a time, so
that a request's admission or free-memory read never waits for a whole look
(a look of a busy node takes hundreds of milliseconds), and a look that is
fresh enough is handed out without any lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ...slice.layout import HAMI_PARK_RUNNING
from ...slice.parking import ParkError, checkpoint_state
from .activity import Activity
from .attribution import Attributor
from .nvml import NvmlReader
from .procs import ProcessTable, pid_namespace, read_facts
from .slices import SliceFiles

NOT_SEEN = ("not in the agent's /proc: it ended, or runs in a PID namespace the agent does not see")


@dataclass(frozen=True)
class Placed:
    """One NVML process on one GPU, with its facts and attribution."""

    uuid: str
    used_bytes: int
    facts: object  # procs.ProcessFacts
    attribution: object  # attribution.Attribution


@dataclass
class Look:
    """The node at one moment. *reading*: NVML's (:class:`~.nvml.Reading`);
    *slices*: the :class:`~.slices.SliceSet`; *placed*: every GPU process with
    its facts and attribution; *unseen*: report entries of NVML processes the
    agent's ``/proc`` does not show; *errors*: what could not be read;
    *driver_states*: the driver's word (``running``, ``locked``,
    ``checkpointed``, ...) on each process whose slot says it is off the GPU
    or on its way: a slot's word is checked against the driver's."""

    reading: object
    slices: object
    placed: list = field(default_factory=list)
    unseen: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    unix: float = 0.0
    driver_states: dict = field(default_factory=dict)  # pid -> the driver's checkpoint state

    def on(self, uuid):
        """The placed processes on GPU *uuid*."""
        return [p for p in self.placed if p.uuid == uuid]

    def slice_bytes(self, name, uuid):
        """What slice *name*'s processes hold on GPU *uuid*, by NVML."""
        return sum(p.used_bytes for p in self.placed
                   if p.uuid == uuid and p.attribution.seen is not None and p.attribution.seen.name == name)


class Node:
    """The node's facts under slice root *root*. *reader*: NVML (a test's
    stand-in); *proc*: where ``/proc`` is."""

    def __init__(self, root, reader=None, proc="/proc"):
        self.root = root
        self.proc = proc
        self.reader = reader if reader is not None else NvmlReader()
        self.slice_files = SliceFiles(root)
        self.procs = ProcessTable(proc)
        self.attributor = Attributor(proc)
        self.activity = Activity()
        self.own_ns = pid_namespace("self", proc)
        self._lock = threading.RLock()  # one look at a time
        self._nvml_lock = threading.Lock()  # the reader: one NVML call sequence at a time
        self._attr_lock = threading.Lock()  # the attribution cache
        self._latest = None

    def start(self):
        """Start NVML (NvmlUnavailable, with the reason, when it cannot)."""
        with self._nvml_lock:
            self.reader.start()

    def look(self, within=0.0):
        """A :class:`Look` of now, or the latest one when it is at most *within*
        seconds old (a request's admission may use one the watch just took);
        never raises for what it cannot read."""
        latest = self._latest
        if within and latest is not None and time.time() - latest.unix <= within:
            return latest
        with self._lock:
            latest = self._latest  # another thread's look, taken while this one waited
            if within and latest is not None and time.time() - latest.unix <= within:
                return latest
            errors = []
            with self._nvml_lock:
                reading = self.reader.read()
            errors.extend(reading.errors)
            slices = self.slice_files.read(errors)
            look = Look(reading, slices, errors=errors, unix=time.time())
            facts_of = {}
            for gp in reading.processes:
                if gp.pid not in facts_of:
                    facts_of[gp.pid] = self.procs.facts(gp.pid)
                facts = facts_of[gp.pid]
                if facts is None:
                    look.unseen.append({"pid": gp.pid, "uuid": gp.uuid, "real_bytes": gp.used_bytes,
                                        "user": None, "why": NOT_SEEN})
                    continue
                with self._attr_lock:
                    attribution = self.attributor.attribute(facts, slices)
                look.placed.append(Placed(gp.uuid, gp.used_bytes, facts, attribution))
            for p in look.placed:
                slot = p.attribution.slot
                if slot is not None and slot.park_state != HAMI_PARK_RUNNING:
                    look.driver_states[p.facts.pid] = self.driver_state(p.facts.pid)
            self.procs.keep(facts_of)
            with self._attr_lock:
                self.attributor.keep((f.pid, f.start_ticks) for f in facts_of.values() if f is not None)
            self.activity.observe(look.placed, set(reading.gpus), reading.busy, look.unix)
            self._latest = look
            return look

    def memory(self, uuid, errors):
        """``(total, free)`` bytes of GPU *uuid* now; None (the reason in *errors*) when NVML cannot say."""
        with self._nvml_lock:
            return self.reader.memory(uuid, errors)

    def free(self, uuid, errors):
        """Free bytes on GPU *uuid* now; None (the reason in *errors*) when NVML cannot say."""
        found = self.memory(uuid, errors)
        return None if found is None else found[1]

    def driver_state(self, pid):
        """The driver's word on process *pid*'s checkpoint state (``running``,
        ``locked``, ``checkpointed``, ``failed``); None when it cannot say."""
        try:
            return checkpoint_state(pid)
        except (ParkError, OSError):
            return None

    def process(self, pid, slices):
        """``(facts, attribution)`` of process *pid* (a PID of ours) among *slices*;
        None when it is gone."""
        facts = read_facts(pid, proc=self.proc)
        if facts is None:
            return None
        with self._attr_lock:
            return facts, self.attributor.attribute(facts, slices)

    def close(self):
        with self._lock:
            self.slice_files.close()
