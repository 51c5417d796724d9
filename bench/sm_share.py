#!/usr/bin/env python3
"""SM-share benchmark: how closely the preload library holds a slice to its share.

One command reruns everything, on one GPU (cuda:0, or what CUDA_VISIBLE_DEVICES
makes first):

    python3 bench/sm_share.py [--quick] [--out results.json] [--dry-run] [--only NAMES]

It builds native/build/libvgpu.so (make -s -C native all) and
bench/driver_overhead.c, then runs the scenarios below one after the other,
each as bench/sm_worker.py subprocesses (PyTorch) in their own temporary slice
files. Baselines run without LD_PRELOAD; throttled workers run with
LD_PRELOAD=native/build/libvgpu.so, HAMI_SLICE, CUDA_DEVICE_SM_LIMIT and
HAMI_SM_MODE. A fraction is units_per_s(throttled) / units_per_s(baseline of
the same workload, measured earlier in the same run). 1-s figures slide a 1-s
window over the workers' 0.1-s windows (step 0.1 s) and give the lowest and
highest fraction.

Each scenario's result is printed as soon as it is done, a failing scenario
is reported and skipped, the JSON (--out) is rewritten after every scenario,
and a markdown table closes the run. Exit status: 0 when every scenario ran
(whatever the targets say), 1 when one failed to run, 2 when the build failed.
"""
import argparse
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "native" / "build" / "libvgpu.so"
LIB_IN_USE = [LIB]  # --lib: another build of the library for the throttled workers
WORKER = REPO / "bench" / "sm_worker.py"
OVERHEAD_SRC = REPO / "bench" / "driver_overhead.c"
OVERHEAD_BIN = REPO / "native" / "build" / "bench" / "driver_overhead"
DEFAULT_OUT = REPO / "native" / "build" / "bench" / "sm_share.json"

BUILD_CMDS = [
    ["make", "-s", "-C", "native", "all"],
    ["mkdir", "-p", "native/build/bench"],
    ["cc", "-O2", "-Inative/include", "-o", "native/build/bench/driver_overhead",
     "bench/driver_overhead.c", "-ldl"],
]

# Settings of ours (or HAMi's) a baseline must not inherit from the caller's shell.
LIMIT_VARS = {"LD_PRELOAD", "HAMI_SLICE", "HAMI_SLICE_NAME", "HAMI_SM_MODE", "HAMI_CONTEXT_OVERHEAD",
              "CUDA_DEVICE_MEMORY_SHARED_CACHE"}
LIMIT_PREFIXES = ("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT")

STARTUP_EST_S = 7.0  # python + torch import + CUDA context + workload setup, per worker


class ScenarioError(Exception):
    pass


def say(*parts):
    print(*parts, flush=True)


# ---- plan -------------------------------------------------------------------


def worker(name, workload, share=None, mode="hard", change=None, slice_name=None):
    """One process of a scenario; workers with the same *slice_name* share a slice."""
    return {"name": name, "workload": workload, "share": share, "mode": mode, "change": change,
            "slice": slice_name or name}


