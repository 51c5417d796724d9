"""A node daemon's report in the slice root: the guard's ``guard.json``, the broker's ``broker.json``.

Both are written by root (or the daemon's user) for every view to read:
replaced atomically (a reader never sees half of one), 0644, and read only
when the trust rule allows (root's, or the reader's own: never another
user's, who could fake what a tampering user must not). What differs is only
the file's name, its version and what makes it stale: this module is the
rest, once.
"""

import json
import os
import time

from .paths import open_trusted, replace_file

MAX_BYTES = 1 << 24


def write(path, report, version):
    """Replace *path* with *report* (a dict; ``version`` and ``written_unix`` added)."""
    report = dict(report, version=version)
    report.setdefault("written_unix", time.time())
    data = json.dumps(report, separators=(",", ":"), sort_keys=True).encode()
    replace_file(path, data, mode=0o644)


def read(path, version, who, error):
    """The report at *path* as a dict, or None when there is none. *error* (an
    exception class) when it cannot be used, its message naming *who* ("the
    guard") and what to do."""
    try:
        fd, _, _ = open_trusted(path, what=f"{who.split()[-1]} report")  # root's, or ours
    except FileNotFoundError:
        return None
    except OSError as e:
        raise error(f"cannot read {who}'s report {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES)
    try:
        report = json.loads(data)
    except ValueError:
        raise error(f"{who}'s report {path} is not JSON") from None
    if not isinstance(report, dict) or report.get("version") != version:
        raise error(f"{who}'s report {path} is not version {version}: is {who.split()[-1]} older or "
                    "newer than this hami-jupyter?")
    return report
