"""What the guard saw: ``<slice root>/guard.json``, written by the node agent (``hami-jupyter agent``).

The guard (:mod:`hami_jupyter.agent.guard`) reads every GPU process's real device
memory from NVML, attributes it to slices, and publishes what it saw here,
for ``%hami status``, the REST API, ``/metrics``, ``hami-jupyter slice
list``, the admin panel and ``hami-jupyter doctor`` to show beside the
slices' own (reported) figures.

Why a file of its own, and not fields in the slice file: a user's slice file
is writable by that user (their processes count usage in it), and the
guard's figures are the ones a tampering user must not be able to change.
The report lies in the slice root, which on a hub is root's; the guard
replaces it atomically every interval. It holds no state the guard needs
back: a restarted guard simply writes a new one.

The report (``version`` 1)::

    {"version": 1, "written_unix": 1764060000.5, "interval": 0.5,
     "action": "kill", "guard_pid": 4242, "host": "gpu-node-1",
     "errors": ["GPU GPU-...: NVML: ..."],            # what it could not read this round
     "slices": {"alice": {"path": "/run/hami-jupyter/alice.slice",
                          "gpus": {"GPU-...": {"real_bytes": 1181116006,
                                               "reported_bytes": 1073741824,
                                               "limit_bytes": 1073741824,
                                               "tolerance_bytes": 67108864,
                                               "state": "over",   # "ok", "held" or "over"
                                               "held_bytes": 0, "allowance_bytes": 0,
                                               "processes": [{"pid": 1234, "start_ticks": 912345,
                                                              "real_bytes": 1181116006,
                                                              "preload": False,
                                                              "attributed_by": "user",
                                                              "charged_bytes": None,
                                                              "allowed_bytes": 0}]}}}},
     "unattributed": [{"pid": 99, "uuid": "GPU-...", "real_bytes": 524288000,
                       "user": "bob"}],               # GPU processes of no slice
     "actions": [{"unix": 1764060000.1, "action": "kill", "slice": "alice",
                  "uuid": "GPU-...", "pid": 1234, "real_bytes": 1181116006,
                  "reported_bytes": 1073741824, "limit_bytes": 1073741824,
                  "why": "..."}]}                   # the latest, newest last

Who may read it (:mod:`.node_report`): the full report is root's and the
administrators' (0640); each user who owns a slice file in the root reads a
view of it, :func:`user_view`: her slices, her processes, the actions on and
parks of her slices, the errors that name only her slices. :func:`read_report`
gives each reader what it may read, so every view of a slice works alike for
its user and for an administrator.

``attributed_by`` is ``"environ"`` (``HAMI_SLICE`` in the process's
environment), ``"slot"`` (a slot of the slice file holds its pid) or
``"user"`` (a process of the slice's user that the library does not count:
a bypass). ``preload`` says whether the process has a slot, i.e. runs under
the preload library. ``allowance_bytes`` and ``allowed_bytes`` are what the
agent saw the slice, and each process, hold while within the cap (a
restarted agent reads them back); ``charged_bytes`` is what the process's
slot says it was charged, shown only. ``parked`` lists the processes the
agent holds off the GPU (for the guard, and for the memory broker when a
slot refused its park) until they are gone or back.
"""

import os
import re
import time
from pathlib import Path

from . import node_report
from .paths import default_root

FILE_NAME = "guard.json"
VERSION = 1
STALE_AFTER_INTERVALS = 4  # a report older than this many intervals (plus STALE_SLACK_S) is stale
STALE_SLACK_S = 2.0
MAX_ACTIONS = 50  # the report keeps the latest actions; the audit log keeps them all


class GuardReportError(ValueError):
    """The report exists but cannot be used (not JSON, another version)."""


def report_path(root=None):
    return Path(root if root is not None else default_root()) / FILE_NAME


def write_report(report, root=None):
    """Replace the report atomically, and each slice owner's view of it (see
    the module: other users' processes are no user's to read)."""
    report = dict(report)
    report["actions"] = list(report.get("actions", []))[-MAX_ACTIONS:]
    node_report.write(report_path(root), report, VERSION, user_view)


_SLICE_NAMED = re.compile(r"\bslice ([A-Za-z0-9][A-Za-z0-9._@+-]*[A-Za-z0-9_@+-]|[A-Za-z0-9])")


def mentions_only(text, names):
    """Whether the line *text* names slices of *names* only, and a process only
    in such a line: an error about another user's slice or process is not hers."""
    named = set(_SLICE_NAMED.findall(str(text)))
    if named:
        return named <= set(names)
    return "pid " not in str(text)


def user_view(report, names, uid):
    """What user *uid*, who owns the slices *names*, may read of the guard's
    *report*: the same format, her part of it."""
    names = set(names)

    def hers(record):
        return isinstance(record, dict) and record.get("slice") in names

    view = {k: report.get(k) for k in ("written_unix", "interval", "action", "guard_pid", "host")}
    view.update(
        errors=[e for e in report.get("errors") or [] if mentions_only(e, names)],
        slices={n: v for n, v in (report.get("slices") or {}).items() if n in names},
        unattributed=[u for u in report.get("unattributed") or []
                      if isinstance(u, dict) and u.get("uid") == uid],
        actions=[a for a in report.get("actions") or [] if hers(a)],
        parked=[p for p in report.get("parked") or [] if hers(p)],
        returns=[r for r in report.get("returns") or [] if hers(r)],
        view={"uid": uid, "slices": sorted(names)})
    return view


def read_report(root=None, now=None):
    """The report as a dict with ``"stale"`` added (True when the guard has not
    written it for a while: it is not running, or stuck), or None when there is
    none: the full report for root and the administrators, else the reader's
    own view of it (None for a user with no slice in the root).
    GuardReportError when it cannot be read."""
    report = node_report.read(report_path(root), VERSION, "the guard", GuardReportError)
    if report is None:
        return None
    now = time.time() if now is None else now
    interval = report.get("interval") or 0.5
    written = report.get("written_unix") or 0
    report["stale"] = now - written > STALE_AFTER_INTERVALS * interval + STALE_SLACK_S
    return report


def slice_view(report, name):
    """``{uuid: gpu dict}`` the guard saw for slice *name* (empty without a
    fresh report), each GPU dict as in the report."""
    if not report or report.get("stale"):
        return {}
    return dict((report.get("slices", {}).get(name) or {}).get("gpus", {}))


def over_text(gpu, format_size):
    """One line for a GPU the guard sees over its cap, or None."""
    if gpu.get("state") != "over":
        return None
    return (f"the guard sees {format_size(gpu['real_bytes'])} really in use on this GPU, over the "
            f"{format_size(gpu['limit_bytes'])} cap (the slice counts {format_size(gpu['reported_bytes'])})")


def guard_pid_alive(report):
    """Whether the process that wrote the report still runs (on this host)."""
    pid = report.get("guard_pid") if report else None
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
