"""The memory cap: exact, in every accepted form, per device, with a clear message."""

import os
import re

import pytest

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, SIM_CONTEXT, SIM_MEMORY, mentions_size


def test_four_quarters_fit_a_1g_slice_without_context_overhead(cudrive, make_slice, gpu):
    s = make_slice(limit="1g", overhead="0")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    rcs = [p.cmd(f"alloc 256m q{i}")["rc"] for i in range(5)]
    assert rcs == [0, 0, 0, 0, CUDA_ERROR_OUT_OF_MEMORY]
    assert s.used(0) == GiB
    assert s.slot_used(p.pid, 0) == GiB
    # The refused call never reached the driver: the GPU holds the context and 1 GiB.
    assert gpu.used(0) == SIM_CONTEXT + GiB
    p.ok("free q0")
    p.ok("alloc 256m again")  # room again after a free
    assert s.used(0) == GiB


def test_context_overhead_counts_against_the_cap(cudrive, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    res = cudrive.run("init ctx 0 alloc 256m alloc 256m alloc 256m alloc 256m "
                      "alloc 192m alloc 1", s.env)
    assert res.rcs("alloc") == [0, 0, 0, CUDA_ERROR_OUT_OF_MEMORY, 0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


@pytest.mark.parametrize(
    "form, limit",
    [
        ("4g", 4 * GiB),
        ("4096m", 4 * GiB),
        ("4Gi", 4 * GiB),
        ("1.5g", 3 * GiB // 2),
        ("1536MiB", 1536 * MiB),
        ("3000000000", 3000000000),
    ],
)
def test_limit_forms(cudrive, make_slice, form, limit):
    s = make_slice(limit=form, overhead="0")
    res = cudrive.run(f"init ctx 0 totalmem 0 meminfo alloc {limit} alloc 1", s.env)
    assert res.one("totalmem")["total"] == limit, res.describe()
    assert res.one("meminfo")["total"] == limit, res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


def test_per_device_limit_overrides_the_general_one(cudrive, make_slice):
    s = make_slice(limit="2g", overhead="0", CUDA_DEVICE_MEMORY_LIMIT_1="1g")
    res = cudrive.run("init totalmem 0 totalmem 1 "
                      "ctx 1 alloc 1g alloc 1 "
                      "ctx 0 alloc 1g alloc 1g alloc 1", s.env)
    totals = [r["total"] for r in res.ops("totalmem")]
    assert totals == [2 * GiB, GiB], res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY, 0, 0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


def test_per_device_limit_alone_leaves_other_devices_unlimited(cudrive, make_slice):
    s = make_slice(limit=None, overhead="0", CUDA_DEVICE_MEMORY_LIMIT_0="1g")
    res = cudrive.run("init totalmem 0 totalmem 1 ctx 0 alloc 1g alloc 1 ctx 1 alloc 8g", s.env)
    assert [r["total"] for r in res.ops("totalmem")] == [GiB, SIM_MEMORY], res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY, 0], res.describe()


def test_cap_follows_cuda_visible_devices_by_index(cudrive, make_slice, gpu):
    s = make_slice(limit=None, overhead="0", CUDA_DEVICE_MEMORY_LIMIT_0="1g", CUDA_VISIBLE_DEVICES="1")
    p = cudrive.start(s.env)
    p.ok("init")
    assert p.ok("count")["count"] == 1
    assert p.ok("uuid 0")["uuid"] == gpu.uuid(1)
    assert p.ok("totalmem 0")["total"] == GiB
    p.ok("ctx 0")
    p.ok("alloc 768m")
    assert p.cmd("alloc 512m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    # The capped memory is on physical GPU 1, and the slice file says so by UUID.
    assert gpu.used(1) == SIM_CONTEXT + 768 * MiB
    assert gpu.used(0) == 0
    assert s.used(1) == 768 * MiB
    snap = s.snapshot()
    assert [d.uuid for d in snap.devices] == [gpu.uuid(1)]
    assert snap.devices[0].limit.memory_limit == GiB


def test_cap_follows_cuda_visible_devices_by_uuid(cudrive, make_slice, gpu):
    uuid1 = cudrive.run("init uuid 1", gpu.env()).one("uuid")["uuid"]  # no preload
    s = make_slice(limit=None, overhead="0", CUDA_DEVICE_MEMORY_LIMIT_0="1g", CUDA_VISIBLE_DEVICES=uuid1)
    res = cudrive.run("init count uuid 0 totalmem 0 ctx 0 alloc 1g alloc 1", s.env)
    assert res.one("count")["count"] == 1, res.describe()
    assert res.one("uuid")["uuid"] == uuid1, res.describe()
    assert res.one("totalmem")["total"] == GiB, res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()


def _oom_lines(stderr):
    return [line for line in stderr.splitlines() if "out of memory" in line and "hami:" in line]


def test_out_of_memory_message_names_slice_and_limit(cudrive, make_slice):
    s = make_slice(name="alice", limit="1g", overhead="0")
    res = cudrive.run("init ctx 0 alloc 768m alloc 512m", s.env)
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    lines = _oom_lines(res.stderr)
    assert len(lines) == 1, res.describe()
    line = lines[0]
    assert 'slice "alice"' in line, line
    assert mentions_size(line, GiB), f"the limit (1 GiB) is not in: {line}"


def test_out_of_memory_message_says_which_gpu_how_much_and_what_to_do(cudrive, make_slice):
    """Issue 35, item 5: the line a data scientist reads names the GPU by the index
    her program uses, what was asked, how much of the cap is in use, and what to do;
    "cap" is the word, as everywhere else, and no UUID."""
    s = make_slice(name="alice", limit="1g", overhead="0")
    res = cudrive.run("init ctx 0 alloc 768m alloc 512m", s.env)
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    (line,) = _oom_lines(res.stderr)
    assert line.startswith('hami: out of memory on GPU 0: cuMemAlloc asked for 512.0 MiB; '
                           'slice "alice" has 768.0 MiB of its 1.0 GiB cap in use'), line
    assert "free tensors you no longer need" in line and "%hami release" in line, line
    assert "ask for a bigger size" in line, line
    assert "limit" not in line and "GPU-" not in line, line
    assert "administrator" not in line and "lowered" not in line, line  # nobody changed the cap


def test_out_of_memory_message_names_the_gpu_as_the_program_numbers_it(cudrive, make_slice, gpu):
    # CUDA_VISIBLE_DEVICES=1,0: the program's GPU 1 is the machine's GPU 0.
    s = make_slice(name="alice", limit="1g", overhead="0", CUDA_VISIBLE_DEVICES="1,0")
    res = cudrive.run("init ctx 1 alloc 2g", s.env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    (line,) = _oom_lines(res.stderr)
    assert "out of memory on GPU 1: cuMemAlloc asked for 2.0 GiB" in line, line


def test_out_of_memory_after_the_cap_was_lowered_says_so(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_memory_limit

    s = make_slice(name="alice", limit="1g", overhead="0")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 768m")
    set_memory_limit(s.path, gpu.uuid(0), 512 * MiB)
    assert p.cmd("alloc 1m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    p.close()
    (line,) = _oom_lines(p.stderr())
    assert 'slice "alice" has 768.0 MiB of its 512.0 MiB cap in use' in line, line
    assert re.search(r"The cap was lowered at \d\d:\d\d, below what the slice already holds: "
                     r"new memory is refused until its use falls under the cap\.", line), line
    assert "administrator" not in line, line  # no hub marker: the slice's own


def test_out_of_memory_under_an_administrators_cap_says_who_set_it(cudrive, make_slice):
    from hami_jupyter.admin.marks import admin_mark_path
    from hami_jupyter.slice.create import create_limits_file, create_slice
    from hami_jupyter.slice.limits import Limits

    s = make_slice(name="team.slice", limit=None, overhead="0")
    create_slice(s.path, "team", Limits())
    create_limits_file(s.path, Limits(memory_limit=GiB))
    # The hub's marker of an administrator's limits (root's, nobody else may write it).
    admin_mark_path(s.path).write_text('{"who": "carol", "limits": {}}')
    os.chmod(admin_mark_path(s.path), 0o644)
    res = cudrive.run("init ctx 0 alloc 2g", s.env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    (line,) = _oom_lines(res.stderr)
    if os.geteuid() == 0:
        assert re.search(r"An administrator set this cap at \d\d:\d\d\.", line), line
    else:  # only root's marker is believed
        assert "administrator" not in line, line


def test_out_of_memory_message_uses_hami_slice_name(cudrive, make_slice):
    s = make_slice(name="slice-file", limit="1g", overhead="0", HAMI_SLICE_NAME="analysts")
    res = cudrive.run("init ctx 0 alloc 2g", s.env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    lines = _oom_lines(res.stderr)
    assert len(lines) == 1 and 'slice "analysts"' in lines[0], res.describe()


def test_out_of_memory_message_is_rate_limited(cudrive, make_slice):
    s = make_slice(limit="1g", overhead="0")
    attempts = 300
    res = cudrive.run(["init", "ctx", "0"] + ["alloc", "2g"] * attempts, s.env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY] * attempts, res.describe()
    lines = _oom_lines(res.stderr)
    # About one line a second: never one per failed call.
    assert 1 <= len(lines) <= int(res.wall) + 2, (len(lines), res.wall, res.stderr[-2000:])


def test_raised_limit_applies_to_a_running_process(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_memory_limit

    s = make_slice(limit="1g", overhead="0")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    assert p.cmd("alloc 1536m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    set_memory_limit(s.path, gpu.uuid(0), 2 * GiB)
    # The next call sees it: limits are read at every charge, no restart.
    p.ok("alloc 1536m")
    assert p.ok("meminfo")["total"] == 2 * GiB
    assert s.used(0) == 1536 * MiB
