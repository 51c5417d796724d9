"""What ``/proc`` says about a GPU process, read once per process.

Attribution needs, for each PID NVML lists: its owner, when it started, its
PID namespace and its PID there (slots of the slice file record those, not
the host PID, so that kernels in containers are found), and the slice
variables of its environment. All of that is fixed for a process's life,
except that a PID can be reused by a new process, so the facts are cached
under ``(pid, start time)``: each interval costs one read of
``/proc/<pid>/stat`` per GPU process, and only a process not seen before
costs the other reads. The start time (clock ticks since boot, field 22) is
also what :mod:`..actor` checks right before it acts, so that a PID reused
between the look and the act is never hit; made a Unix time
(:attr:`ProcessFacts.started_unix`) it bounds what a slot may claim of the
process's past: no wait began, and nothing happened, before it started.

The environment is the one the process started with (``/proc/<pid>/environ``
never changes after ``exec``), which is what a launcher (the provisioner,
the hub, a shell) gave it. Reading another user's environment, namespace
link or root needs root (or ``CAP_SYS_PTRACE``); what cannot be read is
``None``, never a guess.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from ...processes import start_ticks

SLICE_VARIABLES = ("HAMI_SLICE", "CUDA_DEVICE_MEMORY_SHARED_CACHE")  # in the library's order
# Only what finds the slice file the library opens (attribution): nothing else of
# a process's environment, its user's to set, is read (issue 39: a
# HAMI_CONTEXT_OVERHEAD of hers once raised the guard's tolerance).
WANTED = frozenset(SLICE_VARIABLES + ("HAMI_SLICE_ROOT", "XDG_RUNTIME_DIR"))


@dataclass(frozen=True)
class ProcessFacts:
    """One process as ``/proc`` shows it.

    *start_ticks*: its start time (with the PID, it names one process);
    *uid*: its real user id; *pid_ns*: the inode of its PID namespace and
    *ns_pid* its PID there (the last field of ``NSpid``); *environ*: the
    variables of :data:`WANTED` that it started with (None: not readable);
    *command*: its command line (what comes back after a kill, when a restarter
    starts it again).
    """

    pid: int
    start_ticks: int
    uid: int | None
    user: str | None
    pid_ns: int | None
    ns_pid: int | None
    environ: dict | None
    command: str | None = None  # its command line, spaces between the arguments (cut at 512 characters)

    @property
    def started_unix(self):
        """When it started, as a Unix time (the boot time plus its start ticks)."""
        return boot_unix() + self.start_ticks / TICKS_PER_S

    @property
    def slice_ref(self):
        """``HAMI_SLICE`` when set, else ``CUDA_DEVICE_MEMORY_SHARED_CACHE``, as the
        library takes them; None without either, or for an empty value (the
        library refuses CUDA then)."""
        env = self.environ or {}
        name = SLICE_VARIABLES[0] if SLICE_VARIABLES[0] in env else SLICE_VARIABLES[1]
        return env.get(name) or None


TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_boot = []


def boot_unix(proc="/proc"):
    """When the host booted, as a Unix time (``btime`` of ``/proc/stat``; read once)."""
    if not _boot:
        try:
            with open(f"{proc}/stat", "rb") as f:
                _boot.append(next(int(line.split()[1]) for line in f if line.startswith(b"btime ")))
        except (OSError, StopIteration, ValueError, IndexError):
            return 0.0
    return float(_boot[0])


def pid_namespace(pid, proc="/proc"):
    """The inode of the process's PID namespace (``pid:[4026531836]``), or None."""
    try:
        link = os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return None
    try:
        return int(link[link.index("[") + 1:link.index("]")])
    except ValueError:
        return None


_users = {}


def user_name(uid):
    """The passwd name of *uid* (cached: the agent asks every look), or None."""
    if uid is None:
        return None
    if uid not in _users:
        try:
            _users[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            _users[uid] = None
    return _users[uid]


def _status(pid, proc):
    """``(real uid, PID in its own namespace)`` from ``/proc/<pid>/status``."""
    uid = ns_pid = None
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith(b"NSpid:"):
                    ns_pid = int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return uid, ns_pid


def _environ(pid, proc):
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data:  # in the middle of an exec (or a kernel thread): nothing to go by yet
        return None
    out = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            name = name.decode(errors="replace")
            if name in WANTED:
                out[name] = value.decode(errors="replace")
    return out


def _command(pid, proc):
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            data = f.read(4096)
    except OSError:
        return None
    text = data.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return text[:512] or None


def read_facts(pid, ticks=None, proc="/proc"):
    """The :class:`ProcessFacts` of *pid*, or None when it is gone."""
    ticks = start_ticks(pid, proc) if ticks is None else ticks
    if ticks is None:
        return None
    uid, ns_pid = _status(pid, proc)
    environ = _environ(pid, proc)
    return ProcessFacts(pid, ticks, uid, user_name(uid), pid_namespace(pid, proc), ns_pid, environ,
                        _command(pid, proc))


class ProcessTable:
    """:class:`ProcessFacts` by PID, cached per ``(pid, start time)``.

    :meth:`facts` costs one small read for a process seen before (and the
reads again for one whose environment could not be read); :meth:`keep`
    forgets the processes that left the GPUs, so the cache stays as small as
    the GPU process list.
    """

    def __init__(self, proc="/proc"):
        self.proc = proc
        self._cache = {}

    def facts(self, pid):
        ticks = start_ticks(pid, self.proc)
        if ticks is None:
            self._cache.pop(pid, None)
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached.start_ticks == ticks and cached.environ is not None:
            return cached  # (an environment not read is tried again: it may be readable now)
        found = read_facts(pid, ticks, self.proc)
        if found is not None:
            self._cache[pid] = found
        return found

    def keep(self, pids):
        for pid in set(self._cache) - set(pids):
            del self._cache[pid]
