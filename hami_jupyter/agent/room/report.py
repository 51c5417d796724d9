"""The room policy's report, ``<root>/broker.json``: its format is
:mod:`hami_jupyter.slice.broker_report`'s (the views read it there); this
module fills it in from the queues, the latest decisions and the headroom's
state. The agent writes it every second and soon after a queue changes."""

from __future__ import annotations

import os
import socket
import time


def build(*, queues, decisions, headroom_view, socket_path, min_idle, host_reserve, headroom, cannot_park,
          errors, held=(), running=True, now=None, granted=None, reserve=0):
    """The report dict. *queues*: ``{uuid: [queue entry]}``; *decisions*:
    ``{uuid: [decision]}``; *headroom_view*: ``{uuid: headroom entry}`` (empty
    without a keeper); *granted*: ``{uuid: [{"pid", "bytes"}]}``, the room kept
    for requesters in the room ledger; *held*: the processes held off the GPU
    for room because their slots refused a park (an administrator brings them
    back); *reserve*: the device memory kept free on each GPU."""
    granted = granted or {}
    gpus = {uuid: {"queue": queues.get(uuid, []), "decisions": decisions.get(uuid, []),
                   "granted": granted.get(uuid, [])}
            for uuid in sorted(set(queues) | set(decisions) | set(headroom_view) | set(granted))}
    for uuid, entry in headroom_view.items():
        gpus[uuid]["headroom"] = entry
    return {
        "written_unix": time.time() if now is None else now,
        "running": running,
        "broker_pid": os.getpid(),
        "host": socket.gethostname(),
        "socket": str(socket_path),
        "min_idle_seconds": min_idle,
        "host_memory_reserve": host_reserve,
        "headroom": headroom,
        "reserve": reserve,
        "cannot_park": cannot_park,
        "errors": list(errors),
        "held": list(held),
        "gpus": gpus,
    }
