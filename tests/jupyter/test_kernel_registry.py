"""The kernel registry forgets kernels that died without a shutdown, and reads
nothing it cannot trust: another user's or a malformed entry is skipped with a
warning, never an exception."""

import json
import os
import subprocess
import sys

import pytest

from hami_jupyter.slice import registry as reg
from hami_jupyter.slice.paths import UntrustedPath


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


# ---- what a reader accepts from a user-writable folder ------------------------------------

def _good(slice_file, kernel_id="k-good"):
    entry = reg.new_entry(slice_file, kernel_id, "alice", "hami-python3", os.getpid())
    reg.register(slice_file, entry)
    return entry


BAD_ENTRIES = {
    # pid: a whole number 1..4194304 (os.kill overflows on the first, fails on the next)
    "k-huge-pid": {"pid": 99999999999},
    "k-string-pid": {"pid": "123"},
    "k-bool-pid": {"pid": True},  # True is 1 to os.kill: init would pass for the kernel
    "k-zero-pid": {"pid": 0},
    "k-negative-pid": {"pid": -1},
    "k-float-pid": {"pid": 12.5},
    "k-null-pid": {"pid": None},
    # start times
    "k-string-start": {"pid_start": "soon"},
    "k-negative-start": {"pid_start": -5},
    "k-huge-start": {"pid_start": 2**64},
    "k-nan-started": {"started_unix": float("nan")},
    "k-text-started": {"started_unix": "yesterday"},
    # strings
    "k-list-user": {"user": ["alice"]},
    "k-long-user": {"user": "a" * 100_000},
    "k-escape-user": {"user": "\x1b[2J\x1b[31mroot"},
    "k-int-kernelspec": {"kernelspec": 3},
    # the activity the server publishes (the broker parks only idle kernels by it)
    "k-text-activity": {"last_activity_unix": "now"},
    "k-inf-activity": {"last_activity_unix": float("inf")},
    "k-string-busy": {"busy": "no"},
    "k-int-busy": {"busy": 0},
    "k-other-id": {"kernel_id": "k-someone-else"},
}


def _write_raw(slice_file, name, text):
    d = reg.registry_dir(slice_file)
    d.mkdir(mode=0o700, exist_ok=True)
    (d / name).write_text(text)


def test_bad_entries_are_skipped_with_a_warning_and_the_good_one_stays(tmp_path, caplog):
    """One malformed entry in a user's registry must not stop root's tools
    (it once did: OverflowError, TypeError)."""
    slice_file = tmp_path / "alice.slice"
    good = _good(slice_file)
    base = {"user": "alice", "kernelspec": "hami-python3", "pid": os.getpid(),
            "started_unix": 1.0, "slice": str(slice_file), "pid_start": 0}
    for kernel_id, change in BAD_ENTRIES.items():
        _write_raw(slice_file, f"{kernel_id}.json", json.dumps({**base, "kernel_id": kernel_id, **change}))
    _write_raw(slice_file, "k-not-json.json", "{pid: 1")
    _write_raw(slice_file, "k-list.json", "[1, 2]")
    _write_raw(slice_file, "k-missing.json", json.dumps({"kernel_id": "k-missing", "pid": os.getpid()}))
    _write_raw(slice_file, "k-deep.json", "[" * 60_000)
    _write_raw(slice_file, "k-big.json", json.dumps({**base, "kernel_id": "k-big", "x": "y" * 70_000}))

    with caplog.at_level("WARNING", logger="hami_jupyter"):
        found = reg.kernels(slice_file)
    assert [e.kernel_id for e in found] == [good.kernel_id]
    assert found[0] == good
    warned = caplog.text
    for kernel_id in [*BAD_ENTRIES, "k-not-json", "k-list", "k-missing", "k-deep", "k-big"]:
        assert f"kernel registry entry {reg.registry_dir(slice_file) / kernel_id}.json skipped" in warned
    assert "pid 99999999999 is out of range 1..4194304" in warned
    assert "pid is str, not a whole number" in warned
    assert "user holds control characters" in warned
    assert "kernel_id 'k-someone-else' differs from its file name" in warned
    assert [e.kernel_id for e in reg.kernels(slice_file, include_dead=True)] == [good.kernel_id]


def test_the_servers_activity_record_keeps_the_entry_and_reads_back(tmp_path):
    slice_file = tmp_path / "alice.slice"
    good = _good(slice_file)
    assert (good.last_activity_unix, good.busy) == (0.0, False)  # nothing published yet
    assert reg.record_activity(slice_file, good.kernel_id, 1764060000.25, True)
    [back] = reg.kernels(slice_file)
    assert (back.last_activity_unix, back.busy) == (1764060000.25, True)
    assert (back.pid, back.user, back.started_unix) == (good.pid, good.user, good.started_unix)
    # No entry, no record: the activity of a kernel never registered makes none.
    assert not reg.record_activity(slice_file, "k-unknown", 1.0, False)
    assert not (reg.registry_dir(slice_file) / "k-unknown.json").exists()


def test_a_registry_or_entry_anyone_may_change_is_not_read(tmp_path, caplog):
    slice_file = tmp_path / "alice.slice"
    _good(slice_file, "k-1")
    d = reg.registry_dir(slice_file)
    _good(slice_file, "k-loose")
    (d / "k-loose.json").chmod(0o666)
    (d / "k-link.json").symlink_to(d / "k-1.json")
    with caplog.at_level("WARNING", logger="hami_jupyter"):
        assert [e.kernel_id for e in reg.kernels(slice_file)] == ["k-1"]
    assert "k-loose.json is writable by every user (mode 666)" in caplog.text
    assert "k-link.json is a symbolic link, not a regular file" in caplog.text

    d.chmod(0o777)
    caplog.clear()
    with caplog.at_level("WARNING", logger="hami_jupyter"):
        assert reg.kernels(slice_file) == []
    assert f"kernel registry {d} is writable by every user (mode 777)" in caplog.text
    with pytest.raises(UntrustedPath, match="writable by every user"):
        reg.register(slice_file, reg.new_entry(slice_file, "k-2", "alice", "py", os.getpid()))
    reg.unregister(slice_file, "k-1")  # left alone, with a warning; never an exception
    assert (d / "k-1.json").exists()


def test_a_fifo_in_the_registry_never_blocks_a_reader(tmp_path):
    slice_file = tmp_path / "alice.slice"
    _good(slice_file)
    os.mkfifo(reg.registry_dir(slice_file) / "k-fifo.json")
    code = ("import sys; from hami_jupyter.slice import registry as reg; "
            "print([e.kernel_id for e in reg.kernels(sys.argv[1])])")
    child = subprocess.run([sys.executable, "-c", code, str(slice_file)], capture_output=True,
                           text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "['k-good']"
    assert "k-fifo.json is a FIFO (named pipe), not a regular file" in child.stderr
