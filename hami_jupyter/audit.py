"""The audit log: one JSON line per write of a limits file, or act of the guard.

Every change applied from the admin panel or ``hami-jupyter slice set|reset``
appends one record, and so does the hub each time it writes (or keeps) a
user's limits at server start: who, when (ISO-8601, UTC), the slice, what
changed and the limits before and after. The guard appends one each time it
warns about or ends a process over a cap, and the memory broker one for each
of its decisions (a kernel parked to make room, and for whom). By default the log is
``audit.log`` in the slice root.

It sits below every writer (it imports only :mod:`.slice` and the standard
library) because they run apart: the guard runs alone on a node, without
the admin tools or the hub.

Who is taken from the operating system, never from the environment: the
user name of the effective uid, with the real and effective uids beside it
(``JUPYTERHUB_USER`` is only a variable any process can set). A change made
through the admin service (:mod:`hami_jupyter.admin.service`) is
recorded with the uid the kernel reported for the caller's socket
(``SO_PEERCRED``).

Who may write it: under a hub-managed slice root the log is root's, mode
0640 (group: the admin group, which may read it) or 0600, and only root
writes it (the hub, the guard, and the admin service on behalf of
administrators); an administrator can neither append to it nor truncate it.
In a slice root no hub manages, it belongs to the user who owns the root.

Tamper evidence: each record carries ``prev``, the SHA-256 of the line before
it (64 zeros for the first), and ``audit.log.head`` beside the log holds the
number of lines and the hash of the last one. :func:`verify`
(``hami-jupyter audit verify``) walks the chain: an edited, removed or
inserted line, or a log cut short, is reported.

The file is only ever appended to: it is opened with ``O_APPEND`` and each
record is a single ``write(2)`` of one whole line, so records of concurrent
writers never interleave, even if one of them ignored the lock below. An
append reads the log's last line and the head, not the whole log: when the
head names that line, its count plus one is the new count (a log of millions
of lines costs each append what an empty one does); only a head that does not
match is recounted from the log.

The log doubles as the writers' lock. :class:`AuditLog` holds an OFD write
lock on the log while a change is checked and applied, so two admins (or an
admin and the hub) cannot interleave their checks and writes.
"""

import hashlib
import json
import os
import pwd
from datetime import datetime, timezone
from pathlib import Path

from .slice.locks import LockTimeout, lock_byte
from .slice.paths import replace_file

FILE_NAME = "audit.log"
HEAD_SUFFIX = ".head"
# Written only by its owner (root under a hub); readable by the admin group.
FILE_MODE = 0o640
GENESIS = "0" * 64
LOCK_WAIT_S = 10.0  # a change takes milliseconds; this long means something is stuck
HUB_WHO = "jupyterhub (policy)"
_TAIL = 1 << 16  # longest record line expected; the last line is read from this much of the end


class AuditLogError(Exception):
    """The audit log cannot be written or read."""


def default_path(slice_root):
    """``<slice root>/audit.log``."""
    return Path(slice_root) / FILE_NAME


def head_path(log_path):
    return Path(str(log_path) + HEAD_SUFFIX)


def user_name(uid):
    """The passwd name of *uid*, else ``uid <n>`` (a uid without a passwd entry)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def current_user(env=None):
    """Who is changing limits: the user of this process's effective uid, from the
    operating system. *env* is accepted for compatibility and ignored: an
    environment variable (JUPYTERHUB_USER) is whatever the caller set."""
    return user_name(os.geteuid())


def identity():
    """``{"who", "uid", "euid"}`` of this process, from the operating system."""
    return {"who": current_user(), "uid": os.getuid(), "euid": os.geteuid()}


def utc_now():
    """Now as ISO-8601 UTC with milliseconds: ``2025-01-31T12:00:00.123Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_record(slice_name, path, device, uuid, old, new, who=None, *, uid=None, action="set",
                **extra):
    """One audit record; *old* and *new* are plain dicts of limits.

    *who*/*uid* name the person the change is made for when it is not this
    process (the admin service passes its caller's, from SO_PEERCRED, and
    the hub its policy label); otherwise both come from the OS.
    """
    me = identity()
    record = {
        "when": utc_now(),
        "action": action,
        "who": who or me["who"],
        "uid": me["uid"] if uid is None else uid,
        "euid": me["euid"],  # the process that wrote the line
        "slice": slice_name,
        "path": os.path.abspath(path),
        "device": device,  # slice device index, None for the default entry
        "uuid": uuid,
        "old": old,
        "new": new,
    }
    record.update(extra)
    return record


def line_hash(line):
    """SHA-256 (hex) of one log line, without its newline."""
    if isinstance(line, str):
        line = line.encode()
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def _last_line(fd):
    """The last complete line of the open file (bytes, no newline), b"" when empty."""
    size = os.fstat(fd).st_size
    if size == 0:
        return b""
    start = max(0, size - _TAIL)
    data = os.pread(fd, size - start, start)
    lines = data.rstrip(b"\n").rsplit(b"\n", 1)
    if len(lines) == 1 and start > 0:  # a line longer than the tail: read it all
        data = os.pread(fd, size, 0)
        lines = data.rstrip(b"\n").rsplit(b"\n", 1)
    return lines[-1]


