"""The guard's report, ``<root>/guard.json``, built from one interval.

The format is :mod:`hami_jupyter.slice.guard_report`'s (every view of a
slice reads it there); this module only fills it in. It is also the guard's
memory: a restarted agent reads its predecessor's report back
(:func:`carried_over`) for the latest actions, the slices it had already
warned about and what it had seen allowed, so that a restart neither forgets
what was done nor warns again about a state it already reported, nor takes
memory held within an earlier cap for memory no cap allowed.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from ...slice.guard_report import GuardReportError, read_report
from .policy import OVER, Allowances

log = logging.getLogger("hami_jupyter.guard")


def build(measured, slices, unattributed, errors, actions, *, interval, action, now=None, memory=None,
          parked=(), returns=()):
    """The report dict for :func:`hami_jupyter.slice.guard_report.write_report`.

    *measured*: ``{slice: {uuid: SliceGpu}}`` (:func:`.policy.measure`);
    *slices*: the :class:`~..facts.slices.SliceSet` (every readable slice is
    listed, with no GPUs when it holds nothing); *actions*: the latest
    actions, oldest first; *memory*: the :class:`~.policy.Allowances` for the
    next interval (and the next agent); *parked*: the processes the agent
    holds parked; *returns*: command lines ended more than once.
    """
    memory = memory or Allowances()
    listed = {}
    for name, seen in sorted(slices.enforced.items()):
        gpus = {}
        for uuid, g in sorted(measured.get(name, {}).items()):
            entry = dict(g.as_report(), allowance_bytes=memory.slice.get((name, uuid)))
            for p in entry["processes"]:
                p["allowed_bytes"] = memory.process.get((name, uuid, p["pid"], p["start_ticks"]))
            gpus[uuid] = entry
        listed[name] = {"path": str(seen.path), "gpus": gpus}
        if seen.snapshot is None:  # held to its limits file: why (docs/guard.md)
            listed[name]["unreadable"] = seen.error
    return {
        "written_unix": time.time() if now is None else now,
        "interval": interval,
        "action": action,
        "guard_pid": os.getpid(),
        "host": socket.gethostname(),
        "errors": list(errors),
        "slices": listed,
        "unattributed": sorted(unattributed, key=lambda u: (u["uuid"], u["pid"])),
        "actions": list(actions),
        "parked": sorted(parked, key=lambda p: (p.get("slice", ""), p.get("pid", 0))),
        "returns": list(returns),
    }


class CarriedOver:
    """What a previous agent's report hands on: its latest *actions*; the
    ``(slice, uuid)`` pairs it saw *over* (empty when the report is stale: the
    agent was down, and what it saw then says nothing about now); what it saw
    allowed (*memory*, an :class:`~.policy.Allowances`: a restart must not
    forget that memory was held within the cap in force when taken); and the
    processes it had *parked* (they stay parked while the agent is down, so
    they are kept whatever the report's age)."""

    def __init__(self, actions=(), over=(), memory=None, parked=()):
        self.actions = list(actions)
        self.over = set(over)
        self.memory = memory or Allowances()
        self.parked = list(parked)


def carried_over(root):
    """The :class:`CarriedOver` of the report a previous guard left in *root*
    (empty without a usable report)."""
    try:
        previous = read_report(root)
    except (GuardReportError, OSError) as e:
        log.warning("guard: the previous report is not used: %s", e)
        return CarriedOver()
    if not previous:
        return CarriedOver()
    actions = [a for a in previous.get("actions") or [] if isinstance(a, dict)]
    parked = [p for p in previous.get("parked") or [] if isinstance(p, dict) and isinstance(p.get("pid"), int)]
    over, memory = set(), Allowances()
    for name, entry in (previous.get("slices") or {}).items():
        for uuid, gpu in ((entry or {}).get("gpus") or {}).items():
            if not isinstance(gpu, dict):
                continue
            if gpu.get("state") == OVER and not previous.get("stale"):
                over.add((name, uuid))
            if isinstance(gpu.get("allowance_bytes"), int):
                memory.slice[(name, uuid)] = gpu["allowance_bytes"]
            for p in gpu.get("processes") or []:
                if isinstance(p, dict) and all(isinstance(p.get(k), int)
                                               for k in ("pid", "start_ticks", "allowed_bytes")):
                    memory.process[(name, uuid, p["pid"], p["start_ticks"])] = p["allowed_bytes"]
    return CarriedOver(actions, over, memory, parked)
