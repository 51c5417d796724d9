"""The SM-share benchmark's plan and verdicts, without a GPU or torch (issue 29).

What a reader of bench/sm_share.py's table relies on: which workloads the
share's model was fitted on and which are held out, the rules each row is
judged by (issue 42: busy time min(s, u) +-3, pace never below min(1, s/u) of
its own - 5 and in any 1-s window - 10, the clock's part reported beside; a
live change every 100-ms window +-5 from 100 ms after it), the launch-overhead
rows met when the upper end of their interval is within the budget, and a
workload that cannot run here reported as "not run" instead of breaking the
run. Worker processes are stand-ins that speak the workers' one-JSON-line
protocol with made-up rates: nothing is timed.
"""
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sm_share = _load("sm_share")


@pytest.fixture
def args():
    return sm_share.parse_args([])


def test_the_orchestrator_imports_without_torch_or_pynvml():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['pynvml'] = None; "
            f"sys.path.insert(0, {str(BENCH)!r}); import sm_share; "
            "print(len(sm_share.build_plan(sm_share.parse_args([]))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0


def test_at_most_half_the_workloads_are_fitted_and_they_are_named(args):
    plan = sm_share.build_plan(args)
    workloads = {s["workload"] for s in plan}
    fitted = {s["workload"] for s in plan if s["fit"] == "fitted"}
    assert fitted == {"matmul", "copy", "small", "graph"}
    assert len(fitted) <= len(workloads) / 2
    assert {s["fit"] for s in plan} == {"fitted", "held out"}
    # The issue's workload (JAX on constant data) and the other new ones are held out.
    for wl in ("matmul_const", "matmul_fp32", "matmul_fp8", "conv", "attention", "jax"):
        assert {s["fit"] for s in plan if s["workload"] == wl} == {"held out"}
    header = sm_share.markdown([])
    assert header.splitlines()[0].startswith("| scenario | fit |")


def test_every_workload_has_rows_at_25_50_75_judged_on_busy_time_and_pace(args):
    plan = {s["name"]: s for s in sm_share.build_plan(args)}
    bound = [wl for wl, (_fit, kind) in sm_share.WORKLOADS.items() if kind in ("compute", "memory")]
    assert set(sm_share.HELD_OUT) <= set(bound)
    for wl in sm_share.WORKLOADS:
        assert f"baseline_{wl}" in plan
        for p in (25, 50, 75):
            s = plan[f"{wl}_{p}"]
            assert s["workers"] == [sm_share.worker("A", wl, p)]  # one slice, alone, hard
            assert sm_share.planned_target(s).startswith(
                f"busy min({p} %, u) +-3; pace >= min(1, {p}/u) of alone -5, every 1 s -10")
    # the random-data matmul is also held to +-5 of busy time in every 1-s window
    assert sm_share.planned_target(plan["matmul_75"]).endswith("; busy every 1 s +-5")
    assert "every 1 s +-5" not in sm_share.planned_target(plan["conv_75"])


def test_the_issue34_set_is_what_issue_34_missed_and_fits_one_short_device_call():
    a = sm_share.parse_args(["--only", "issue34", "--overhead-cap", "45", "--fast-telemetry", "matmul_const,jax"])
    plan = sm_share.build_plan(a)
    names = [s["name"] for s in plan]
    for name in ("small_25", "small_50", "small_75", "conv_75", "matmul_const_25", "matmul_const_50",
                 "matmul_const_75", "jax_25", "jax_50", "jax_75", "matmul_50", "overhead"):
        assert name in names
    # each row with its own baseline, nothing else
    assert {n for n in names if n.startswith("baseline_")} == {
        "baseline_small", "baseline_conv", "baseline_matmul_const", "baseline_jax", "baseline_matmul"}
    assert len(names) == 17
    assert sm_share.estimate_s(plan, a) <= 7 * 60