class AuditLog:
    """The log opened for appending, with the writers' lock held.

    ``with AuditLog(path) as log: ...; log.append(record)``. Opening fails
    with :class:`AuditLogError` when the log cannot be written, before
    anything was changed.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._fd = None

    def __enter__(self):
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                         FILE_MODE)
        except OSError as e:
            hint = ""
            if isinstance(e, PermissionError):
                hint = (" (under a hub only root writes it: administrators' changes go through "
                        "`hami-jupyter admin-service`, which must be running)")
            raise AuditLogError(f"cannot write the audit log {self.path}: {e.strerror or e}{hint}") from None
        try:
            self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _lock(self, fd):
        try:
            lock_byte(fd, 0, LOCK_WAIT_S)
        except LockTimeout:
            raise AuditLogError(f"another administrator has held {self.path} for over "
                                f"{LOCK_WAIT_S:g} s; try again") from None

    def append(self, record):
        """Write *record* as one line, in one ``write(2)``, chained to the line before."""
        last = _last_line(self._fd)
        before = self._lines_before(last)
        record = dict(record, prev=line_hash(last) if last else GENESIS)
        text = json.dumps(record, sort_keys=True)
        line = (text + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # a full disk; a regular file never writes short otherwise
            raise AuditLogError(f"{self.path}: only {written} of {len(line)} bytes of a record were written")
        self._write_head(line_hash(text), None if before is None else before + 1)
        return record

    def _lines_before(self, last):
        """The log's line count before this append, from the head when the head
        names *last* (the log's last line now) as its last: then it describes
        the log as it is, and nothing need be counted. None otherwise (no head,
        an unreadable one, or one that does not match: counted in full)."""
        try:
            head = json.loads(head_path(self.path).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(head, dict) or not isinstance(head.get("lines"), int):
            return None
        if head["lines"] == 0 and not last:
            return 0
        return head["lines"] if last and head.get("last") == line_hash(last) else None

    def _write_head(self, last_hash, lines=None):
        """``audit.log.head``: line count and last hash, so that a log cut short
        shows. *lines*: the count when known (the head before this append
        matched the log), else the log is counted."""
        if lines is None:
            lines = sum(chunk.count(b"\n") for chunk in _chunks(self._fd))
        st = os.fstat(self._fd)  # the head is owned and readable as the log is
        replace_file(head_path(self.path), json.dumps({"lines": lines, "last": last_hash}).encode() + b"\n",
                     st.st_mode & 0o644, (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)

    def __exit__(self, *exc):
        os.close(self._fd)  # drops the lock
        self._fd = None


def _chunks(fd, size=1 << 20):
    offset = 0
    while True:
        data = os.pread(fd, size, offset)
        if not data:
            return
        yield data
        offset += len(data)


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


def verify(path):
    """Check the hash chain of the log at *path*; returns ``(problems, notes)``.

    *problems* (lines of text) are empty for an intact log: every line's
    ``prev`` is the hash of the line before, and the head file agrees with
    the last line and the number of lines. *notes* mention records written
    before the chain existed (they carry no ``prev``; nothing proves them).
    """
    path = Path(path)
    problems, notes = [], []
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [f"{path}: no audit log"], notes
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        problems.append(f"{path}:{len(lines)}: the last line is incomplete (no newline)")
    previous, chained, legacy = None, False, 0
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            problems.append(f"{path}:{number}: not an audit record: {line[:80]!r}")
        elif "prev" not in record:
            if chained:
                problems.append(f"{path}:{number}: record without a hash inside the chain "
                                "(inserted or edited)")
            else:
                legacy += 1
        else:
            expected = line_hash(previous) if previous is not None else GENESIS
            if record["prev"] != expected:
                problems.append(f"{path}:{number}: the chain breaks here: line {number - 1} was "
                                "edited or removed, or this line was inserted")
            chained = True
        previous = line
    if legacy:
        notes.append(f"{path}: the first {legacy} record(s) predate the hash chain and are unproven")
    head = head_path(path)
    try:
        facts = json.loads(head.read_text())
    except FileNotFoundError:
        if chained:
            problems.append(f"{head}: missing (it records the log's length and last line)")
        return problems, notes
    except ValueError:
        problems.append(f"{head}: not readable as JSON")
        return problems, notes
    if facts.get("lines") != len(lines):
        problems.append(f"{path}: has {len(lines)} lines, the head records {facts.get('lines')}: "
                        "lines were removed from (or added to) the end")
    elif lines and facts.get("last") != line_hash(lines[-1]):
        problems.append(f"{path}: the last line is not the one the head records: it was edited")
    return problems, notes


def append_or_say(path, record):
    """Append *record* to the log at *path*; None, or why it could not be
    written (for a daemon, which says so and goes on: its act stands)."""
    try:
        with AuditLog(path) as trail:
            trail.append(record)
    except (AuditLogError, OSError) as e:
        return f"could not be written: {e}"
    return None