def build_plan(a):
    S = a.seconds
    plan = []

    def add(name, title, check, workers=None, seconds=S, kind="workers", **extra):
        plan.append(dict(name=name, title=title, check=check, kind=kind, seconds=seconds,
                         workers=workers or [], **extra))

    for wl, what in (("matmul", f"bf16 matmul {a.matmul_size}^3 loop"),
                     ("copy", "device-to-device copy by a kernel (1 GiB, bf16 dst = src * 1)"),
                     ("small", f"short kernels, eager ({a.small_layers} x [{a.small_rows}x{a.small_width}] "
                               f"@ [{a.small_width}x{a.small_width}] + relu + bias)"),
                     ("graph", "short kernels, the same step as one CUDA graph replay")):
        add(f"baseline_{wl}", f"{what}, no preload", "baseline", [worker("A", wl)], workload=wl)
    for p in (25, 50, 75):
        add(f"matmul_{p}", f"matmul at {p} % (hard)", "single", [worker("A", "matmul", p)],
            workload="matmul", share=p, tol=0.03, tol_1s=0.05)
    for p in (25, 50, 75):
        add(f"copy_{p}", f"memory-bound copy kernel at {p} % (hard)", "single", [worker("A", "copy", p)],
            workload="copy", share=p, tol=0.05, tol_1s=None)
    for wl in ("small", "graph"):
        add(f"{wl}_50", f"{wl} at 50 % (hard)", "single", [worker("A", wl, 50)],
            workload=wl, share=50, tol=0.05, tol_1s=None)
    add("quad_50", "four processes in one slice at 50 % (hard), matmul each, measured together",
        "quad", [worker(n, "matmul", 50, slice_name="S") for n in "ABCD"], workload="matmul",
        share=50, tol=0.03)
    add("pair_hard_30_70", "two slices, matmul each, 30 % and 70 % (hard), measured together", "pair",
        [worker("A", "matmul", 30), worker("B", "matmul", 70)], workload="matmul", tol=0.03)
    add("elastic_alone_30", "slice A 30 % elastic alone (slice B idle: no process)", "elastic_alone",
        [worker("A", "matmul", 30, "elastic")], workload="matmul", floor=0.90)
    add("pair_elastic_30_70", "two slices, matmul each, 30 % and 70 % elastic, both saturating",
        "pair_elastic", [worker("A", "matmul", 30, "elastic"), worker("B", "matmul", 70, "elastic")],
        workload="matmul", tol=0.03)
    add("live_25_75", f"matmul at 25 % (hard), set_sm_share(..., 75) at t = {a.change_at:g} s",
        "live", [worker("A", "matmul", 25, "hard", change=(a.change_at, 75))],
        seconds=a.live_seconds, workload="matmul", new_share=75, band=0.05)
    add("overhead", "cuLaunchKernel CPU time (bench/driver_overhead.c), alternating rounds", "overhead",
        kind="overhead")
    add("baseline_matmul_end", "matmul baseline again, for the drift over the run", "drift",
        [worker("A", "matmul")], workload="matmul")

    if a.only:
        wanted = [s.strip() for s in a.only.split(",") if s.strip()]
        keep = {s["name"] for s in plan if any(s["name"] == w or s["name"].startswith(w) for w in wanted)}
        unknown = [w for w in wanted if not any(n == w or n.startswith(w) for n in (s["name"] for s in plan))]
        if unknown:
            raise SystemExit(f"--only: no scenario named {', '.join(unknown)}; "
                             f"have {', '.join(s['name'] for s in plan)}")
        for s in plan:  # a fraction needs the baseline of its workload
            if s["name"] in keep and s["check"] not in ("baseline", "overhead"):
                keep.add(f"baseline_{s['workload']}")
        plan = [s for s in plan if s["name"] in keep]
    return plan


def estimate_s(plan, a):
    total = 15.0  # build
    for s in plan:
        if s["kind"] == "overhead":
            total += (a.rounds + 1) * 3 * 1.5
        else:
            total += STARTUP_EST_S + a.warmup + (a.pair_delay if len(s["workers"]) > 1 else 0.3) + s["seconds"] + 1
    return total


# ---- environment and commands ------------------------------------------------------


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in LIMIT_VARS and not k.startswith(LIMIT_PREFIXES)}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def limit_env(slice_path, share=None, mode=None):
    env = {"LD_PRELOAD": str(LIB_IN_USE[0]), "HAMI_SLICE": str(slice_path)}
    if share is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(share)
    if mode is not None:
        env["HAMI_SM_MODE"] = mode
    return env


def worker_command(scn, w, sdir, a):
    """(argv, environment additions) of one worker of a scenario."""
    slice_path = f"{sdir}/{w['slice']}.slice"
    cmd = [a.python, str(WORKER), "--workload", w["workload"], "--seconds", f"{scn['seconds']:g}",
           "--window", f"{a.window:g}", "--warmup", f"{a.warmup:g}",
           "--ready-file", f"{sdir}/{w['name']}.ready", "--start-file", f"{sdir}/start",
           "--label", f"{scn['name']}/{w['name']}"]
    if w["workload"] == "matmul":
        cmd += ["--matmul-size", str(a.matmul_size)]
    else:
        cmd += ["--small-rows", str(a.small_rows), "--small-width", str(a.small_width),
                "--small-layers", str(a.small_layers)]
    env = {}
    if w["share"] is not None:
        env = limit_env(slice_path, w["share"], w["mode"])
    if w["change"]:
        at, to = w["change"]
        cmd += ["--change-at", f"{at:g}", "--change-to", str(to), "--slice", slice_path]
    return cmd, env