def test_the_issue42_set_is_what_issue_42_found_and_fits_one_short_device_call():
    a = sm_share.parse_args(["--only", "issue42", "--overhead-cap", "45", "--fast-telemetry", "matmul,matmul_const,jax"])
    plan = sm_share.build_plan(a)
    names = [s["name"] for s in plan]
    assert names == ["baseline_matmul", "matmul_75", "baseline_small", "small_50", "small_75", "live_25_75",
                     "live_75_25", "baseline_matmul_const", "matmul_const_75", "baseline_conv", "conv_75",
                     "baseline_jax", "jax_75", "overhead"]
    assert 4 * 60 <= sm_share.estimate_s(plan, a) <= 5 * 60


def test_contention_rows_keep_their_targets(args):
    plan = {s["name"]: s for s in sm_share.build_plan(args)}
    assert sm_share.planned_target(plan["quad_50"]) == "50 % +-3 (slice total)"
    assert sm_share.planned_target(plan["pair_hard_30_70"]) == "30 % / 70 % +-3 each"
    assert sm_share.planned_target(plan["elastic_alone_30"]) == ">= 90 % of baseline"
    assert sm_share.planned_target(plan["pair_elastic_30_70"]) == ">= 30 % / >= 70 % (-3)"
    for old, new in ((25, 75), (75, 25)):
        live = plan[f"live_{old}_{new}"]
        assert live["workers"][0]["share"] == old and live["workers"][0]["change"][1] == new
        assert sm_share.planned_target(live) == (f"every 100-ms window from 100 ms after the change: busy {new} % +-5 "
                                                 "(throughput less the clock's part)")


def _result(units_per_s, seconds=2.0, window=0.1):
    n = int(round(seconds / window))
    return {"units_per_s": units_per_s, "window": window, "window_units": [units_per_s * window] * n,
            "sync_wait_frac": 0.5, "tflops": 0.0}


def _tel(t0, seconds, util, mhz=1755, step=0.1):
    """NVML samples of a measured part: utilization.gpu UTIL (a number, or a
    function of the time from T0) and the SM clock MHZ every STEP."""
    n = int(round(seconds / step))
    return [{"t": t0 + i * step, "util_gpu": util(i * step) if callable(util) else util, "sm_mhz": mhz}
            for i in range(n)]


