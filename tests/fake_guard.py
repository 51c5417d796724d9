"""A fake guard for the views' tests: ``guard.json`` written where the real
guard (``hami-jupyter guard``) writes it, with
:func:`hami_jupyter.slice.guard_report.write_report`.

* ``write_guard(root, {"alice": {uuid: seen(...)}}, **fields)``: a report in
  the slice root *root*, written now (``written_unix`` to date it otherwise,
  say ``time.time() - 600`` for a guard that stopped); returns the report.
* ``seen(real, reported, limit, state=None)``: what the guard saw of one GPU
  of a slice; *state* defaults to "over" when *real* passes *limit* plus the
  tolerance, else "ok".
"""

import os
import socket
import time

from hami_jupyter.slice.guard_report import write_report

MiB = 1 << 20
TOLERANCE = 64 * MiB


def seen(real, reported, limit, state=None, pid=4321):
    if state is None:
        state = "over" if limit and real > limit + TOLERANCE else "ok"
    return {"real_bytes": real, "reported_bytes": reported, "limit_bytes": limit,
            "tolerance_bytes": TOLERANCE, "state": state,
            "processes": [{"pid": pid, "real_bytes": real, "preload": True,
                           "attributed_by": "slot"}]}


def write_guard(root, slices=None, *, written_unix=None, interval=0.5, action="kill",
                errors=(), guard_pid=None, host=None):
    report = {
        "written_unix": time.time() if written_unix is None else written_unix,
        "interval": interval,
        "action": action,
        "guard_pid": os.getpid() if guard_pid is None else guard_pid,
        "host": socket.gethostname() if host is None else host,
        "errors": list(errors),
        "slices": {name: {"path": os.path.join(os.fspath(root), f"{name}.slice"), "gpus": gpus}
                   for name, gpus in (slices or {}).items()},
        "unattributed": [],
        "actions": [],
    }
    os.makedirs(root, exist_ok=True)
    write_report(report, root)
    return report
