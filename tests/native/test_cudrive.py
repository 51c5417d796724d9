"""cudrive itself and the simulated GPU it drives, without the preload library.

These are the baseline the preload tests stand on: if cudrive misparses a
script or the sim miscounts, every other test here would mislead.
"""

import os
import signal

import pytest

from native_helpers import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GiB,
    KiB,
    MiB,
    SIM_CONTEXT,
    SIM_DEVICES,
    SIM_MEMORY,
    wait_for,
)


def test_usage_errors_are_reported_and_the_run_goes_on(cudrive, gpu):
    res = cudrive.run("alloc 4x", gpu.env())
    assert res.returncode == 0
    assert [(r["op"], r["rc"], r["err"]) for r in res.records] == [("alloc", -1, "CUDRIVE_USAGE")]
    res = cudrive.run("echo a bogus echo b", gpu.env())
    assert [r["op"] for r in res.records] == ["echo", "bogus"]
    assert res.records[1]["err"] == "CUDRIVE_UNKNOWN_COMMAND"
    res = cudrive.run("free nothing echo next", gpu.env())
    assert res.records[0]["err"] == "CUDRIVE_NO_SUCH_NAME"


def test_stdin_mode_one_answer_per_command_and_exit_code(cudrive, gpu):
    script = "echo one\n# a comment line\necho two  # trailing comment\nexit 7\necho never\n"
    res = cudrive.run("stdin", gpu.env(), input=script)
    assert [(r["op"], r.get("text")) for r in res.records] == [("echo", "one"), ("echo", "two"), ("exit", None)]
    assert res.returncode == 7


