"""The administrators' audit log: one JSON line per limit change.

Every change applied from the admin panel or ``hami-jupyter slice set``
appends one record: who, when (ISO-8601, UTC), the slice, the entry changed
(a GPU, or the slice's default entry) and the limits before and after. By
default the log is ``audit.log`` in the slice root.

The file is only ever appended to: it is opened with ``O_APPEND`` and each
record is a single ``write(2)`` of one whole line, so records of concurrent
writers never interleave, even if one of them ignored the lock below.

The log doubles as the administrators' lock. :class:`AuditLog` holds an OFD
write lock on the log while a change is checked and applied, so two admins
cannot both pass the "hard slices fit the GPU" check with changes that only
fit one at a time. Taking a write lock needs the log open for writing, so a
user who may only read cannot stall the administrators.
"""

import fcntl
import getpass
import json
import os
import pwd
import time
from datetime import datetime, timezone
from pathlib import Path

from ..slice_file import F_OFD_SETLK, flock_bytes

FILE_NAME = "audit.log"
# Like a hub-owned limits file (0664, the administrators' group): every admin of
# the group may append; users have no business in it.
FILE_MODE = 0o660
LOCK_WAIT_S = 10.0  # a change takes milliseconds; this long means something is stuck


class AuditLogError(Exception):
    """The audit log cannot be written or read."""


def default_path(slice_root):
    """``<slice root>/audit.log``."""
    return Path(slice_root) / FILE_NAME


def current_user(env=None):
    """Who is changing limits: the JupyterHub user, else the Unix user."""
    env = os.environ if env is None else env
    if env.get("JUPYTERHUB_USER"):
        return env["JUPYTERHUB_USER"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        return getpass.getuser()


def utc_now():
    """Now as ISO-8601 UTC with milliseconds: ``2025-01-31T12:00:00.123Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_record(slice_name, path, device, uuid, old, new, who=None):
    """One audit record; *old* and *new* are plain dicts of limits."""
    return {
        "when": utc_now(),
        "who": who or current_user(),
        "uid": os.getuid(),  # JUPYTERHUB_USER is only an environment variable; this is not
        "slice": slice_name,
        "path": os.path.abspath(path),
        "device": device,  # slice device index, None for the default entry
        "uuid": uuid,
        "old": old,
        "new": new,
    }


class AuditLog:
    """The log opened for appending, with the administrators' lock held.

    ``with AuditLog(path) as log: ...; log.append(record)``. Opening fails
    with :class:`AuditLogError` when the log cannot be written, before
    anything was changed.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._fd = None

    def __enter__(self):
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as e:
            raise AuditLogError(f"cannot write the audit log {self.path}: {e.strerror or e}") from None
        try:
            self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _lock(self, fd):
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, 0))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AuditLogError(f"another administrator has held {self.path} for over "
                                        f"{LOCK_WAIT_S:g} s; try again") from None
                time.sleep(0.002)

    def append(self, record):
        """Write *record* as one line, in one ``write(2)``."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # a full disk; a regular file never writes short otherwise
            raise AuditLogError(f"{self.path}: only {written} of {len(line)} bytes of a record were written")

    def __exit__(self, *exc):
        os.close(self._fd)  # drops the lock
        self._fd = None


def read_records(path):
    """Every record of the log at *path*, oldest first; [] when there is no log yet.

    A line that is not one JSON object raises :class:`AuditLogError` naming it:
    an audit log that cannot be read whole must not look complete.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise AuditLogError(f"{path}:{number}: not an audit record: {line[:80]!r}")
        records.append(record)
    return records
