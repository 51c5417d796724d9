"""The guard's report, ``<root>/guard.json``, built from one interval.

The format is :mod:`hami_jupyter.slice.guard_report`'s (every view of a
slice reads it there); this module only fills it in. It is also the guard's
memory: a restarted guard reads its predecessor's report back
(:func:`carried_over`) for the latest actions and for the slices it had
already warned about, so that a restart neither forgets what was done nor
warns again about a state it already reported.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from ..slice.guard_report import GuardReportError, read_report
from .policy import OVER

log = logging.getLogger("hami_jupyter.guard")


def build(measured, slices, unattributed, errors, actions, *, interval, action, now=None, allowance=None,
          parked=(), returns=()):
    """The report dict for :func:`hami_jupyter.slice.guard_report.write_report`.

    *measured*: ``{slice: {uuid: SliceGpu}}`` (:func:`.policy.measure`);
    *slices*: the :class:`~.slices.SliceSet` (every readable slice is listed,
    with no GPUs when it holds nothing); *actions*: the latest actions, oldest
    first; *allowance*: ``{(slice, uuid): bytes}`` held from before a lowered
    cap, for the next interval (and the next guard); *parked*: the processes
    the guard holds parked; *returns*: command lines ended more than once.
    """
    allowance = allowance or {}
    listed = {}
    for name, seen in sorted(slices.readable.items()):
        gpus = measured.get(name, {})
        listed[name] = {"path": str(seen.path),
                        "gpus": {uuid: dict(g.as_report(), allowance_bytes=allowance.get((name, uuid)))
                                 for uuid, g in sorted(gpus.items())}}
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
    """What a previous guard's report hands on: its latest *actions*; the
    ``(slice, uuid)`` pairs it saw *over* (empty when the report is stale: the
    guard was down, and what it saw then says nothing about now); the bytes
    each slice GPU held from before a lowered cap (*allowance*: a restart
    must not forget that they were held within the cap in force when taken);
    and the processes it had *parked* (they stay parked while the guard is
    down, so they are kept whatever the report's age)."""

    def __init__(self, actions=(), over=(), allowance=None, parked=()):
        self.actions = list(actions)
        self.over = set(over)
        self.allowance = dict(allowance or {})
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
    over, allowance = set(), {}
    for name, entry in (previous.get("slices") or {}).items():
        for uuid, gpu in ((entry or {}).get("gpus") or {}).items():
            if not isinstance(gpu, dict):
                continue
            if gpu.get("state") == OVER and not previous.get("stale"):
                over.add((name, uuid))
            if isinstance(gpu.get("allowance_bytes"), int):
                allowance[(name, uuid)] = gpu["allowance_bytes"]
    return CarriedOver(actions, over, allowance, parked)
