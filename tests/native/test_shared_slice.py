"""One slice, many processes: one cap for all, one slot each, the file's limits win."""

import pytest

from native_helpers import (
    CUDA_ERROR_OUT_OF_MEMORY,
    GiB,
    MiB,
    SIM_CONTEXT,
    slice_device,
    slot_of,
    wait_for,
)


def _start_all(cudrive, env, n):
    procs = [cudrive.start(env) for _ in range(n)]
    for p in procs:
        p.send("init")
        p.send("ctx 0")
    for p in procs:
        assert p.read()["rc"] == 0
        assert p.read()["rc"] == 0, p.stderr()
    return procs


def _race(procs, iterations, maxsize, timeout):
    for i, p in enumerate(procs):
        p.send(f"race {iterations} {maxsize} {i + 1}")
    return [p.read(timeout=timeout) for p in procs]


@pytest.mark.parametrize(
    "nprocs, limit, iterations, maxsize",
    [(2, "1g", 300000, "96m"), (16, "2g", 100000, "64m")],
    ids=["2-processes", "16-processes"],
)
def test_concurrent_processes_never_pass_the_cap(cudrive, make_slice, gpu, nprocs, limit, iterations, maxsize):
    s = make_slice(limit=limit, overhead="64m")
    cap = {"1g": GiB, "2g": 2 * GiB}[limit]
    procs = _start_all(cudrive, s.env, nprocs)
    results = _race(procs, iterations, maxsize, timeout=60)
    for rec in results:
        assert rec["rc"] == 0 and rec["other"] == 0 and rec["free_failed"] == 0, rec
        assert rec["freed"] == rec["ok"], rec
    assert sum(r["ok"] for r in results) > 0
    assert sum(r["oom"] for r in results) > 0, "the race never reached the cap: it tested nothing"
    # The independent witness: the GPU itself never held more than the cap.
    assert gpu.peak(0) <= cap, (gpu.peak(0), cap)
    assert slice_device(s.snapshot(), gpu.uuid(0)).memory_peak <= cap

    # Half of them leave, the others keep 50 MiB each.
    leaving, staying = procs[: nprocs // 2], procs[nprocs // 2:]
    for p in leaving:
        assert p.close() == 0
    for p in staying:
        p.ok("alloc 50m keep")
    expected = len(staying) * (SIM_CONTEXT + 50 * MiB)

    def settled():
        staying[0].ok("meminfo")  # activity, in case reclaiming needs some
        snap = s.snapshot()
        return slice_device(snap, uuid).memory_used == expected and not snap.stale_slots and snap

    uuid = gpu.uuid(0)
    snap = wait_for(settled, timeout=1.0, what=f"slice usage {expected}")
    assert sorted(slot.pid for slot in snap.slots) == sorted(p.pid for p in staying)
    dev = slice_device(snap, uuid).index
    assert sum(slot.memory_used[dev] for slot in snap.slots) == expected
    assert gpu.used(0) == expected  # the GPU agrees


def test_second_process_gets_only_what_is_left(cudrive, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    a = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 512m"):
        a.ok(line)
    res = cudrive.run("init ctx 0 meminfo alloc 384m alloc 1", s.env)
    assert res.one("meminfo")["free"] == 384 * MiB, res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    # The second process has exited: its share comes back to the first.
    wait_for(lambda: a.cmd("alloc 448m back")["rc"] == 0, timeout=1.0, what="the share back")


def test_each_process_has_its_own_slot_with_its_kernel_id(cudrive, make_slice, gpu):
    a_slice = make_slice(limit="4g", overhead="64m", HAMI_KERNEL_ID="kernel-a")
    b_env = dict(a_slice.env, HAMI_KERNEL_ID="kernel-b")
    a, b = cudrive.start(a_slice.env), cudrive.start(b_env)
    for p, size in ((a, "100m"), (b, "200m")):
        p.ok("init")
        p.ok("ctx 0")
        p.ok(f"alloc {size}")
    snap = a_slice.snapshot()
    device = slice_device(snap, gpu.uuid(0))
    dev = device.index
    slot_a, slot_b = slot_of(snap, a.pid), slot_of(snap, b.pid)
    assert slot_a is not None and slot_b is not None and slot_a.index != slot_b.index
    assert (slot_a.kernel_id, slot_b.kernel_id) == ("kernel-a", "kernel-b")
    assert slot_a.memory_used[dev] == SIM_CONTEXT + 100 * MiB
    assert slot_b.memory_used[dev] == SIM_CONTEXT + 200 * MiB
    assert device.memory_used == 2 * SIM_CONTEXT + 300 * MiB


def test_slice_file_records_the_creators_limits_by_uuid(cudrive, make_slice, gpu):
    s = make_slice(name="team", limit="1g", overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_1="2g")
    res = cudrive.run("init ctx 0 ctx 1 uuid 0 uuid 1", s.env)
    uuids = [r["uuid"] for r in res.ops("uuid")]
    snap = s.snapshot()
    limits = {d.uuid: d.limit.memory_limit for d in snap.devices}
    assert limits == {uuids[0]: GiB, uuids[1]: 2 * GiB}
    assert snap.name == "team"


def test_existing_file_limits_win_over_the_environment(cudrive, make_slice):
    first = make_slice(name="team", limit="1g", overhead="0")
    cudrive.run("init ctx 0 ctx 1", first.env)
    later = make_slice(name="team", limit="8g", overhead="0")
    res = cudrive.run("init totalmem 0 ctx 0 alloc 1g alloc 1", later.env)
    assert res.one("totalmem")["total"] == GiB, res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


def test_hami_shared_cache_variable_names_the_slice(cudrive, make_slice, tmp_path):
    path = tmp_path / "hami-cache"
    s = make_slice(name=None, limit="1g", overhead="64m", CUDA_DEVICE_MEMORY_SHARED_CACHE=path)
    a = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 512m"):
        a.ok(line)
    assert path.exists()
    res = cudrive.run("init ctx 0 alloc 512m alloc 384m", s.env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, 0], res.describe()


def test_private_slice_without_a_slice_file(cudrive, make_slice):
    s = make_slice(name=None, limit="1g", overhead="0")
    a = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 1g"):
        a.ok(line)
    assert a.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY  # still capped
    # Another process without a slice file has a slice of its own.
    res = cudrive.run("init ctx 0 alloc 1g alloc 1", s.env)
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


def test_threads_of_one_process_never_pass_the_cap(cudrive, make_slice, gpu):
    # The hooks are called from many threads at once (PyTorch, data loaders):
    # the per-process tables and the slot must hold up, and the cap too.
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    rec = p.ok("threads 8 40000 64m 7", timeout=120)
    assert rec["other"] == 0 and rec["free_failed"] == 0, rec
    assert rec["freed"] == rec["ok"] > 0, rec
    assert rec["oom"] > 0, "the threads never reached the cap: it tested nothing"
    assert gpu.peak(0) <= GiB, gpu.peak(0)
    # Every thread freed all it took: only the context is left charged.
    assert s.used(0) == SIM_CONTEXT
    assert s.slot_used(p.pid, 0) == SIM_CONTEXT