def show_cmd(cmd, env):
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (pre + " " if pre else "") + " ".join(shlex.quote(c) for c in cmd)


def overhead_modes(odir, r):
    return [
        ("none", {}),
        ("preload", limit_env(f"{odir}/preload-{r}.slice")),
        ("preload_sm90", limit_env(f"{odir}/sm90-{r}.slice", 90, "hard")),
    ]


# ---- running ----------------------------------------------------------------------


def tail(path, n=1500):
    try:
        return Path(path).read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line in the output")


def slice_snapshot(path):
    """What the slice file says after the run (device 0), for the JSON; None if unreadable."""
    try:
        import dataclasses

        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from hami_jupyter.slice.file import SliceFile

        with SliceFile(path) as sf:
            snap = sf.snapshot()
        return {"limits_generation": snap.limits_generation,
                "devices": [dataclasses.asdict(d) for d in snap.devices[:1]]}
    except Exception as e:  # diagnostics only
        return {"error": f"{type(e).__name__}: {e}"}


class Tracer(threading.Thread):
    """--trace: what each slice's controller did (open window, its NVML view)
    and NVML's per-process time, every 50 ms while the workers run."""

    def __init__(self, slices, pids):
        super().__init__(daemon=True)
        self.slices, self.pids = slices, pids  # {name: path}, {pid: worker name}
        self.stop = threading.Event()
        self.rows, self.nvml = [], []

    def _device(self, path):
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from hami_jupyter.slice.layout import DEVICES_OFFSET, HamiSliceDevice

        import ctypes
        with open(path, "rb") as f:
            raw = os.pread(f.fileno(), ctypes.sizeof(HamiSliceDevice), DEVICES_OFFSET)
        return HamiSliceDevice.from_buffer_copy(raw)

    def run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            pynvml = handle = None
        # Every sample the driver still holds is read each time (lastSeen 0),
        # so that one arriving after a newer sample of another process is
        # seen too: "late" marks those a reader asking only for samples newer
        # than the newest it has seen would never get.
        known, newest = set(), 0
        while not self.stop.wait(0.05):
            t = time.monotonic()
            for name, path in self.slices.items():
                try:
                    d = self._device(path)
                except OSError:
                    continue
                self.rows.append({"t": t, "slice": name, "open_ppm": d.sm_open_ppm, "util": d.sm_util,
                                  "others": d.sm_others_util, "waits": d.sm_waits})
            if handle is not None:
                try:
                    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
                except Exception:
                    samples = []
                for smp in samples:
                    if smp.pid in self.pids and (smp.pid, smp.timeStamp) not in known:
                        known.add((smp.pid, smp.timeStamp))
                        self.nvml.append({"t": t, "ts": smp.timeStamp, "worker": self.pids[smp.pid],
                                          "sm": smp.smUtil, "late": smp.timeStamp <= newest})
                newest = max([newest] + [smp.timeStamp for smp in samples])

    def summary(self, t0, seconds):
        """Means over the measured part: per slice the controller's window and
        view, per worker NVML's time (its distinct samples)."""
        out = {}
        part = [r for r in self.rows if t0 <= r["t"] <= t0 + seconds]
        for name in self.slices:
            mine = [r for r in part if r["slice"] == name]
            if mine:
                out[f"slice {name}"] = {k: round(statistics.mean(r[k] for r in mine), 1)
                                        for k in ("open_ppm", "util", "others")}
        samples = {}
        for r in self.nvml:
            if t0 <= r["t"] <= t0 + seconds:
                samples.setdefault(r["worker"], []).append(r)
        for w, rs in samples.items():
            late = [r["sm"] for r in rs if r["late"]]
            out[f"nvml {w}"] = {"sm_time_mean": round(statistics.mean(r["sm"] for r in rs), 1),
                                "samples": len(rs), "late": len(late),
                                "late_sm_mean": round(statistics.mean(late), 1) if late else None}
        return out


