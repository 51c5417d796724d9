"""The memory cap: exact, in every accepted form, per device, with a clear message."""

import os
import re

import pytest

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, SIM_CONTEXT, SIM_MEMORY, mentions_size

from hami_jupyter.slice import registry


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


def _refusal(stderr):
    """The lines of one refusal, in the order a person reads them (issue 41, item 5):
    plain words (what does not fit, who else holds the slice's memory), what to do
    and whom to ask, then the technical line."""
    lines = [line for line in stderr.splitlines() if line.startswith("hami: ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("hami: not enough GPU memory"))
    plain, advice, technical = lines[start:start + 3]
    assert advice.startswith("hami: To go on: "), lines
    assert technical.startswith("hami: out of memory on "), lines
    return plain, advice, technical


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
    plain, advice, technical = _refusal(res.stderr)
    assert technical == line
    # Plain words first: no driver call, no "CUDA contexts" before the technical line.
    assert plain == ('hami: not enough GPU memory: this notebook\'s slice "alice" holds 768.0 MiB '
                     'of its 1.0 GiB cap on GPU 0, and 512.0 MiB more do not fit.'), plain
    assert "free tensors you no longer need" in advice and "%hami release" in advice, advice
    # Whom to ask for a bigger cap, and how (no hub here: the administrator, or the command).
    assert 'For a bigger cap, ask your administrator (on your own machine: hami-jupyter slice set ' \
           'alice --memory SIZE).' in advice, advice
    for said in (plain, advice, technical):
        assert "limit" not in said and "GPU-" not in said, said
        assert "administrator set" not in said and "lowered" not in said, said  # nobody changed the cap


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
    plain, advice, _ = _refusal(p.stderr())
    assert re.search(r"The cap was lowered at \d\d:\d\d, below what the slice already holds: "
                     r"new memory is refused until its use falls under the cap\.", plain), plain
    assert "administrator set" not in plain + advice, plain  # no hub marker: the slice's own


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
    plain, advice, _ = _refusal(res.stderr)
    if os.geteuid() == 0:
        assert re.search(r"An administrator set this cap at \d\d:\d\d\.", plain), plain
        assert "For a bigger cap, ask the administrator who set this one." in advice, advice
    else:  # only root's marker is believed
        assert "administrator set" not in plain + advice, plain


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


def test_out_of_memory_names_the_other_kernel_that_holds_the_slices_memory(cudrive, make_slice):
    """Issue 41, item 5: a refusal says that another kernel of the same slice holds
    memory, how much, and which notebook it serves (its registry entry), and that
    parking or shutting it down makes room."""
    s = make_slice(name="alice", limit="1g", overhead="0")
    other_id = "0f3c2a9e-1111-2222-3333-444455556666"
    other = cudrive.start({**s.env, "HAMI_KERNEL_ID": other_id})
    other.ok("init")
    other.ok("ctx 0")
    other.ok("alloc 600m")
    registry.register(s.path, registry.new_entry(s.path, other_id, "alice", "hami-python3", other.pid,
                                                 "work/analysis \u00e9t\u00e9.ipynb"))
    res = cudrive.run("init ctx 0 alloc 300m alloc 200m", {**s.env, "HAMI_KERNEL_ID": "mine"})
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    plain, advice, technical = _refusal(res.stderr)
    assert plain == ('hami: not enough GPU memory: this notebook\'s slice "alice" holds 900.0 MiB '
                     'of its 1.0 GiB cap on GPU 0; 600.0 MiB of it by another kernel of the slice: '
                     'work/analysis \u00e9t\u00e9.ipynb, and 200.0 MiB more do not fit.'), plain
    assert "or shut down or park work/analysis \u00e9t\u00e9.ipynb's kernel" in advice, advice
    assert 'slice "alice" has 900.0 MiB of its 1.0 GiB cap in use' in technical, technical

    # Without a registry entry (a kernel started outside Jupyter): named by its id.
    registry.unregister(s.path, other_id)
    res = cudrive.run("init ctx 0 alloc 300m alloc 200m", {**s.env, "HAMI_KERNEL_ID": "mine"})
    plain, advice, _ = _refusal(res.stderr)
    assert "600.0 MiB of it by another kernel of the slice: kernel 0f3c2a9e," in plain, plain
    other.close()


def test_out_of_memory_under_a_hub_says_where_to_pick_a_bigger_size(cudrive, make_slice):
    """Issue 41, item 5: under JupyterHub (its variables are in every kernel's
    environment) a bigger cap is a larger size from the hub's list at the next
    start of the server, or the administrator's."""
    s = make_slice(name="alice", limit="1g", overhead="0")
    res = cudrive.run("init ctx 0 alloc 2g", {**s.env, "JUPYTERHUB_API_URL": "http://hub:8081/hub/api"})
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    _, advice, _ = _refusal(res.stderr)
    assert ("For a bigger cap, stop your server (File > Hub Control Panel > Stop My Server) and start "
            "it again with a larger size from the hub's list, or ask your administrator.") in advice, advice