def test_a_lone_row_is_met_on_busy_time_and_a_pace_never_less_than_due(args):
    assert sm_share.short_target(50, 0.6) == pytest.approx(0.8333, abs=1e-4)
    assert sm_share.short_target(75, 0.6) == 1.0
    assert sm_share.short_target(25, 0.6) == pytest.approx(0.4167, abs=1e-4)

    plan = {s["name"]: s for s in sm_share.build_plan(args)}
    small = dict(_result(1000.0), util_alone=0.6, sm_mhz_alone=1755)
    matmul = dict(_result(600.0), util_alone=1.0, sm_mhz_alone=1755)

    def judged(name, units, util, base, mhz=1755, result=None):
        seconds = plan[name]["seconds"]
        (r,) = sm_share.analyze(plan[name], {"A": result or _result(units, seconds)},
                                {plan[name]["workload"]: base}, _tel(100.0, seconds, util, mhz), 100.0)
        return r

    r = judged("small_50", 800.0, 50, small)  # 80 % of its pace at a 50 % share: 83 due, never less than 78
    assert r["result"] is True and r["measured"] == "busy 50.0 %, pace 80.0 %"
    assert r["target"] == ("busy 50 % +-3; pace >= 83 % of alone -5, every 1 s -10 (u = 60 % busy alone)")
    assert judged("small_50", 1000.0, 50, small)["result"] is True  # more pace than due is no miss
    assert judged("small_50", 700.0, 50, small)["result"] is False  # less is
    assert judged("small_50", 800.0, 56, small)["result"] is False  # busy over its share: the cap
    swinging = dict(_result(800.0, 6.0), window_units=[40.0] * 30 + [120.0] * 30)  # 40 % then 120 %: mean 80 %
    r = judged("small_50", 800.0, 50, small, result=swinging)
    assert r["measured"].endswith("pace 80.0 %") and r["result"] is False  # a 1-s window at 40 % (73 - 10 due)
    assert judged("small_75", 970.0, 60, small)["result"] is True  # not slowed: busy its own 60 %
    # issue 42: 84 % of its pace at 75 % where 98 % was due is a miss
    assert judged("small_75", 840.0, 75, dict(small, util_alone=0.77))["result"] is False

    # A GPU that clocks higher under a share: met on busy time, the clock's part kept and reported.
    r = judged("matmul_75", 0.82 * 600.0, 75, matmul, mhz=1980)
    assert r["result"] is True and r["measured"] == "busy 75.0 %, pace 82.0 %"
    assert "+7.0 points; SM clock 1980 MHz against 1755 alone (x1.13): the clock's part" in r["note"]
    # the random-data matmul also in every 1-s window of busy time: +-5
    r = judged("matmul_75", 0.75 * 600.0, lambda t: 81 if 2.0 <= t < 3.0 else 75, matmul)
    assert r["result"] is False and r["values"]["busy_ok"] is True and r["values"]["busy_1s_ok"] is False
    # issue 42's conv net: 64 % busy at 75 %, its pace 65.6 %: a miss on both
    r = judged("conv_75", 0.656 * 600.0, 64, dict(matmul, util_alone=0.95))
    assert r["result"] is False and r["values"]["busy_ok"] is False and r["values"]["pace_ok"] is False

    # Without NVML: a short-kernel row is not judged; a compute row on its pace, u taken as 100 %.
    (r,) = sm_share.analyze(plan["graph_50"], {"A": _result(500.0)}, {"graph": dict(small, util_alone=None)}, [], 0)
    assert r["result"] is None and "unknown u" in r["target"]
    (r,) = sm_share.analyze(plan["copy_50"], {"A": _result(310.0)}, {"copy": dict(matmul, util_alone=None)}, [], 0)
    assert r["result"] is True and "u taken as 100 %" in r["target"] and "busy time unknown" in r["note"]


def _live(change_at, before, after, seconds=12.0, window=0.1, base=600.0):
    """A live scenario's worker result: BEFORE (a fraction) until CHANGE_AT,
    then AFTER (a fraction, or a function of the time since the change)."""
    n = int(round(seconds / window))
    units = []
    for i in range(n):
        t = i * window
        f = before if t < change_at else (after(t - change_at) if callable(after) else after)
        units.append(f * base * window)
    return {"units_per_s": sum(units) / seconds, "window": window, "window_units": units,
            "change": {"at": change_at, "done": change_at + 0.01}, "tflops": 0.0}


def test_a_live_change_is_met_when_every_100_ms_window_from_100_ms_after_lands(args):
    plan = {s["name"]: s for s in sm_share.build_plan(args)}
    base = dict(_result(600.0), util_alone=1.0, sm_mhz_alone=1755)

    def judged(name, res, mhz=1755):
        (r,) = sm_share.analyze(plan[name], {"A": res}, {"matmul": base}, _tel(50.0, 12.0, 75, mhz), 50.0)
        return r

    r = judged("live_25_75", _live(4.0, 0.25, lambda dt: 0.5 if dt < 0.1 else 0.76))  # the first 100 ms is free
    assert r["result"] is True and r["measured"] == "every window within"
    # issue 42 on an H200: the first windows after 25 -> 75 ran at 90, 89, 87, 86, 82 %
    h200 = [0.90, 0.89, 0.87, 0.86, 0.82]
    r = judged("live_25_75", _live(4.0, 0.25, lambda dt: h200[int(dt * 10)] if dt < 0.5 else 0.75))
    assert r["result"] is False and r["measured"] == "4 of 79 windows outside (first +0.1 s after)"
    # A GPU that clocks 10 % higher at the new share: its throughput is 82.5 %, its busy time 75 %.
    r = judged("live_25_75", _live(4.0, 0.25, 0.825), mhz=1930.5)
    assert r["result"] is True and "busy = throughput x SM clock alone" in r["note"]
    assert judged("live_75_25", _live(4.0, 0.75, lambda dt: 0.03 if dt < 0.3 else 0.25))["result"] is False
    assert judged("live_75_25", _live(4.0, 0.75, 0.26))["result"] is True