def run_workers(scn, tmp, a):
    sdir = Path(tmp) / scn["name"]
    sdir.mkdir(parents=True)
    procs = []
    try:
        for w in scn["workers"]:
            cmd, extra = worker_command(scn, w, sdir, a)
            env = clean_env()
            env.update(extra)
            out = open(sdir / f"{w['name']}.out", "w")
            err = open(sdir / f"{w['name']}.err", "w")
            p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO)
            procs.append((w, p, out, err))

        def check_alive():
            for w, p, _o, _e in procs:
                if p.poll() is not None:
                    raise ScenarioError(f"worker {w['name']} exited early (rc {p.returncode}): "
                                        f"{tail(sdir / (w['name'] + '.err'))}")

        deadline = time.monotonic() + a.ready_timeout
        while not all((sdir / f"{w['name']}.ready").exists() for w in scn["workers"]):
            check_alive()
            if time.monotonic() > deadline:
                raise ScenarioError(f"workers not ready after {a.ready_timeout:g} s")
            time.sleep(0.02)
        t0 = time.monotonic() + (a.pair_delay if len(procs) > 1 else 0.3)
        tracer = None
        if a.trace and any(w["share"] is not None for w in scn["workers"]):
            tracer = Tracer({w["slice"]: sdir / f"{w['slice']}.slice" for w in scn["workers"] if w["share"]},
                            {p.pid: w["name"] for w, p, _o, _e in procs})
            tracer.start()
        tmp_start = sdir / "start.tmp"
        tmp_start.write_text(f"{t0!r}\n")
        os.replace(tmp_start, sdir / "start")

        results = {}
        for w, p, out, err in procs:
            left = t0 + scn["seconds"] + a.finish_timeout - time.monotonic()
            try:
                rc = p.wait(timeout=max(1.0, left))
            except subprocess.TimeoutExpired:
                raise ScenarioError(f"worker {w['name']} did not finish in time")
            out.flush()
            err.flush()
            if rc != 0:
                raise ScenarioError(f"worker {w['name']} failed (rc {rc}): {tail(sdir / (w['name'] + '.err'))}")
            try:
                results[w["name"]] = last_json((sdir / f"{w['name']}.out").read_text())
            except ValueError as e:
                raise ScenarioError(f"worker {w['name']}: {e}: {tail(sdir / (w['name'] + '.out'))}")
            results[w["name"]]["stderr_tail"] = tail(sdir / (w["name"] + ".err"), 600)
            if w["share"] is not None:
                results[w["name"]]["slice_after"] = slice_snapshot(sdir / f"{w['name']}.slice")
        if tracer:
            tracer.stop.set()
            tracer.join(timeout=5)
            scn["trace"] = tracer.summary(t0, scn["seconds"])
            say(f"  trace: {json.dumps(scn['trace'])}")
        return results
    finally:
        for _w, p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()


def run_overhead(a, tmp):
    if not OVERHEAD_BIN.exists():
        raise ScenarioError(f"{OVERHEAD_BIN.relative_to(REPO)} was not built")
    odir = Path(tmp) / "overhead"
    odir.mkdir(parents=True)
    names = [m for m, _ in overhead_modes(odir, 0)]
    samples = {m: [] for m in names}
    for r in range(-1, a.rounds):  # round -1 warms caches up and is dropped
        modes = overhead_modes(odir, r)
        k = (r + 1) % len(modes)
        for mode, extra in modes[k:] + modes[:k]:  # rotate the order each round
            env = clean_env()
            env.update(extra)
            p = subprocess.run([str(OVERHEAD_BIN), str(a.launches)], env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise ScenarioError(f"driver_overhead ({mode}) failed (rc {p.returncode}): "
                                    f"{(p.stderr or p.stdout)[-800:].strip()}")
            if r >= 0:
                sample = last_json(p.stdout)
                sample["stderr_tail"] = p.stderr[-300:]
                samples[mode].append(sample)
    med = {m: statistics.median(x["launch_ns"] for x in samples[m]) for m in names}
    paired = {m: statistics.median(x["launch_ns"] - y["launch_ns"] for x, y in zip(samples[m], samples["none"]))
              for m in ("preload", "preload_sm90")}
    return {"rounds": a.rounds, "launches": a.launches, "median_launch_ns": med,
            "added_ns": {m: med[m] - med["none"] for m in ("preload", "preload_sm90")},
            "added_ns_paired_median": paired, "samples": samples}


# ---- figures ----------------------------------------------------------------------


def sliding_1s(res, per_s_base):
    """Fractions of the baseline in every 1-s window (stepping by one report window)."""
    w = res["window"]
    win = res["window_units"]
    k = max(1, int(round(1.0 / w)))
    if len(win) < k:
        return []
    return [sum(win[i:i + k]) / (k * w) / per_s_base for i in range(len(win) - k + 1)]


def fraction_stats(res, base):
    bu = base["units_per_s"]
    sl = sliding_1s(res, bu)
    return {"fraction": res["units_per_s"] / bu, "min_1s": min(sl) if sl else None,
            "max_1s": max(sl) if sl else None, "sliding_1s": [round(x, 4) for x in sl]}


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f} %"


