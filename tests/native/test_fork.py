"""fork(): a child that uses CUDA is a process of the slice in its own right.

cudrive's `child ... endchild` runs the enclosed commands in a fork()ed child;
`waitfile` holds the child until the test has looked at the slice file.
"""

import os
import signal

from native_helpers import CUDA_SUCCESS, MiB, SIM_CONTEXT, slice_device, slot_of, wait_for

RECLAIM_S = 1.0


def _parent(cudrive, env, size="256m"):
    p = cudrive.start(env)
    for line in ("init", "ctx 0", f"alloc {size}"):
        p.ok(line)
    return p


def _fork_child(p, go, size="128m"):
    """Start a child that takes a context and SIZE, then waits for *go*; returns its pid."""
    p.send(f"child init ctx 0 alloc {size} echo ready waitfile {go} endchild")
    records = p.until("echo")
    for rec in records:
        assert rec["rc"] == CUDA_SUCCESS, records
    child = records[-1]["pid"]
    assert child != p.pid
    return child


def test_forked_child_gets_a_slot_of_its_own(cudrive, make_slice, gpu, tmp_path):
    s = make_slice(limit="2g", overhead="64m")
    parent = _parent(cudrive, s.env)
    go = tmp_path / "go"
    child = _fork_child(parent, go)
    snap = s.snapshot()
    p_slot, c_slot = slot_of(snap, parent.pid), slot_of(snap, child)
    assert p_slot is not None and c_slot is not None and p_slot.index != c_slot.index
    dev = slice_device(snap, gpu.uuid(0)).index
    assert p_slot.memory_used[dev] == SIM_CONTEXT + 256 * MiB
    assert c_slot.memory_used[dev] == SIM_CONTEXT + 128 * MiB
    assert s.used(0) == 2 * SIM_CONTEXT + 384 * MiB
    go.touch()
    records = parent.until("child")
    assert records[-1]["status"] == 0 and records[-1]["signal"] == 0, records
    wait_for(lambda: parent.ok("meminfo") and s.used(0) == SIM_CONTEXT + 256 * MiB,
             timeout=RECLAIM_S, what="the child's share back")


def test_killed_child_returns_its_share(cudrive, make_slice, tmp_path):
    s = make_slice(limit="2g", overhead="64m")
    parent = _parent(cudrive, s.env)
    child = _fork_child(parent, tmp_path / "go")
    os.kill(child, signal.SIGKILL)
    records = parent.until("child")
    assert records[-1]["signal"] == signal.SIGKILL, records
    wait_for(lambda: parent.ok("meminfo") and s.used(0) == SIM_CONTEXT + 256 * MiB,
             timeout=RECLAIM_S, what="the killed child's share back")
    assert slot_of(s.snapshot(), child) is None
    assert parent.ok("meminfo")["free"] == 2 * 1024 * MiB - SIM_CONTEXT - 256 * MiB


def test_parent_killed_while_its_child_lives(cudrive, make_slice, gpu, tmp_path):
    # The child inherits the parent's open files: the parent's slot must still
    # be reclaimed when the parent dies, and the child's slot must not be.
    s = make_slice(limit="2g", overhead="64m")
    witness = cudrive.start(s.env)
    witness.ok("init")
    witness.ok("ctx 0")
    parent = _parent(cudrive, s.env)
    go = tmp_path / "go"
    child = _fork_child(parent, go)
    parent.kill9()
    expected = 2 * SIM_CONTEXT + 128 * MiB  # the witness's context, the child's context and 128m
    uuid = gpu.uuid(0)

    def settled():
        witness.ok("meminfo")
        snap = s.snapshot()
        return (slot_of(snap, parent.pid) is None and slot_of(snap, child) is not None
                and not snap.stale_slots and slice_device(snap, uuid).memory_used == expected)

    wait_for(settled, timeout=RECLAIM_S, what="the parent's share back, the child's kept")
    go.touch()  # the orphaned child ends now
    wait_for(lambda: witness.ok("meminfo") and s.used(0) == SIM_CONTEXT, timeout=RECLAIM_S + 2.0,
             what="the child's share back after it exits")


def test_child_of_a_parent_that_never_used_cuda(cudrive, make_slice):
    s = make_slice(limit="2g", overhead="64m")
    p = cudrive.start(s.env)
    p.send("child init ctx 0 alloc 64m endchild")
    records = p.until("child")
    assert [r["rc"] for r in records] == [0, 0, 0, 0], records
    assert records[-1]["status"] == 0
    assert len({r["pid"] for r in records[:-1]}) == 1 and records[0]["pid"] != p.pid