def _pairs(rng, rounds, extra_ns, noise_ns, pairs=50, instructions=None):
    """driver_overhead pairs runs: per round and mode one process whose pairs
    differ by what the hook adds (none: nothing) plus noise; the host's drift
    between rounds moves both halves of a pair alike and never shows."""
    samples = {"none": [], "preload": [], "preload_sm90": []}
    for _ in range(rounds):
        host = 3500 + rng.gauss(0, 300)
        for mode, extra in (("none", 0), ("preload", extra_ns), ("preload_sm90", 2 * extra_ns)):
            run = {"diff_ns": [extra + rng.gauss(0, noise_ns) for _ in range(pairs)], "real_ns": host,
                   "hooked_ns": host + extra, "pinned": True, "instructions": None}
            if instructions is not None:
                run["instructions"] = {"hooked": 800.0 + (instructions if extra else 0), "real": 800.0}
            samples[mode].append(run)
    return samples


def test_overhead_rounds_stop_only_on_a_narrow_interval_and_a_wide_one_is_not_met(args):
    # issue 34: between processes the rounds stayed 103 / 170 ns wide after
    # 120 s; pairs inside one process cancel the host's drift.
    rng = random.Random(7)
    noisy = _pairs(rng, 6, 10, 400, pairs=5)
    tight = _pairs(rng, 6, 10, 20)
    om = sm_share.sm_overhead

    assert om.stop_rule(noisy, 5, elapsed_s=30, cap_s=120) == (False, "")
    stop, why = om.stop_rule(tight, 5, elapsed_s=30, cap_s=120)
    assert stop and "narrower than 20 ns" in why
    assert om.stop_rule(tight, 10, elapsed_s=30, cap_s=120) == (False, "")  # not before the minimum rounds
    stop, why = om.stop_rule(noisy, 5, elapsed_s=121, cap_s=120)
    assert stop and "time cap" in why

    rows = sm_share.overhead_rows(sm_share.overhead_result(noisy, why, args, 121))
    judged = [r for r in rows if r["result"] is not None]
    # +10 / +20 ns, but the interval reaches past 50 ns: not met, whatever the figure
    assert judged[0]["result"] is False and "the interval reaches" in judged[0]["note"]
    assert all("6 rounds" in r["one_s"] and r["values"]["ci_width_ns"] >= 20 for r in judged)
    assert all(r["result"] is (r["values"]["ci_ns"][1] <= limit)
               for r, (_m, _t, limit) in zip(judged, sm_share.OVERHEAD_TARGETS))
    # issue 42: a wide interval within the budget is met (the H200's +27.2 ns, 95 % CI 16.9 .. 39.6)
    wide = _pairs(random.Random(11), 6, 27, 60)
    rows = sm_share.overhead_rows(sm_share.overhead_result(wide, why, args, 121))
    assert rows[0]["values"]["ci_width_ns"] >= 20 and rows[0]["values"]["ci_ns"][1] <= 50
    assert rows[0]["result"] is True and rows[0]["target"].endswith("the upper end of its 95 % CI")

    rows = sm_share.overhead_rows(sm_share.overhead_result(tight, "narrow", args, 40))
    assert [r["result"] for r in rows] == [True, True, None]
    assert rows[0]["measured"].startswith("+1") and "width" in rows[0]["one_s"]
    assert "the driver's entry point" in rows[0]["note"] and "not countable" in rows[0]["note"]
    # Without the preload the driver is on both sides: the method's noise, about 0, for information.
    assert rows[2]["scenario"] == "launch overhead, none (the method's noise)"
    assert abs(rows[2]["values"]["added_ns"]) < 10
    costly = _pairs(random.Random(3), 6, 120, 2, instructions=50)  # +120 ns without a limit: over 50
    rows = sm_share.overhead_rows(sm_share.overhead_result(costly, "narrow", args, 40))
    assert [r["result"] for r in rows] == [False, False, None]
    assert "+50 instructions a launch" in rows[0]["note"]