def span(lo, hi):
    return "n/a" if lo is None else f"{100 * lo:.1f} .. {100 * hi:.1f} %"


def row(scenario, target, measured, one_s="", result=None, note="", **values):
    return {"scenario": scenario, "target": target, "measured": measured, "one_s": one_s,
            "result": result, "note": note, "values": values}


def need_baseline(scn, baselines):
    base = baselines.get(scn["workload"])
    if base is None:
        raise ScenarioError(f"no baseline for {scn['workload']} in this run (baseline scenario failed or skipped)")
    return base


def analyze(scn, data, baselines):
    c = scn["check"]
    name = scn["name"]
    if c in ("baseline", "drift"):
        res = data["A"]
        own = sliding_1s(res, res["units_per_s"])
        note = f"sync wait {res['sync_wait_frac']:.2f} of batch time" if res.get("sync_wait_frac") is not None else ""
        if c == "baseline" and scn["workload"] != "matmul" and (res.get("sync_wait_frac") or 0) < 0.1:
            note += "; little sync wait: the GPU may be waiting on the CPU (launch-bound), so a share " \
                    "would not map to the same fraction of throughput"
        measured = f"{res['units_per_s']:.1f} units/s, {res['tflops']:.0f} TFLOP/s"
        if c == "baseline":
            return [row(name, "reference", measured, "own mean: " + span(min(own, default=None), max(own, default=None)),
                        None, note, units_per_s=res["units_per_s"])]
        start = baselines.get("matmul")
        if start is None:
            return [row(name, "drift (info)", measured, "", None, "no first matmul baseline")]
        drift = res["units_per_s"] / start["units_per_s"]
        note = "fractions above use the first baseline" + (
            "; it drifted more than 2 %, read the fractions with that uncertainty" if abs(drift - 1) > 0.02 else "")
        return [row(name, "drift (info)", f"end/start = {drift:.3f}", measured, None, note, drift=drift)]

    base = need_baseline(scn, baselines)
    if c == "single":
        st = fraction_stats(data["A"], base)
        share = scn["share"] / 100
        ok = abs(st["fraction"] - share) <= scn["tol"] + 1e-9
        target = f"{scn['share']} % +-{round(scn['tol'] * 100)}"
        if scn["tol_1s"] is not None:
            target += f", every 1 s +-{round(scn['tol_1s'] * 100)}"
            ok = ok and st["min_1s"] is not None and st["min_1s"] >= share - scn["tol_1s"] - 1e-9 \
                and st["max_1s"] <= share + scn["tol_1s"] + 1e-9
        note = f"sync wait {data['A']['sync_wait_frac']:.2f}" if data["A"].get("sync_wait_frac") is not None else ""
        return [row(name, target, pct(st["fraction"]), span(st["min_1s"], st["max_1s"]), ok, note, **st)]

    if c in ("pair", "pair_elastic", "elastic_alone"):
        out = []
        stats = {wn: fraction_stats(data[wn], base) for wn in data}
        total = sum(s["fraction"] for s in stats.values())
        for w in scn["workers"]:
            st = stats[w["name"]]
            share = w["share"] / 100
            if c == "pair":
                target = f"{w['share']} % +-{round(scn['tol'] * 100)}"
                ok = abs(st["fraction"] - share) <= scn["tol"] + 1e-9
            elif c == "pair_elastic":
                target = f">= {w['share']} % (-{round(scn['tol'] * 100)})"
                ok = st["fraction"] >= share - scn["tol"] - 1e-9
            else:
                target = f">= {round(scn['floor'] * 100)} % of baseline"
                ok = st["fraction"] >= scn["floor"] - 1e-9
            note = f"both slices together: {pct(total)}" if len(scn["workers"]) > 1 else ""
            out.append(row(f"{name} {w['name']} ({w['share']} % {w['mode']})", target, pct(st["fraction"]),
                           span(st["min_1s"], st["max_1s"]), ok, note, **st))
        return out

    if c == "quad":
        stats = {wn: fraction_stats(data[wn], base) for wn in data}
        total = sum(st["fraction"] for st in stats.values())
        share = scn["share"] / 100
        each = ", ".join(f"{wn} {pct(st['fraction'])}" for wn, st in sorted(stats.items()))
        return [row(name, f"{scn['share']} % +-{round(scn['tol'] * 100)} (slice total)", pct(total), "",
                    abs(total - share) <= scn["tol"] + 1e-9, f"per process: {each}", fraction=total)]

    if c == "live":
        return analyze_live(scn, data["A"], base)
    raise ScenarioError(f"unknown check {c}")