@pytest.mark.parametrize(
    "size, nbytes",
    [("3000", 3000), ("1k", KiB), ("2m", 2 * MiB), ("1g", GiB), ("1.5g", 3 * GiB // 2), ("256MiB", 256 * MiB),
     ("1Gi", GiB)],
)
def test_sizes(cudrive, gpu, size, nbytes):
    res = cudrive.run(f"init ctx 0 alloc {size} x free x", gpu.env())
    rec = res.one("alloc")
    assert rec["rc"] == CUDA_SUCCESS and rec["size"] == nbytes and rec["name"] == "x", res.describe()
    assert res.one("free")["size"] == nbytes


def test_names_auto_and_given(cudrive, gpu):
    # A usage error drops the rest of its line only: the next line runs.
    res = cudrive.run("stdin", gpu.env(), input="init ctx 0 alloc 1m alloc 1m mine alloc 1m\n"
                      "alloc 1m mine echo dropped\nlist\n")
    names = [r.get("name") for r in res.ops("alloc")]
    assert names[:3] == ["a0", "mine", "a1"], res.describe()
    assert res.ops("alloc")[3]["err"] == "CUDRIVE_NAME_IN_USE"
    assert not res.ops("echo")
    assert res.one("list")["count"] == 3


def test_child_block_runs_in_a_forked_child(cudrive, gpu):
    res = cudrive.run("echo parent child echo in-child exit 3 endchild echo after", gpu.env())
    ops = [(r["op"], r.get("text")) for r in res.records]
    assert ops == [("echo", "parent"), ("echo", "in-child"), ("exit", None), ("child", None), ("echo", "after")]
    parent_pid = res.records[0]["pid"]
    child = res.one("child")
    assert res.records[1]["pid"] == child["child"] != parent_pid
    assert (child["status"], child["signal"]) == (3, 0)


def test_child_block_across_stdin_lines(cudrive, gpu):
    res = cudrive.run("stdin", gpu.env(), input="child\necho inside\nendchild echo after\necho last\n")
    assert [(r["op"], r.get("text")) for r in res.records] == [
        ("echo", "inside"), ("child", None), ("echo", "after"), ("echo", "last")]


def test_hold_blocks_until_stdin_ends(cudrive, gpu):
    p = cudrive.start(gpu.env())
    assert p.cmd("hold")["op"] == "hold"
    assert p.alive()
    assert p.close() == 0


def test_simulated_gpu_answers(cudrive, gpu):
    res = cudrive.run("init count uuid 0 uuid 1 totalmem 0 totalmem 1 ctx 0 meminfo", gpu.env())
    assert res.one("count")["count"] == SIM_DEVICES, res.describe()
    uuids = [r["uuid"] for r in res.ops("uuid")]
    assert len(set(uuids)) == 2 and all(u.startswith("GPU-") for u in uuids)
    assert [r["total"] for r in res.ops("totalmem")] == [SIM_MEMORY, SIM_MEMORY]
    info = res.one("meminfo")
    assert (info["total"], info["free"]) == (SIM_MEMORY, SIM_MEMORY - SIM_CONTEXT)
    assert [d["uuid"] for d in gpu.status()["devices"]] == uuids


def test_sim_counts_contexts_and_allocations(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    assert gpu.used(0) == SIM_CONTEXT == gpu.process_used(p.pid, 0)
    p.ok("alloc 1g a")
    assert gpu.used(0) == SIM_CONTEXT + GiB
    assert p.ok("meminfo")["free"] == SIM_MEMORY - SIM_CONTEXT - GiB
    p.ok("free a")
    assert gpu.used(0) == SIM_CONTEXT
    assert gpu.peak(0) == SIM_CONTEXT + GiB
    gpu.reset_peak()
    assert gpu.peak(0) == SIM_CONTEXT
    p.ok("ctxrelease 0")
    assert gpu.used(0) == 0


def test_fill_to_the_physical_memory(cudrive, gpu):
    res = cudrive.run("init ctx 0 fill 1g list", gpu.env())
    fill = res.one("fill")
    assert fill["count"] == SIM_MEMORY // GiB - 1, res.describe()  # the context takes 64m
    assert fill["last_rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert fill["bytes"] == fill["count"] * GiB
    assert res.one("list")["count"] == fill["count"]


def test_race_without_limit(cudrive, gpu):
    res = cudrive.run("init ctx 0 race 500 8m 1 meminfo", gpu.env())
    race = res.one("race")
    assert race["ok"] > 0 and race["oom"] == 0 and race["other"] == 0
    assert race["freed"] == race["ok"] and race["free_failed"] == 0
    assert res.one("meminfo")["free"] == SIM_MEMORY - SIM_CONTEXT


def test_sim_returns_a_killed_process_memory(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 2g")
    assert gpu.used(0) == SIM_CONTEXT + 2 * GiB
    p.kill9()
    wait_for(lambda: gpu.used(0) == 0, timeout=2.0, what="the sim reclaiming the dead process")


def test_every_kind_of_allocation_on_the_sim(cudrive, gpu):
    res = cudrive.run("init ctx 0 alloc 1m pitch 100 100 4 managed 1m async 1m pool 0 P poolalloc P 1m "
                      "poolattr P memcreate 2m 0 memcreate 2m host array 64 64 f32 4 array3d 8 8 8 u8 1 "
                      "mipmap 64 64 0 f16 2 3 freeall sync pooltrim P 0 pooltrim default 0 poolattr P "
                      "poolattr default pooldestroy P ctxcreate 0 C ctxdestroy C", gpu.env())
    bad = [r for r in res.records if r["rc"] != CUDA_SUCCESS]
    assert not bad, res.describe()
    assert res.one("freeall")["freed"] == 10
    assert res.ops("poolattr")[0]["used"] >= MiB
    assert [r["reserved"] for r in res.ops("poolattr")[1:]] == [0, 0]


def test_null_outputs_on_the_sim_do_not_crash(cudrive, gpu):
    whats = ["alloc", "pitch", "managed", "async", "meminfo", "totalmem", "memcreate", "array", "array3d",
             "mipmap", "getproc"]
    res = cudrive.run(["init", "ctx", "0"] + [w for what in whats for w in ("null", what)] + ["echo", "end"],
                      gpu.env())
    assert res.returncode == 0 and res.records[-1]["op"] == "echo", res.describe()
    assert all(r["rc"] != CUDA_SUCCESS for r in res.ops("null")), res.describe()


def test_resolve_modes_reach_the_same_driver(cudrive, gpu):
    for mode in ("dlsym", "procaddr", "procaddr1", "procaddr 12000 2"):
        res = cudrive.run(f"resolve {mode} init ctx 0 alloc 1m a async 1m b free a free b meminfo", gpu.env())
        assert all(r["rc"] == CUDA_SUCCESS for r in res.records), res.describe()


def test_kill_signal_reported_for_a_child(cudrive, gpu, tmp_path):
    p = cudrive.start(gpu.env())
    p.send(f"child echo waiting waitfile {tmp_path / 'never'} endchild")
    child = p.until("echo")[-1]["pid"]
    os.kill(child, signal.SIGKILL)
    rec = p.until("child")[-1]
    assert (rec["status"], rec["signal"]) == (-1, signal.SIGKILL)
