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


def build(measured, slices, unattributed, errors, actions, *, interval, action, now=None):
    """The report dict for :func:`hami_jupyter.slice.guard_report.write_report`.

    *measured*: ``{slice: {uuid: SliceGpu}}`` (:func:`.policy.measure`);
    *slices*: the :class:`~.slices.SliceSet` (every readable slice is listed,
    with no GPUs when it holds nothing); *actions*: the latest actions, oldest
    first.
    """
    listed = {}
    for name, seen in sorted(slices.readable.items()):
        gpus = measured.get(name, {})
        listed[name] = {"path": str(seen.path),
                        "gpus": {uuid: g.as_report() for uuid, g in sorted(gpus.items())}}
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
    }


def carried_over(root):
    """``(actions, over)`` of the report a previous guard left in *root*: its
    latest actions, and the ``(slice, uuid)`` pairs it saw over (empty when
    that report is stale: the guard was down, and what it saw then says
    nothing about now). ``([], set())`` without a usable report."""
    try:
        previous = read_report(root)
    except (GuardReportError, OSError) as e:
        log.warning("guard: the previous report is not used: %s", e)
        return [], set()
    if not previous:
        return [], set()
    actions = [a for a in previous.get("actions") or [] if isinstance(a, dict)]
    over = set()
    if not previous.get("stale"):
        for name, entry in (previous.get("slices") or {}).items():
            for uuid, gpu in ((entry or {}).get("gpus") or {}).items():
                if isinstance(gpu, dict) and gpu.get("state") == OVER:
                    over.add((name, uuid))
    return actions, over
