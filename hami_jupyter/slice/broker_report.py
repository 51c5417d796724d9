"""What the memory broker is doing: ``<slice root>/broker.json``, written by the node agent.

The broker (the room policy of ``hami-jupyter agent``, :mod:`hami_jupyter.agent.room`) makes GPU room for processes whose
allocations the driver refused, by parking idle kernels. Views (``%hami
status``, the panels, the hub view) read this file to say who waits for room
on which GPU and what the broker did lately; it is here, beside the guard's
report, so that they need nothing of the broker itself.

Like ``guard.json`` it lies in the slice root, root's, replaced atomically
(every second, and at once when a queue changes), read whole by root and the
administrators; each user who owns a slice file there reads a view of it
(:func:`user_view`, :mod:`.node_report`): her own requests in the queues and
how many others wait, the decisions about her requests and her kernels
(another user's processes, kernels and reasons left out), the headroom, her
held processes. It is not the broker's memory: a restarted broker rebuilds
its queue from the requests its clients ask again and from the slots'
``room_wait_*`` fields.

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
    """Replace the report atomically, and each slice owner's view of it (it
    names other users' processes and kernels: no user's to read)."""
    node_report.write(report_path(root), report, VERSION, user_view)


_KERNEL_FIELDS = ("slice", "kernel", "pids", "user", "bytes")  # a decision's kernel (Kernel.record)


def _decision_view(decision, names):
    """*decision* as the owner of *names* may read it, or None when it is none
    of hers: her requester's or her kernel's, the other party named by its
    user and slice only, and its reason kept only when it names nothing else."""
    if not isinstance(decision, dict):
        return None
    requester = decision.get("requester") if isinstance(decision.get("requester"), dict) else {}
    asked = requester.get("slice") in names
    kernel = decision.get("slice") in names
    if not asked and not kernel:
        return None
    view = {k: v for k, v in decision.items() if k not in ("requester", "why", "error", "parked")}
    view["requester"] = requester if asked else {k: requester.get(k) for k in ("user", "slice", "for")
                                                 if k in requester}
    if not kernel and "slice" in decision:
        for k in ("kernel", "pids"):
            view.pop(k, None)
    if "parked" in decision:  # what was parked for her request: other users' kernels by slice only
        view["parked"] = [p if isinstance(p, dict) and p.get("slice") in names else
                          {"slice": p.get("slice"), "user": p.get("user"), "bytes": p.get("bytes")}
                          for p in decision.get("parked") or [] if isinstance(p, dict)]
    if asked and decision.get("action") in ("served", "dropped") or (asked and kernel):
        view["why"] = decision.get("why")
    return view


def user_view(report, names, uid):
    """What user *uid*, who owns the slices *names*, may read of the broker's
    *report*: the same format, her part of it."""
    from .guard_report import mentions_only

    names = set(names)
    view = {k: report.get(k) for k in ("written_unix", "running", "broker_pid", "host", "socket",
                                       "min_idle_seconds", "host_memory_reserve", "headroom")
            if k in report}
    gpus = {}
    for uuid, entry in (report.get("gpus") or {}).items():
        entry = entry if isinstance(entry, dict) else {}
        queue = [q for q in entry.get("queue") or [] if isinstance(q, dict)]
        mine = [q for q in queue if q.get("slice") in names]
        decisions = [d for d in (_decision_view(d, names) for d in entry.get("decisions") or []) if d]
        gpus[uuid] = dict(queue=mine, others_waiting=len(queue) - len(mine), decisions=decisions)
        if "headroom" in entry:
            gpus[uuid]["headroom"] = entry["headroom"]
    view.update(gpus=gpus, errors=[e for e in report.get("errors") or [] if mentions_only(e, names)],
                held=[h for h in report.get("held") or [] if isinstance(h, dict) and h.get("slice") in names],
                view={"uid": uid, "slices": sorted(names)})
    return view


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