def test_the_overhead_rounds_run_the_pairs_of_driver_overhead(args):
    cmd = sm_share.overhead_command(args)
    assert cmd[1:] == ["pairs", "200", "500", "1"]
    assert [m for m, _ in sm_share.overhead_modes("/x", 0)] == list(sm_share.sm_overhead.MODES)


def test_telemetry_summary_counts_power_cap_and_slowdown_samples():
    tel = sm_share.sm_telemetry
    samples = [{"t": i, "sm_mhz": 1500 + 100 * (i % 2), "power_mw": 690000, "power_limit_mw": 700000,
                "reasons": tel.REASON_SW_POWER_CAP if i < 3 else (tel.REASON_HW_THERMAL if i == 3 else 0),
                "util_gpu": 100, "util_mem": 40, "temp_c": 60, "mem_mhz": 2619} for i in range(4)]
    s = tel.summary(samples)
    assert (s["sm_mhz"], s["power_w"], s["power_limit_w"]) == (1550, 690, 700)
    assert (s["sw_power_cap_pct"], s["slowdown_pct"], s["util_gpu"]) == (75, 25, 100)
    assert (s["sm_mhz_p10"], s["sm_mhz_p90"], s["power_instant_w"]) == (1500, 1600, None)
    assert "p10-p90 1500-1600" in tel.text(s)
    fast = [dict(x, power_instant_mw=800000 if i % 2 else 150000) for i, x in enumerate(samples)]
    assert tel.summary(fast)["power_instant_w"] == 475 and "instant 475 W" in tel.text(tel.summary(fast))
    assert tel.summary([]) is None
    partial = tel.summary([dict(samples[0], sm_mhz=None, reasons=None)])
    assert partial["sm_mhz"] is None and partial["sw_power_cap_pct"] is None and partial["util_gpu"] == 100


FAKE_WORKER = textwrap.dedent("""\
    import json, os, sys, time
    script, args = sys.argv[1], sys.argv[2:]
    def opt(name):
        return args[args.index(name) + 1]
    wl = opt("--workload")
    me = json.loads(os.environ["FAKE_WORKLOADS"])[wl]
    if "skipped" in me:
        print(json.dumps({"skipped": me["skipped"], "workload": wl}))
        sys.exit(0)
    share = os.environ.get("CUDA_DEVICE_SM_LIMIT")
    rate = me["base"] * (me[share] if share else 1.0)
    open(opt("--ready-file"), "w").write("ready\\n")
    deadline = time.monotonic() + 20
    while not os.path.exists(opt("--start-file")) and time.monotonic() < deadline:
        time.sleep(0.01)
    window = float(opt("--window"))
    n = int(round(float(opt("--seconds")) / window))
    print(json.dumps({"workload": wl, "script": os.path.basename(script), "units_per_s": rate,
                      "window": window, "window_units": [rate * window] * n, "tflops": 0.0,
                      "sync_wait_frac": 0.5, "device": "stand-in", "torch": None}))
    """)


class FakeTelemetry:
    """NVML as the test sets it before each scenario: the GPU busy UTIL % of
    the time at MHZ."""

    util, mhz = 100, 1755

    def samples(self, t_from, t_to):
        return [{"t": t_from + 0.1 * i, "sm_mhz": self.mhz, "mem_mhz": 2619, "power_mw": 300000,
                 "power_limit_mw": 700000, "reasons": 0, "util_gpu": self.util, "util_mem": 10, "temp_c": 40}
                for i in range(int((t_to - t_from) / 0.1) + 1)]


