"""Processes a test started, found again by a tag in their environment.

A server started by a test (JupyterHub, JupyterLab) starts proxies, servers
and kernels of its own, some of which outlive it or get re-parented to init.
Every one inherits the environment, so a per-run tag variable finds them all
in /proc, whoever their parent is now, and the test can end them and say
which were left.
"""

import os
import signal
import time


def tagged_processes(variable, tag):
    """PIDs of live (not zombie) processes whose environment has ``variable=tag``."""
    needle = f"{variable}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != b"Z":
            found.append(int(entry))
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def end_tagged(variable, tag, grace=0.0):
    """Wait up to *grace* s for the tagged processes to end by themselves, then
    end the rest (SIGTERM, then SIGKILL, 3 s each). Returns ``[(pid, cmdline)]``
    of those that were still alive after the grace: a test fails on them."""
    deadline = time.monotonic() + grace
    while tagged_processes(variable, tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(pid, cmdline(pid)) for pid in tagged_processes(variable, tag)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = tagged_processes(variable, tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while tagged_processes(variable, tag) and time.monotonic() < deadline:
            time.sleep(0.1)
    return left