def analyze_live(scn, res, base):
    ch = res.get("change")
    if not ch:
        raise ScenarioError("the worker never made the change (measured part too short?)")
    if ch.get("error"):
        raise ScenarioError(f"set_sm_share failed in the worker: {ch['error']}")
    bu = base["units_per_s"]
    w = res["window"]
    win = res["window_units"]
    k = max(1, int(round(1.0 / w)))
    sl = sliding_1s(res, bu)
    tc = ch["at"]
    new = scn["new_share"] / 100
    band = scn["band"]
    first_after = int(math.ceil(tc / w - 1e-9))  # first window starting at or after the change
    settle_idx = None
    for j in range(len(sl) - 1, first_after - 1, -1):  # smallest j from which every 1-s window is in band
        if abs(sl[j] - new) <= band + 1e-9:
            settle_idx = j
        else:
            break
    before_n = int(tc / w)
    before = sum(win[:before_n]) / (before_n * w) / bu if before_n else None
    from_window = int(tc / w)
    rate_100ms = [round(u / w / bu, 4) for u in win[from_window:]]
    extra = {"change_at_s": tc, "change_call_s": ch["done"] - ch["at"], "before_fraction": before,
             "rate_100ms_after": rate_100ms, "rate_100ms_after_from_s": from_window * w,
             "sliding_1s": [round(x, 4) for x in sl]}
    target = f"time until every later 1 s is {scn['new_share']} % +-{round(band * 100)}"
    if first_after > len(sl) - 1:
        return [row(scn["name"], target, "not enough time after the change", "", False, "", **extra)]
    if settle_idx is None:
        return [row(scn["name"], target, "never settled", f"before: {pct(before)}", False,
                    "last 1 s: " + pct(sl[-1]), **extra)]
    settle = settle_idx * w - tc
    after = sum(win[settle_idx:]) / ((len(win) - settle_idx) * w) / bu
    held = (len(win) - settle_idx) * w
    extra.update(settle_s=settle, after_fraction=after, held_s=held)
    return [row(scn["name"], target, f"{settle:.2f} s", f"before {pct(before)}, after {pct(after)}", True,
                f"held for the last {held:.1f} s; first 100-ms windows after the change: "
                + " ".join(f"{100 * x:.0f}" for x in rate_100ms[:15]), **extra)]


def overhead_rows(o):
    med = o["median_launch_ns"]
    out = []
    for mode, target, limit in (("preload", "<= 50 ns added (no SM limit)", 50),
                                ("preload_sm90", "<= 200 ns added (SM limit 90, not binding)", 200)):
        added = o["added_ns"][mode]
        out.append(row(f"launch overhead, {mode}", target, f"{added:+.1f} ns",
                       f"paired median {o['added_ns_paired_median'][mode]:+.1f} ns", added <= limit,
                       f"medians over {o['rounds']} rounds: none {med['none']:.1f} ns, "
                       f"{mode} {med[mode]:.1f} ns per launch", added_ns=added))
    return out


# ---- reporting ----------------------------------------------------------------------


def verdict(r):
    if r.get("error"):
        return "ERROR"
    return {True: "PASS", False: "FAIL", None: "-"}[r["result"]]


def row_line(r):
    s = f"   {r['scenario']}: {r['measured']}"
    if r["one_s"]:
        s += f" [1 s: {r['one_s']}]"
    s += f"  target {r['target']}: {verdict(r)}"
    if r["note"]:
        s += f"  ({r['note']})"
    return s


