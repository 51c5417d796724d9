"""The oversubscription bench's decisions, without a GPU or torch (issue 38).

What the bench decides before it starts and how it judges a row: how many
sessions it sizes itself to (enough to need 25 % more than the GPU holds, no
more than host memory holds for the parked ones), the headroom list (one row
each), the time estimate and the per-row limits, the issue's targets. The
figures of the H200 of issue 38 are the example: 140.4 GiB of GPU memory,
16-GiB sessions parked at 18.6-18.8 GiB each, 126 GiB of host memory. The
last tests run the orchestrator itself on the simulated GPU with stand-in
workers (no torch), to check what a row reports.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO / "tests" / "native"))

from native_fixtures import gpu, hami_build  # noqa: E402,F401 (fixtures)


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plan = _load("oversubscribe_plan")
GiB = plan.GiB
H200 = 150754820096  # NVML's total for the H200 of issue 38 (140.4 GiB)
FP16 = int(18.7 * GiB)  # a 16-GiB session there, as its parks moved it


def test_the_bench_imports_without_torch_or_pynvml():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['pynvml'] = None; "
            f"sys.path.insert(0, {str(BENCH)!r}); import oversubscribe as o; "
            "a = o.parse_args([]); print(a.gib, a.sessions, o.options(a)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 2)[:2] == ["16.0", "None"]  # 16 GiB, sessions sized to the machine
    assert "('16g', 17179869184)" in out.stdout  # one row, one working set of headroom


# ---- the headroom list --------------------------------------------------------------


def test_headroom_list_is_one_row_per_size_in_order():
    assert plan.parse_headrooms("16g,0", 16) == [("16g", 16 * GiB), ("0", 0)]
    assert plan.parse_headrooms(" 8g , 512m ,0", 16) == [("8g", 8 * GiB), ("512m", 512 << 20), ("0", 0)]
    assert plan.parse_headrooms("0", 16) == [("0", 0)]


def test_headroom_left_out_is_one_working_set():
    assert plan.parse_headrooms(None, 16) == [("16g", 16 * GiB)]
    assert plan.parse_headrooms(None, 8) == [("8g", 8 * GiB)]
    assert plan.parse_headrooms(None, 1.5) == [("1.5g", int(1.5 * GiB))]


@pytest.mark.parametrize("text, says", [("16g,", "empty entry"), ("16g,,0", "empty entry"), ("", "empty entry"),
                                        ("16 GiB", "'16 GiB'"), ("16g,-1", "'-1'"), ("lots", "'lots'")])
def test_a_bad_headroom_list_says_which_entry(text, says):
    with pytest.raises(ValueError) as e:
        plan.parse_headrooms(text, 16)
    assert says in str(e.value) and "--headroom" in str(e.value)


def test_a_bad_headroom_stops_the_bench_before_it_starts():
    out = subprocess.run([sys.executable, str(BENCH / "oversubscribe.py"), "--dry-run", "--gpu-memory", "80g",
                          "--headroom", "16g,x"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--headroom '16g,x'" in out.stderr and "invalid size 'x'" in out.stderr
    assert "time estimate" not in out.stdout


# ---- the sizing ---------------------------------------------------------------------


def test_the_footprint_estimate_is_what_the_h200_measured():
    assert 18.6 * GiB <= plan.estimated_footprint(16) <= 18.8 * GiB
    assert plan.estimated_footprint(8) < plan.estimated_footprint(16) < plan.estimated_footprint(32)


def test_on_the_h200_it_sizes_itself_to_the_issues_ten_sessions():
    s = plan.size_sessions(H200, FP16, 1 * GiB, 120 * GiB, 2 * GiB, [16 * GiB, 0])
    assert s.sessions == 10 and s.for_gpu == 10 and not s.warnings
    # Ten are the fewest that need 25 % more than the GPU holds; nine are not.
    assert 10 * FP16 >= 1.25 * H200 > 9 * FP16
    text = "\n".join(s.lines())
    assert "140.4 GiB" in text and "18.7 GiB" in text and "7 fit at once" in text
    assert "sessions: 10 (as many as the GPU needs" in text
    # Each row's worst host need is printed with its parts.
    assert "headroom 16.0 GiB: 6 stay on the GPU; 10 sessions park up to 4 at once" in text
    assert "headroom 0.0 GiB: 7 stay on the GPU; 10 sessions park up to 4 at once" in text


def test_host_memory_caps_the_sessions_and_says_so():
    # Sessions of 4 GiB of their own: ten need 40 + 4 x 18.7 + 2 = 116.8 GiB,
    # past 120 GiB less the 12-GiB margin.
    s = plan.size_sessions(H200, FP16, 4 * GiB, 120 * GiB, 2 * GiB, [16 * GiB, 0])
    assert s.for_gpu == 10 and s.for_host == 9 and s.sessions == 9
    assert "as many as host memory holds" in "\n".join(s.lines())
    need = plan.host_need(9, H200, FP16, 16 * GiB, 4 * GiB, 2 * GiB)
    assert need + plan.host_margin(120 * GiB) <= 120 * GiB < plan.host_need(10, H200, FP16, 16 * GiB, 4 * GiB,
                                                                            2 * GiB) + plan.host_margin(120 * GiB)


def test_twelve_sessions_of_16_gib_cannot_take_turns_on_the_h200s_host():
    # Issue 38: 126 GiB of host memory, 20.6 GB left at the lowest with ten.
    for own in (0.5 * GiB, 1 * GiB, 2 * GiB):
        assert plan.sessions_for_host(H200, FP16, [16 * GiB, 0], int(own), 120 * GiB, 2 * GiB) < 12


def test_sessions_override_the_sizing_with_a_warning_where_host_memory_cannot_hold_them():
    s = plan.size_sessions(H200, FP16, 1 * GiB, 120 * GiB, 2 * GiB, [16 * GiB, 0], asked=12)
    assert s.sessions == 12 and s.asked == 12
    assert any("host memory holds 11 sessions" in w and "not 12" in w for w in s.warnings)
    assert "given by --sessions" in "\n".join(s.lines())
    quiet = plan.size_sessions(H200, FP16, 1 * GiB, 120 * GiB, 2 * GiB, [16 * GiB, 0], asked=10)
    assert quiet.sessions == 10 and not quiet.warnings


def test_sessions_that_all_fit_the_gpu_are_said_to_need_no_park():
    s = plan.size_sessions(H200, FP16, 1 * GiB, 120 * GiB, 2 * GiB, [0], asked=7)
    assert any("nothing needs a park" in w for w in s.warnings)


def test_the_parked_at_once_count_follows_the_headroom():
    # Kept headroom 16 GiB: 6 stay and a resume fits beside them (28.2 GiB free).
    assert plan.parked_at_most(10, H200, FP16, 16 * GiB) == 4
    assert plan.parked_at_most(7, H200, FP16, 16 * GiB) == 1
    # No headroom: 7 stay, and a resume needs a park first: one more parked meanwhile.
    assert plan.parked_at_most(10, H200, FP16, 0) == 4
    assert plan.parked_at_most(8, H200, FP16, 0) == 2
    assert plan.parked_at_most(7, H200, FP16, 0) == 0
    # A headroom past the GPU: every session parked, never more.
    assert plan.parked_at_most(3, H200, FP16, 200 * GiB) == 3


def test_a_larger_gpu_or_smaller_sessions_size_up_and_host_memory_scales_the_cap():
    assert plan.sessions_for_gpu(80 * GiB, FP16) == 6  # 1.25 x 80 / 18.7 = 5.3
    assert plan.sessions_for_gpu(H200, 10 * GiB) == 18  # 1.25 x 140.4 / 10 = 17.55
    small_host = plan.sessions_for_host(H200, FP16, [16 * GiB], 1 * GiB, 64 * GiB, 2 * GiB)
    assert small_host < plan.sessions_for_host(H200, FP16, [16 * GiB], 1 * GiB, 120 * GiB, 2 * GiB)


# ---- the cells' times and the estimate ----------------------------------------------


def test_every_row_draws_the_same_cell_times_and_each_session_runs_its_bursts():
    def starts(busy_s):
        p, free_at, out, now = plan.CellPlan(4, 3, (15, 45), 1), {}, [], 0.0
        while not p.done():
            for i in p.due(now, [i for i in range(4) if free_at.get(i, 0) <= now]):
                out.append((i, round(now, 2)))
                free_at[i] = now + busy_s
            now += plan.TICK_S
        return out

    a, b = starts(1.0), starts(1.0)
    assert a == b and len(a) == 12
    assert sorted(i for i, _ in a) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    firsts = {i: t for i, t in reversed(a)}
    assert all(0 <= t <= 45 for t in firsts.values())
    for i in range(4):  # each next cell an idle spell (15-45 s) after the last one ended
        mine = [t for j, t in a if j == i]
        assert all(15 + 1.0 - 0.06 <= b - a_ <= 45 + 1.0 + 0.06 for a_, b in zip(mine, mine[1:]))
    assert plan.simulated_run_s(4, 3, (15, 45), 1, 1.0) == pytest.approx(max(t for _, t in a) + 1.0)


def _h200_sizing():
    return plan.size_sessions(H200, FP16, 1 * GiB, 120 * GiB, 2 * GiB, [16 * GiB, 0])


def test_the_estimate_counts_build_reference_and_each_row():
    t = plan.Timing(make_s=5)
    parts = plan.estimate(_h200_sizing(), t, 16, 3, 20, (15, 45), 1, 3600, 16)
    assert list(parts) == ["make", "reference", "row 1", "row 2"]
    # The two rows of issue 38 fit ten minutes by this estimate.
    assert sum(parts.values()) < 600
    for row in ("row 1", "row 2"):
        assert parts[row] > plan.simulated_run_s(10, 3, (15, 45), 1, 20 * t.step_s_per_gib * 16)
    # A reference read from a file costs nothing.
    read = plan.estimate(_h200_sizing(), t, 16, 3, 20, (15, 45), 1, 3600, 16, reference_seeds=0, measure=False)
    assert read["reference"] == 0


def test_the_run_limit_applies_per_row_and_the_time_limit_to_the_whole():
    t = plan.Timing(make_s=5)
    free = plan.estimate(_h200_sizing(), t, 16, 4, 20, (15, 45), 1, 3600, 16)
    cut = plan.estimate(_h200_sizing(), t, 16, 4, 20, (15, 45), 1, 30, 16)
    for row in ("row 1", "row 2"):
        setup = plan.setup_s(_h200_sizing(), t, 16, _h200_sizing().headrooms[int(row[-1]) - 1])
        assert cut[row] == pytest.approx(setup + 30 + t.grace_s + t.end_s)
        assert free[row] > cut[row]
    assert sum(free.values()) > 400
    held = plan.estimate(_h200_sizing(), t, 16, 4, 20, (15, 45), 1, 3600, 16, time_limit=400)
    assert sum(held.values()) <= 400 + 1e-6


def test_row_limits_share_what_is_left_and_never_exceed_what_was_asked():
    t = plan.Timing()
    run, setup = plan.row_limits(500, 2, 60, 3600, 300, t)
    assert run == pytest.approx(250 - 60 - t.grace_s - t.end_s)
    assert setup == pytest.approx(250 - t.grace_s - t.end_s)
    assert plan.row_limits(500, 1, 60, 100, 30, t) == (100, 30)
    assert plan.row_limits(40, 1, 60, 3600, 300, t) == (0.0, 0.0)  # no time left for either


# ---- the targets --------------------------------------------------------------------


def _row(**over):
    row = {"row": 1, "headroom": "16g", "headroom_bytes": 16 * GiB, "failed_setups": 0, "cells": 30,
           "cells_planned": 30, "incomplete": False, "failed_steps": 0, "broker_park_failures": 0,
           "losses_equal_reference": True, "obstructed_cells": 5, "obstructed_p95_s": 5.2, "longest_wait_s": 5.4}
    row.update(over)
    return row


def _met(row):
    return {v["name"]: v["met"] for v in plan.verdicts(row)}


def test_a_row_that_meets_every_target():
    assert all(_met(_row()).values())
    assert [v["target"] for v in plan.verdicts(_row())] == [
        "0 failed set-ups", "all cells run", "0 failed steps", "0 failed parks", "losses bit for bit",
        "obstructed cells p95 <= 6 s (with a headroom)", "no cell waits more than 30 s"]


def test_the_p95_target_is_6_s_with_a_headroom_and_15_s_without():
    assert _met(_row(obstructed_p95_s=7.0))["p95"] is False
    assert _met(_row(obstructed_p95_s=7.0, headroom="0", headroom_bytes=0))["p95"] is True
    assert _met(_row(obstructed_p95_s=15.5, headroom="0", headroom_bytes=0))["p95"] is False
    assert _met(_row(obstructed_p95_s=None, obstructed_cells=0))["p95"] is True


def test_each_miss_is_its_own():
    assert _met(_row(longest_wait_s=31.0)) == dict(_met(_row()), longest=False)
    assert _met(_row(failed_steps=1)) == dict(_met(_row()), steps=False)
    assert _met(_row(broker_park_failures=68)) == dict(_met(_row()), parks=False)
    assert _met(_row(losses_equal_reference=False)) == dict(_met(_row()), losses=False)
    assert _met(_row(cells=27, incomplete=True)) == dict(_met(_row()), cells=False)


def test_a_row_whose_set_up_failed_meets_nothing_it_did_not_run():
    row = {"row": 1, "headroom": "16g", "headroom_bytes": 16 * GiB, "failed_setups": 1, "cells": 0,
           "cells_planned": 36, "broker_park_failures": 0}
    v = {x["name"]: x for x in plan.verdicts(row)}
    assert not v["set-ups"]["met"] and not v["cells"]["met"]
    for name in ("steps", "losses", "p95", "longest"):
        assert v[name]["measured"] == "not run" and not v[name]["met"]


def test_p95_is_the_nearest_rank():
    assert plan.p95(list(range(1, 12))) == 11  # of 11 the longest (issue 38 reported the 10th as p95)
    assert plan.p95(list(range(1, 41))) == 38
    assert plan.p95([3.0]) == 3.0 and plan.p95([]) is None


def test_the_targets_table_sets_the_rows_side_by_side():
    rows = [dict(_row(), targets=plan.verdicts(_row())),
            dict(_row(row=2, headroom="0", headroom_bytes=0, obstructed_p95_s=85.6, longest_wait_s=89.3),
                 targets=plan.verdicts(_row(headroom_bytes=0, obstructed_p95_s=85.6, longest_wait_s=89.3)))]
    table = plan.targets_table(rows).splitlines()
    assert table[0] == "| target | row 1: headroom 16g | row 2: headroom 0 |"
    p95 = next(line for line in table if "p95" in line)
    assert p95.startswith("| obstructed cells p95 <= 6 s (with a headroom) / 15 s (without a headroom) |")
    assert "| 5.2 s (5 obstructed) | 85.6 s (5 obstructed) (**missed**) |" in p95


# ---- the orchestrator on the simulated GPU, with stand-in workers ----------------------

# Speaks the workers' protocol without torch: the losses are made from the
# seed and the step, so that they are the reference's unless WRONG_SEED.
FAKE_WORKER = textwrap.dedent(r'''
    import json, os, sys, time
    seed, gib, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    def loss(s, n):
        return repr(s + n / 8 + (0.5 if mode == "run" and s == WRONG_SEED else 0))
    if mode == "reference":
        if HOLD_BYTES:  # GPU memory of the simulated GPU, held while it trains: its footprint
            import ctypes
            cuda, ctx, ptr = ctypes.CDLL("libcuda.so.1"), ctypes.c_void_p(), ctypes.c_uint64()
            assert cuda.cuInit(0) == 0 and cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
            assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(HOLD_BYTES)) == 0
        for line in sys.stdin:
            if not line.strip():
                break
            s = int(line)
            print(json.dumps({"seed": s, "losses": [loss(s, n) for n in range(int(sys.argv[4]))],
                              "build_s": 0.01, "step_s": 0.001, "held": 0}), flush=True)
        sys.exit(0)
    if int(seed) == FAIL_SEED:
        print("RuntimeError: CUDA-capable device(s) is/are busy or unavailable", file=sys.stderr)
        sys.exit(1)
    ballast = bytes([1]) * (8 << 20)  # some anonymous memory of its own
    print(json.dumps({"ready": True, "init_s": 0.0, "held": 0}), flush=True)
    n = 0
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        k, t_cmd = int(cmd[1]), float(cmd[2])
        ends, losses = [], []
        for _ in range(k):
            losses.append(loss(int(seed), n)); ends.append(time.time()); n += 1
        print(json.dumps({"cell": True, "t_cmd": t_cmd, "ends": ends, "losses": losses, "failed": 0}), flush=True)
''')


def _run_bench(gpu, tmp_path, *flags, fail_seed=-1, wrong_seed=-1, hold=0, footprint="1.5g"):
    if gpu.build.sanitizer:
        pytest.skip("the bench runs the release library")
    worker = (FAKE_WORKER.replace("WRONG_SEED", str(wrong_seed)).replace("FAIL_SEED", str(fail_seed))
              .replace("HOLD_BYTES", str(hold)))
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import oversubscribe as o; "
            f"o.WORKER = {worker!r}; sys.exit(o.main(sys.argv[1:]))")
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-c", code, "--gib", "1", "--sessions", "2", "--bursts", "2",
           "--steps", "3", "--idle", "0,0.5", "--min-idle", "60", "--logs", str(tmp_path / "logs"),
           "--out", str(out), "--csv", str(tmp_path / "mem.csv"), "--reference", str(tmp_path / "ref.json"),
           *(["--footprint", footprint] if footprint else []), *flags]
    env = gpu.env()
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the bench runs as root (its agent parks other processes)")
def test_two_rows_in_one_run_each_with_its_own_figures(gpu, tmp_path):
    result, printed = _run_bench(gpu, tmp_path, "--headroom", "1g,0")
    assert [r["headroom_bytes"] for r in result["rows"]] == [GiB, 0]
    assert result["sizing"]["footprint_bytes"] == int(1.5 * GiB) and result["sessions"] == 2
    for row in result["rows"]:
        assert row["cells"] == row["cells_planned"] == 4 and not row["incomplete"]
        assert row["losses_equal_reference"] and row["failed_steps"] == 0 and row["failed_setups"] == 0
        assert all(t["met"] for t in row["targets"]), row["targets"]
        mem = row["host_memory"]["per_session"]
        assert [m["session"] for m in mem] == [0, 1]
        for m in mem:  # each session's own anonymous memory, the 8 MiB it holds included
            assert 8 << 20 <= m["rss_anon_at_ready"] <= m["rss_anon_peak"] <= m["rss_peak"]
        assert Path(row["logs"]).name.startswith(f"row{row['row']}-headroom-")
    # One reference for both rows, kept for the next run.
    assert set(json.loads((tmp_path / "ref.json").read_text())["losses"]) == {"1000", "1001"}
    assert {line.split(",")[0] for line in (tmp_path / "mem.csv").read_text().splitlines()[1:]} == {"1", "2"}
    assert "time estimate:" in printed and printed.index("time estimate:") < printed.index("== row 1")
    assert "RssAnon" in printed
    assert "| target | row 1: headroom 1g | row 2: headroom 0 |" in printed


@pytest.mark.skipif(os.geteuid() != 0, reason="the bench runs as root (its agent parks other processes)")
def test_a_failed_set_up_is_reported_and_the_next_row_still_runs(gpu, tmp_path):
    result, printed = _run_bench(gpu, tmp_path, "--headroom", "1g,0", fail_seed=1001, wrong_seed=1000)
    for row in result["rows"]:
        assert row["failed_setups"] == 1 and row["cells"] == 0
        failure = row["setup_failures"]["1"]
        assert any("busy or unavailable" in line for line in failure["traceback_tail"])
        met = {t["name"]: t["met"] for t in row["targets"]}
        assert not met["set-ups"] and not met["cells"] and not met["losses"]
    assert printed.count("set-up FAILED: sessions [1] ended during set-up") == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the bench runs as root (its agent parks other processes)")
def test_losses_that_differ_from_the_reference_are_a_miss(gpu, tmp_path):
    result, _ = _run_bench(gpu, tmp_path, "--headroom", "0", wrong_seed=1001)
    (row,) = result["rows"]
    assert row["cells"] == 4 and row["losses_equal_reference"] is False
    assert [t["name"] for t in row["targets"] if not t["met"]] == ["losses"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the bench runs as root (its agent parks other processes)")
def test_the_footprint_is_measured_on_the_first_reference_session_and_kept(gpu, tmp_path):
    hold = 1280 << 20
    result, printed = _run_bench(gpu, tmp_path, "--headroom", "0", hold=hold, footprint=None)
    measured = result["measured"]
    # What the process holds on the GPU: its 1.25 GiB and its context.
    assert hold < measured["bytes"] <= hold + (256 << 20)
    assert measured["gpu_used_rise_bytes"] == measured["bytes"]
    assert measured["session_host_bytes"] >= measured["rss_anon_bytes"] > 0
    assert result["sizing"]["footprint_from"] == "measured"
    assert result["sizing"]["footprint_bytes"] == measured["bytes"]
    assert "measured on the reference's first session, alone on the GPU: footprint" in printed
    # The sizing and the estimate come again, with what was measured, before the rows.
    assert printed.count("time estimate:") == 2
    assert printed.index("measured on the") < printed.rindex("time estimate:") < printed.index("== row 1")
    # The next run reads it with the losses, and measures nothing.
    again, printed = _run_bench(gpu, tmp_path, "--headroom", "0", hold=hold, footprint=None)
    assert again["sizing"]["footprint_bytes"] == measured["bytes"]
    assert again["sizing"]["footprint_from"].startswith("measured, read from")
    assert "measured on the" not in printed and printed.count("time estimate:") == 1


def test_a_dry_run_prints_the_sizing_and_estimate_for_another_machine():
    cmd = [sys.executable, str(BENCH / "oversubscribe.py"), "--dry-run", "--gpu-memory", str(H200),
           "--host-available", "120g", "--footprint", "18.7g", "--headroom", "16g,0", "--bursts", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "sessions: 10 (as many as the GPU needs" in out.stdout
    assert "time estimate: make" in out.stdout and "row 1" in out.stdout and "row 2" in out.stdout
    over = subprocess.run(cmd + ["--sessions", "12"], capture_output=True, text=True, timeout=60)
    assert over.returncode == 0, over.stderr
    assert "WARNING: host memory holds 10 sessions of this size taking turns, not 12" in over.stdout


def test_the_reference_runs_side_by_side_within_the_gpu_cpus_and_host():
    assert plan.reference_workers(9, H200, FP16, 16) == 6  # 7 fit the H200: one session's room spare
    assert plan.reference_workers(9, H200, FP16, 4) == 2
    assert plan.reference_workers(3, H200, FP16, 16) == 3
    assert plan.reference_workers(9, H200, FP16, 16, host_each=5 * GiB, host_available=20 * GiB) == 2
    assert plan.reference_workers(9, 20 * GiB, FP16, 16) == 1  # never none


@pytest.mark.skipif(os.geteuid() != 0, reason="the bench runs as root (its agent parks other processes)")
def test_the_time_limit_cuts_a_row_that_would_outlast_it_and_says_so(gpu, tmp_path):
    # Cells 100 s apart: each session's second cell would start long after the 60 s.
    t0 = time.time()
    result, printed = _run_bench(gpu, tmp_path, "--headroom", "0", "--idle", "100,100", "--time-limit", "60")
    assert time.time() - t0 < 60
    (row,) = result["rows"]
    assert row["run_limit_s"] < 60 - plan.Timing.grace_s and row["incomplete"]
    assert row["cells"] < row["cells_planned"] == 4
    cells = next(t for t in row["targets"] if t["name"] == "cells")
    assert not cells["met"] and cells["measured"].endswith("(cut by the run limit)")
    assert "--time-limit: " in printed
