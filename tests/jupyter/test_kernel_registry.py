"""The kernel registry forgets kernels that died without a shutdown."""

import os
import subprocess
import sys

from hami_jupyter import kernel_registry as reg


def test_entries_of_dead_or_recycled_processes_are_dropped_and_deleted(tmp_path):
    slice_file = tmp_path / "alice.slice"
    me = reg.new_entry(slice_file, "k-live", "alice", "hami-python3", os.getpid())
    assert me.pid_start > 0
    reg.register(slice_file, me)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    reg.register(slice_file, reg.new_entry(slice_file, "k-dead", "alice", "hami-python3", child.pid))
    # A live PID whose start time differs: the PID was reused by another process.
    recycled = reg.new_entry(slice_file, "k-recycled", "alice", "hami-python3", os.getpid())
    recycled.pid_start += 1
    reg.register(slice_file, recycled)

    assert [e.kernel_id for e in reg.kernels(slice_file, include_dead=True)] == ["k-live", "k-dead", "k-recycled"]
    assert [e.kernel_id for e in reg.kernels(slice_file)] == ["k-live"]
    assert sorted(p.name for p in reg.registry_dir(slice_file).iterdir()) == ["k-live.json"]
