"""What the memory broker is doing: ``<slice root>/broker.json``, written by the node agent.

The broker (the room policy of ``hami-jupyter agent``, :mod:`hami_jupyter.agent.room`) makes GPU room for processes whose
allocations the driver refused, by parking idle kernels. Views (``%hami
status``, the panels, the hub view) read this file to say who waits for room
on which GPU and what the broker did lately; it is here, beside the guard's
report, so that they need nothing of the broker itself.

Like ``guard.json`` it lies in the slice root, root's, replaced atomically
(every second, and at once when a queue changes), readable by everyone. It
is not the broker's memory: a restarted broker rebuilds its queue from the
requests its clients ask again and from the slots' ``room_wait_*`` fields.

The report (``version`` 1)::

    {"version": 1, "written_unix": 1764060000.5, "running": true,
     "broker_pid": 4242, "host": "gpu-node-1", "socket": "/run/hami-jupyter/broker.sock",
     "min_idle_seconds": 60, "host_memory_reserve": 2147483648,
     "headroom": 8589934592,                   # --headroom (0: off)
     "reserve": 268435456,                     # --reserve: kept free for parks
     "errors": [],
     "gpus": {"GPU-...": {
         "granted": [{"pid": 1234, "bytes": 8589934592}],  # room kept for requesters (the room ledger)
         "queue": [{"slice": "carol", "pid": 1234, "user": "carol", "kernel": "a1b2...",
                    "bytes": 8589934592, "since_unix_ns": 1764059990000000000,
                    "serving": true}],          # oldest wait first; the one served now first
         "decisions": [{"unix": 1764059991.2, "action": "park", "slice": "alice",
                        "kernel": "c3d4...", "user": "alice", "bytes": 8657043456,
                        "requester": {"slice": "carol", "pid": 1234, ...},
                        "why": "..."}],       # the latest, newest last
         "headroom": {"kept": false, "free_bytes": 2147483648,
                      "why": "a request for room is served on this GPU first",
                      "since_unix": 1764059991.0, "checked_unix": 1764060000.2}}},
     "held": [{"pid": 5678, "slice": "dave", "for": "room", "why": "..."}]}
                                                # held by the driver: their slots refused a park

``action`` is one of ``park`` (a kernel parked to make room), ``park-failed``
(a park that failed; the broker went on with the next), ``served`` (``OK``
answered), ``refused`` (``NO`` answered, and why) and ``dropped`` (the
requester went away before it was served: nothing more parked for it). A
park for the headroom has ``"requester": {"for": "headroom", ...}`` (no user
asked). ``granted`` lists the room the broker made and keeps for each
requester it answered ``OK`` while that requester takes it (the room
ledger's grants). Each GPU's ``headroom`` entry (with a headroom or a reserve) says whether
the GPU has it free (``kept``), its free bytes at the last look, why not
when it is not, since when it is (or is not) kept, and when it was last
looked at (about every second).
"""

import time
from pathlib import Path

from . import node_report
from .paths import default_root

FILE_NAME = "broker.json"
# Where the broker listens, beside its report: <root>/broker.sock, unless this
# variable names another socket (the broker's --socket, the library's setting;
# the hub passes it to the servers of a slice root of its own).
SOCKET_NAME = "broker.sock"
SOCKET_VARIABLE = "HAMI_BROKER_SOCKET"
VERSION = 1
WRITE_INTERVAL_S = 1.0
STALE_AFTER_S = 5.0  # not rewritten for this long: the broker is not running, or stuck
MAX_DECISIONS = 20  # per GPU; the audit log keeps them all


class BrokerReportError(ValueError):
    """The report exists but cannot be used (not JSON, another version)."""


def report_path(root=None):
    return Path(root if root is not None else default_root()) / FILE_NAME


def write_report(report, root=None):
    """Replace the report atomically, readable by every user (it names slices,
    users and kernel ids, which every user of the node sees in ``nvidia-smi``'s
    process list and the hub's view anyway)."""
    node_report.write(report_path(root), report, VERSION)


def read_report(root=None, now=None):
    """The report as a dict with ``"stale"`` added (True when the broker has not
    written it for a while, or said it stopped), or None when there is none.
    BrokerReportError when it cannot be read."""
    report = node_report.read(report_path(root), VERSION, "the broker", BrokerReportError)
    if report is None:
        return None
    now = time.time() if now is None else now
    written = report.get("written_unix") or 0
    report["stale"] = not report.get("running", False) or now - written > STALE_AFTER_S
    return report


def waiting(report, uuid=None):
    """The requests waiting for room (on GPU *uuid*, or on every GPU), each a
    queue entry of the report with ``"uuid"`` added; empty without a fresh report."""
    if not report or report.get("stale"):
        return []
    out = []
    for gpu, entry in sorted((report.get("gpus") or {}).items()):
        if uuid is not None and gpu != uuid:
            continue
        out += [dict(q, uuid=gpu) for q in (entry or {}).get("queue") or [] if isinstance(q, dict)]
    return out
