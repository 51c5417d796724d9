"""A process by its PID and its start time, and ending one safely.

A PID alone does not name a process for long: once it ends, the kernel may
give the number to another. With its start time (field 22 of
``/proc/<pid>/stat``) it names exactly one. The guard, which ends or parks
processes, and the administrators' tools, which resume or end what the guard
parked, both act only on the process they looked at.
"""

import os
import signal


def start_ticks(pid, proc="/proc"):
    """Field 22 of ``/proc/<pid>/stat``, or None when the process is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces and ')': split after the last one.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def end_process(pid, ticks, proc="/proc"):
    """SIGKILL *pid* if it is still the process that started at *ticks*.

    True when signalled, False when that process is gone (or its PID now
    names another); PermissionError when this user may not signal it.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # a kernel before 5.3: check, then kill by PID
        fd = None
    try:
        if start_ticks(pid, proc) != ticks:
            return False
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
    finally:
        if fd is not None:
            os.close(fd)
    return True
