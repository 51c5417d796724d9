"""The broker's report, ``<root>/broker.json``: its format is
:mod:`hami_jupyter.slice.broker_report`'s (the views read it there); this
module fills it in from the broker's queues and latest decisions, and writes
it every second and soon after a queue changes."""

from __future__ import annotations

import logging
import os
import socket
import time

from ..slice.broker_report import WRITE_INTERVAL_S, write_report

log = logging.getLogger("hami_jupyter.broker")


def build(broker, *, socket_path, host_reserve, running=True, now=None):
    """The report dict of *broker* (a :class:`~.server.Broker`) now."""
    queues, latest = broker.queue_view(), broker.decisions.latest()
    kept = broker.keeper.view() if broker.keeper is not None else {}
    gpus = {uuid: {"queue": queues.get(uuid, []), "decisions": latest.get(uuid, [])}
            for uuid in sorted(set(queues) | set(latest) | set(kept))}
    for uuid, entry in kept.items():
        gpus[uuid]["headroom"] = entry
    return {
        "written_unix": time.time() if now is None else now,
        "running": running,
        "broker_pid": os.getpid(),
        "host": socket.gethostname(),
        "socket": str(socket_path),
        "min_idle_seconds": broker.min_idle,
        "host_memory_reserve": host_reserve,
        "headroom": broker.keeper.headroom if broker.keeper is not None else 0,
        "cannot_park": broker.cannot_park,
        "errors": list(broker.errors) + list(broker.decisions.errors),
        "gpus": gpus,
    }


class Reporter:
    """Writes the report until *broker.stop*; a write that fails is logged once."""

    def __init__(self, broker, root, **fields):
        self.broker, self.root, self.fields = broker, root, fields
        self._error = None

    def write(self, running=True):
        try:
            write_report(build(self.broker, running=running, **self.fields), self.root)
        except OSError as e:
            message = f"cannot write the report in {self.root}: {e.strerror or e}"
            if message != self._error:
                log.error("broker: %s", message)
            self._error = message
        else:
            self._error = None

    def run(self):
        while not self.broker.stop.is_set():
            self.broker.changed.clear()
            self.write()
            self.broker.changed.wait(WRITE_INTERVAL_S)
            if self.broker.changed.is_set():
                time.sleep(0.05)  # a burst of changes: one write for it