def markdown(rows):
    lines = ["| scenario | target | measured | 1-s windows / detail | result | note |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [r["scenario"], r["target"], r["measured"], r["one_s"], verdict(r), r["note"]]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def write_json(path, doc):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def meta(a):
    m = {"started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": socket.gethostname(),
         "python": sys.version.split()[0], "argv": sys.argv, "quick": a.quick,
         "seconds": a.seconds, "live_seconds": a.live_seconds, "window": a.window, "warmup": a.warmup,
         "library": str(LIB_IN_USE[0])}
    for key, cmd in (("git", ["git", "rev-parse", "HEAD"]), ("git_dirty", ["git", "status", "--porcelain"]),
                     ("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"])):
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=15)
            v = p.stdout.strip()
            m[key] = bool(v) if key == "git_dirty" else v
        except (OSError, subprocess.TimeoutExpired):
            m[key] = None
    return m


# ---- main ----------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4-s measured parts, 3 overhead rounds")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--dry-run", action="store_true", help="print the plan and commands, start nothing")
    p.add_argument("--only", help="comma-separated scenario names or prefixes (their baselines are added)")
    p.add_argument("--seconds", type=float, help="measured part per scenario (default 10, quick 4)")
    p.add_argument("--live-seconds", type=float, help="measured part of the live change (default 12, quick 6)")
    p.add_argument("--change-at", type=float, help="when the live change is made (default 4, quick 2)")
    p.add_argument("--window", type=float, default=0.1, help="report window of the workers, s")
    p.add_argument("--warmup", type=float, default=1.0, help="worker warm-up before ready, s")
    p.add_argument("--pair-delay", type=float, default=1.0,
                   help="seconds between both workers being ready and the start of the measured part")
    p.add_argument("--rounds", type=int, help="overhead rounds per mode (default 7, quick 3)")
    p.add_argument("--launches", type=int, help="launches per driver_overhead run (default 200000, quick 100000)")
    p.add_argument("--matmul-size", type=int, default=8192)
    p.add_argument("--small-rows", type=int, default=8192)
    p.add_argument("--small-width", type=int, default=512)
    p.add_argument("--small-layers", type=int, default=8)
    p.add_argument("--ready-timeout", type=float, default=150.0, help="s for workers to import torch and warm up")
    p.add_argument("--finish-timeout", type=float, default=30.0, help="s allowed past the measured part")
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers (needs torch)")
    p.add_argument("--keep-tmp", action="store_true", help="keep slice files and worker logs")
    p.add_argument("--lib", help="the preload library for throttled workers (default: this checkout's build), "
                                 "to compare two builds")
    p.add_argument("--trace", action="store_true",
                   help="record each slice's open window and NVML view, and NVML's per-process time, "
                        "every 50 ms; print their means per scenario")
    a = p.parse_args(argv)
    if a.lib:
        LIB_IN_USE[0] = Path(a.lib).resolve()
    q = a.quick
    a.seconds = a.seconds if a.seconds is not None else (4.0 if q else 10.0)
    a.live_seconds = a.live_seconds if a.live_seconds is not None else (6.0 if q else 12.0)
    a.change_at = a.change_at if a.change_at is not None else (2.0 if q else 4.0)
    a.rounds = a.rounds if a.rounds is not None else (3 if q else 7)
    a.launches = a.launches if a.launches is not None else (100000 if q else 200000)
    if a.change_at + 1.5 > a.live_seconds:
        p.error("--change-at must leave at least 1.5 s of the live scenario after the change")
    if a.seconds < 1.0:
        p.error("--seconds must be at least 1 (1-s windows)")
    return a


def dry_run(plan, a):
    say("# build (from the repository root)")
    for c in BUILD_CMDS:
        say("  " + " ".join(shlex.quote(x) for x in c))
    say(f"\n# scenarios, one after the other ($TMP is a fresh temporary directory; results -> {a.out})")
    dropped = ", ".join(sorted(LIMIT_VARS) + [p + "*" for p in LIMIT_PREFIXES])
    say(f"# every command runs in the repository root with the caller's environment minus {dropped};")
    say(f"# plus PYTHONPATH={REPO} PYTHONUNBUFFERED=1 and the variables shown")
    for s in plan:
        say(f"\n[{s['name']}] {s['title']}")
        if s["kind"] == "overhead":
            say(f"  {a.rounds} rounds (+1 dropped warm-up round), order rotated each round, each:")
            for mode, env in overhead_modes("$TMP/overhead", "R"):
                say(f"    {mode}: " + show_cmd([str(OVERHEAD_BIN.relative_to(REPO)), str(a.launches)], env))
            continue
        if len(s["workers"]) > 1:
            say(f"  {len(s['workers'])} workers started together; one measured part of {s['seconds']:g} s "
                f"starting {a.pair_delay:g} s after all are warm")
        else:
            say(f"  1 worker; measured part {s['seconds']:g} s starting 0.3 s after it is warm")
        for w in s["workers"]:
            cmd, env = worker_command(s, w, f"$TMP/{s['name']}", a)
            say(f"  {w['name']}: " + show_cmd(cmd, env))
    say(f"\n# about {estimate_s(plan, a) / 60:.1f} min in all")