def test_a_run_reads_as_fitted_or_held_out_and_a_skipped_workload_is_not_run(tmp_path, monkeypatch):
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_WORKER)
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_WORKLOADS", json.dumps({
        "matmul_fp8": {"skipped": "fp8 matmul needs compute capability >= 8.9; A100 is 8.0"},
        "matmul_const": {"base": 600.0, "50": 0.57},  # the issue's figure: 57 % at 50 %
        "small": {"base": 4000.0, "50": 0.8},
        "jax": {"base": 500.0, "50": 0.5},
    }))
    a = sm_share.parse_args(["--python", str(fake), "--seconds", "1", "--warmup", "0", "--pair-delay", "0.1",
                             "--ready-timeout", "30", "--finish-timeout", "30",
                             "--only", "matmul_fp8,matmul_const_50,small_50,jax_50"])
    plan = sm_share.build_plan(a)
    state = {"baselines": {}, "skipped": {}}
    rows, failed, scripts = [], 0, {}
    # busy alone: small 60 %, the rest 100 %; at a 50 % share, 50 %, the constant-data matmul at a higher clock
    busy = {"baseline_small": (60, 1755), "matmul_const_50": (50, 1980)}
    telemetry = FakeTelemetry()
    for s in plan:
        telemetry.util, telemetry.mhz = busy.get(s["name"], (100 if s["check"] == "baseline" else 50, 1755))
        rec, got, bad = sm_share.run_scenario(s, a, str(tmp_path / "run"), state, telemetry)
        rows += got
        failed += bad
        for w in (rec.get("workers") or {}).values():
            scripts[w["workload"]] = w["script"]
    assert failed == 0
    table = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
             for line in sm_share.markdown(rows).splitlines()[2:]}

    # fp8 could not run here: its baseline and its three rows say so, nothing broke.
    for name in ("baseline_matmul_fp8", "matmul_fp8_25", "matmul_fp8_50", "matmul_fp8_75"):
        cells = table[name]
        assert cells[1] == "held out"
        assert cells[3] == "not run: fp8 matmul needs compute capability >= 8.9; A100 is 8.0"
        assert cells[5] == "NOT RUN"
    # Issue 29's case, held out: 57 % of its pace at a 50 % share, busy 50 % at a higher clock: met on
    # busy time (issue 42), the clock's part reported beside it.
    assert table["matmul_const_50"][1:4] == [
        "held out", "busy 50 % +-3; pace >= 50 % of alone -5, every 1 s -10 (u = 100 % busy alone)",
        "busy 50.0 %, pace 57.0 %"]
    assert table["matmul_const_50"][5] == "PASS"
    assert "x1.13): the clock's part" in table["matmul_const_50"][7]
    # A fitted short-kernel row, judged against u = 60 % from its baseline's telemetry.
    assert table["small_50"][1] == "fitted"
    assert table["small_50"][2] == "busy 50 % +-3; pace >= 83 % of alone -5, every 1 s -10 (u = 60 % busy alone)"
    assert table["small_50"][5] == "PASS"
    assert "util 50 %" in table["small_50"][6]
    assert table["jax_50"][5] == "PASS" and scripts["jax"] == "sm_worker_jax.py"
    assert scripts["matmul_const"] == "sm_worker.py"


def test_the_jax_worker_says_skipped_without_jax(tmp_path):
    if importlib.util.find_spec("jax") is not None:
        pytest.skip("jax is importable here")
    out = subprocess.run([sys.executable, str(BENCH / "sm_worker_jax.py"), "--seconds", "1", "--label", "x"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["workload"] == "jax" and doc["skipped"].startswith("jax is not importable")
