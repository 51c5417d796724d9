"""A dead process's entry in the simulated GPU, taken over by a newcomer that
has not yet reclaimed it, is not a live process.

A process that takes over a dead one's entry holds the entry's lock a moment
before it empties the entry; stopped in that moment (the kill storm's frozen
samples stop every process), the entry looked like its dead owner alive, with
the dead owner's bytes. The real driver never lists a dead process: neither
``hami-simctl status`` nor NVML's process list may. Here the test process
holds every entry's lock itself, the newcomer that never gets further.
"""

import fcntl
import os
import signal

from native_helpers import MiB


def test_a_dead_processs_entry_held_by_a_newcomer_is_not_alive(cudrive, gpu):
    victim = cudrive.with_context(gpu.env(), "alloc 96m")
    pid = victim.pid
    assert gpu.process_used(pid, 0) >= 96 * MiB

    os.kill(pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    fd = os.open(gpu.state, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)  # the whole file: every entry looks held
        entries = [p for p in gpu.status()["processes"] if p["pid"] == pid]
        assert entries and not any(p["alive"] for p in entries), entries
        listed = cudrive.run("nvml nvmlprocs 0", gpu.env()).one("nvmlprocs")["processes"]
        assert pid not in {e["pid"] for e in listed}, listed
    finally:
        os.close(fd)  # the newcomer goes on: the dead process's bytes come back
    assert gpu.process_used(pid, 0) == 0
    assert all(p["pid"] != pid for p in gpu.status()["processes"])