def main():
    a = parse_args()
    plan = build_plan(a)
    if a.dry_run:
        dry_run(plan, a)
        return 0

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    say(f"sm_share: {len(plan)} scenarios, about {estimate_s(plan, a) / 60:.1f} min; JSON -> {a.out}")
    for c in BUILD_CMDS:
        p = subprocess.run(c, cwd=REPO, capture_output=True, text=True)
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).strip()[-2000:]
            if c[0] == "make":
                say(f"build failed: {' '.join(c)}\n{msg}")
                return 2
            say(f"warning: {' '.join(c)} failed (the overhead scenario will fail):\n{msg}")
    if not LIB_IN_USE[0].exists():
        say(f"build failed: {LIB_IN_USE[0]} missing")
        return 2

    doc = {"meta": meta(a), "scenarios": [], "rows": []}
    say(f"GPU: {doc['meta'].get('gpu')}  git {doc['meta'].get('git')}")
    tmp = tempfile.mkdtemp(prefix="hami-sm-bench-")
    baselines = {}
    failed = 0
    t_all = time.monotonic()
    try:
        for s in plan:
            say(f"\n== {s['name']}: {s['title']}")
            t = time.monotonic()
            rec = {"name": s["name"], "title": s["title"], "check": s["check"]}
            try:
                if s["kind"] == "overhead":
                    rec["overhead"] = run_overhead(a, tmp)
                    rows = overhead_rows(rec["overhead"])
                else:
                    if s["check"] not in ("baseline", "drift") and s["workload"] not in baselines:
                        raise ScenarioError(f"skipped: no {s['workload']} baseline in this run")
                    data = run_workers(s, tmp, a)
                    rec["workers"] = data
                    if "trace" in s:
                        rec["trace"] = s["trace"]
                    if s["check"] == "baseline":
                        baselines[s["workload"]] = data["A"]
                    rows = analyze(s, data, baselines)
                rec["ok"] = True
            except (ScenarioError, Exception) as e:  # report and go on
                failed += 1
                rec["ok"] = False
                rec["error"] = f"{type(e).__name__}: {e}"
                rows = [row(s["name"], "-", "did not run", "", None, rec["error"][:300])]
                rows[0]["error"] = True
            rec["rows"] = rows
            rec["wall_s"] = round(time.monotonic() - t, 2)
            doc["scenarios"].append(rec)
            doc["rows"].extend(rows)
            for r in rows:
                say(row_line(r))
            say(f"   ({rec['wall_s']:.1f} s; {time.monotonic() - t_all:.0f} s so far)")
            write_json(a.out, doc)
    except KeyboardInterrupt as e:
        say(f"\ninterrupted ({e}); results so far:")
        doc["interrupted"] = str(e)
        failed += 1
    finally:
        doc["wall_s"] = round(time.monotonic() - t_all, 1)
        write_json(a.out, doc)
        if a.keep_tmp:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    passed = sum(1 for r in doc["rows"] if r["result"] is True)
    judged = sum(1 for r in doc["rows"] if r["result"] is not None)
    say("\n" + markdown(doc["rows"]))
    gpus = sorted({w.get("device") for sc in doc["scenarios"] for w in (sc.get("workers") or {}).values()})
    torch_v = sorted({w.get("torch") for sc in doc["scenarios"] for w in (sc.get("workers") or {}).values()})
    say(f"\n{passed}/{judged} targets met; {failed} scenario(s) did not run; device {', '.join(map(str, gpus))}, "
        f"torch {', '.join(map(str, torch_v))}; {doc['wall_s']:.0f} s; JSON: {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
