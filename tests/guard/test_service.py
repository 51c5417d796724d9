"""The guard as a service: start-up checks, signals, restarts, and failures survived."""

import subprocess
import sys
import time
from pathlib import Path

from guard_helpers import KILL_WITHIN_S, audit_records, guard_env, wait_dead

from hami_jupyter import audit

FLAKY = Path(__file__).resolve().parent / "flaky_nvml.py"


def guard_once(gpu, *args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "hami_jupyter", "guard", *map(str, args)],
                          env=env or guard_env(gpu), capture_output=True, text=True, timeout=timeout)


# ---- start-up ---------------------------------------------------------------------------


def test_without_nvml_it_refuses_to_start_and_says_why(gpu, root, tmp_path):
    # A simulated driver that cannot start: nvmlInit fails, as without a driver.
    env = guard_env(gpu, HAMI_SIM_DEVICES="many", HAMI_SIM_STATE=tmp_path / "broken-state")
    run = guard_once(gpu, "--root", root, env=env)
    assert run.returncode == 1
    assert "hami-jupyter guard: error: cannot see the GPUs: NVML does not start" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (root / "guard.json").exists()


def test_without_its_slice_root_it_refuses_to_start(gpu, tmp_path):
    run = guard_once(gpu, "--root", tmp_path / "nowhere")
    assert run.returncode == 1
    assert f"the slice root {tmp_path / 'nowhere'} does not exist" in run.stderr


def test_bad_arguments_are_usage_errors(gpu, root):
    run = guard_once(gpu, "--root", root, "--interval", "0", "--tolerance", "lots")
    assert run.returncode == 2
    assert "--interval 0: give a number of seconds above 0 (and below a day)" in run.stderr
    assert "--tolerance: invalid size 'lots'" in run.stderr
    run = guard_once(gpu, "--root", root, "--action", "shout")
    assert run.returncode == 2 and "invalid choice: 'shout'" in run.stderr


def test_once_writes_one_report_and_exits(gpu, slices, root, holder):
    slices.make("alice", memory="1g")
    kernel = holder(slices.env("alice"), 1, "128m")
    run = guard_once(gpu, "--root", root, "--once")
    assert run.returncode == 0, run.stderr
    from hami_jupyter.slice.guard_report import read_report

    report = read_report(root)
    assert report["guard_pid"] > 0 and report["action"] == "park" and report["interval"] == 0.5
    [proc] = report["slices"]["alice"]["gpus"][gpu.uuid(1)]["processes"]
    assert proc["pid"] == kernel.pid and proc["preload"] is True
    assert "watching" in run.stderr and "stopped" in run.stderr


def test_sigterm_stops_it_cleanly(gpu, root, start_guard):
    guard = start_guard()
    began = time.monotonic()
    assert guard.stop() == 0
    assert time.monotonic() - began < 5
    log = guard.log()
    assert "SIGTERM received, stopping" in log and log.rstrip().endswith("agent: stopped")
    assert "Traceback" not in log


# ---- restarts ---------------------------------------------------------------------------


def test_a_restart_loses_nothing(gpu, slices, root, start_guard, holder):
    slices.make("alice", memory="1g")
    first = start_guard("--action", "kill")
    one = holder(slices.env("alice", preload=False), 0, "1500m")
    wait_dead(one, KILL_WITHIN_S)
    first.wait_report(lambda r: r["actions"])
    assert first.stop() == 0

    second = start_guard("--action", "kill")
    report = second.wait_report()
    assert [a["pid"] for a in report["actions"]] == [one.pid]  # the earlier kill is still shown
    two = holder(slices.env("alice", preload=False), 1, "1500m")
    wait_dead(two, KILL_WITHIN_S)
    report = second.wait_report(lambda r: len(r["actions"]) == 2)
    assert [a["pid"] for a in report["actions"]] == [one.pid, two.pid]
    assert [r["pid"] for r in audit_records(root, "guard-kill")] == [one.pid, two.pid]
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_restart_does_not_warn_again_about_the_same_state(gpu, slices, root, start_guard, holder):
    slices.make("alice", memory="1g")
    first = start_guard("--action", "warn")
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")
    first.wait_report(lambda r: r["actions"])
    assert first.stop() == 0

    second = start_guard("--action", "warn")
    report = second.rounds(4)
    assert report["slices"]["alice"]["gpus"][gpu.uuid(0)]["state"] == "over"
    assert len(report["actions"]) == 1 and len(audit_records(root, "guard-warn")) == 1
    assert "WARN" not in second.log()
    assert bypass.alive()


# ---- failures survived ------------------------------------------------------------------


def test_a_lost_gpu_is_reported_and_the_others_are_still_guarded(gpu, slices, root, start_guard, holder,
                                                                 tmp_path):
    slices.make("alice", memory="1g")
    flag = tmp_path / "gpu1-lost"
    flag.touch()
    env = guard_env(gpu, FLAKY_NVML="lost1", FLAKY_NVML_LOST=flag)
    guard = start_guard("--action", "kill", env=env, script=FLAKY)
    on_lost = holder(slices.env("alice", preload=False), 1, "1500m")
    on_good = holder(slices.env("alice", preload=False), 0, "1500m")

    wait_dead(on_good, KILL_WITHIN_S)
    report = guard.rounds(3)
    assert "GPU index 1: NVML: GPU is lost" in report["errors"]
    assert gpu.uuid(1) not in report["slices"]["alice"]["gpus"]  # nothing known there...
    assert on_lost.alive()  # ...so nothing is done there

    flag.unlink()  # the GPU is back
    wait_dead(on_lost, 5)
    report = guard.wait_report(lambda r: not r["errors"] and len(r["actions"]) == 2)
    assert [a["pid"] for a in report["actions"]] == [on_good.pid, on_lost.pid]
    assert guard.proc.poll() is None


def test_nvml_failing_every_other_time_is_survived(gpu, slices, root, start_guard, holder):
    slices.make("alice", memory="1g")
    env = guard_env(gpu, FLAKY_NVML="count")
    guard = start_guard("--action", "kill", env=env, script=FLAKY)
    guard.wait_report(lambda r: any("NVML cannot count the GPUs: Driver Not Loaded" in e
                                    for e in r["errors"]), what="the NVML error in the report")
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")
    wait_dead(bypass, 5)
    report = guard.wait_report(lambda r: r["actions"])
    assert report["actions"][0]["pid"] == bypass.pid
    assert guard.proc.poll() is None


def test_an_interval_that_fails_is_logged_and_the_next_ones_run(gpu, slices, root, start_guard, holder):
    slices.make("alice", memory="1g")
    guard = start_guard("--action", "kill", env=guard_env(gpu, FLAKY_NVML="crash"), script=FLAKY)
    guard.rounds(3)
    log = guard.log()
    assert log.count("this interval failed; the guard goes on with the next") == 2
    assert "ZeroDivisionError: injected failure in interval 2" in log
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")
    wait_dead(bypass, KILL_WITHIN_S)
    assert guard.stop() == 0
