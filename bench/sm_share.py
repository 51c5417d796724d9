#!/usr/bin/env python3
"""SM-share benchmark: how closely the preload library holds a slice to its share.

One command reruns everything, on one GPU (cuda:0, or what CUDA_VISIBLE_DEVICES
makes first):

    python3 bench/sm_share.py [--quick] [--out results.json] [--dry-run] [--only NAMES]

It builds native/build/libvgpu.so (make -s -C native all) and
bench/driver_overhead.c, then runs the scenarios below one after the other,
each as worker subprocesses (bench/sm_worker.py, PyTorch; bench/sm_worker_jax.py
for the jax workload) in their own temporary slice files. Baselines run
without LD_PRELOAD; throttled workers run with LD_PRELOAD=native/build/libvgpu.so,
HAMI_SLICE, CUDA_DEVICE_SM_LIMIT and HAMI_SM_MODE. A fraction is
units_per_s(throttled) / units_per_s(baseline of the same workload, measured
just before in the same run). 1-s figures slide a 1-s window over the
workers' 0.1-s windows (step 0.1 s) and give the lowest and highest fraction.

Fitted and held out (issue 29). The share's work model was fitted and tuned
on four workloads: matmul, copy, small, graph (FITTED). Every other workload
is held out: it checks whether the model holds on work it was not fitted on
(constant data, fp32, fp8, a conv net, attention, JAX). Every row says which
(since issue 42 a hard share is of busy time by default, and the model is
used only with HAMI_SM_SHARE_OF=work).
Each workload gets a baseline and then, right after it (so that baseline and
rows see the same host and GPU temperature), rows at 25 / 50 / 75 % hard in
a lone slice, judged by what a share promises (issue 42, docs/sm-share.md):
the GPU busy min(s, u) of the time +-3 points (NVML's utilization over the
measured part; the random-data matmul also in every 1-s window +-5), and a
pace never below min(1, s/u) of its own baseline's - 5 points, in any 1-s
window - 10; u is the share of time the GPU was busy (NVML) during that
baseline. A share caps a slice's busy time, so a loop busy only u of the
time alone is not slowed by s >= u and gets s/u of its pace below that; a
GPU that clocks higher under a share than at full load gives the slice
more pace than its busy time: each row reports that part beside the SM
clock against its baseline's, and is met on busy time.
The contention rows (quad, pairs hard and elastic, judged on throughput,
which at full load is their time), the live changes 25 -> 75 and 75 -> 25
(every 100-ms window from 100 ms after the change within +-5 of the new
share, in busy time: throughput times the baseline's SM clock over the
window's), the launch overhead and the drift row follow.

Telemetry. While every scenario runs, a thread polls NVML on the benchmark's
GPU every 100 ms (bench/sm_telemetry.py: SM and memory clock, power and its
enforced limit, clock event reasons, utilization, temperature); the JSON
keeps each scenario's series and each row a summary over the measured part,
printed beside the row. Without pynvml the rows still run, and the
short-kernel rows say that u is unknown and are not judged.

Launch overhead. Each round runs driver_overhead.c's pairs once in each
mode (no preload / preload / preload with a limit of 90 that does not
bind): inside one process, blocks of launches through the hook and through
the driver's own entry point alternate, and each pair's difference is what
the hook added (without the preload both are the driver's: the method's
noise). Rounds are added until the 95 % bootstrap interval of each mode's
median difference is narrower than 20 ns, or --overhead-cap seconds
(bench/sm_overhead.py); a mode is met when the upper end of its interval is
within its budget, the noise row beside it.

Time. Measured parts are 6 s (--quick 4; the live change 12 / 6 s), chosen
so that each of the two groups below fits one 10-minute device call; the
whole plan does not (--dry-run prints the estimates). The groups:
--only fitted (the four fitted workloads, contention rows, drift) and
--only held_out (the held-out workloads and the launch overhead, whose
empty-kernel loop is no part of the model's fit). --only issue34 is a set
of its own: what issue 34 missed (short kernels, the conv net at 75 %,
constant-data and JAX matmuls, the random matmul at 50 %, the overhead);
--only issue42 another: what issue 42 found at 75 % and in a live change
(short kernels at 50 / 75 %, the conv net and the random, constant-data and
JAX matmuls at 75 %, the live change 25 -> 75 and back, the overhead).

Each scenario's result is printed as soon as it is done, a failing scenario
is reported and skipped, a workload that cannot run here (fp8 below compute
capability 8.9, no jax) gives "not run" rows, the JSON (--out) is rewritten
after every scenario, and a markdown table closes the run. Exit status: 0
when every scenario ran or was not run for a stated reason (whatever the
targets say), 1 when one failed to run, 2 when the build failed.
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

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import sm_overhead  # noqa: E402 (stdlib only)
import sm_telemetry  # noqa: E402 (stdlib only; pynvml is loaded when sampling starts)

REPO = BENCH.parent
LIB = REPO / "native" / "build" / "libvgpu.so"
LIB_IN_USE = [LIB]  # --lib: another build of the library for the throttled workers
WORKER = BENCH / "sm_worker.py"
WORKER_JAX = BENCH / "sm_worker_jax.py"
OVERHEAD_SRC = BENCH / "driver_overhead.c"
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

# workload: (fit, kind). kind "compute" / "memory": judged at the share;
# "short": launch-paced, judged at min(1, s/u) of its own pace.
WORKLOADS = {
    "matmul": ("fitted", "compute"),
    "copy": ("fitted", "memory"),
    "small": ("fitted", "short"),
    "graph": ("fitted", "short"),
    "matmul_const": ("held out", "compute"),
    "matmul_fp32": ("held out", "compute"),
    "matmul_fp8": ("held out", "compute"),
    "conv": ("held out", "compute"),
    "attention": ("held out", "compute"),
    "jax": ("held out", "compute"),
}
FITTED = tuple(w for w, (fit, _k) in WORKLOADS.items() if fit == "fitted")
HELD_OUT = tuple(w for w, (fit, _k) in WORKLOADS.items() if fit != "fitted")
LAUNCH = "launch"  # the overhead scenario's empty kernel (driver_overhead.c): no part of the fit
SHARES = (25, 50, 75)
# What a share promises (docs/sm-share.md), issue 42: a slice alone keeps the GPU busy
# min(s, u) of the time +-3 points (u: its busy share alone), and its pace never falls below
# min(1, s/u) of its pace alone - 5 points, in any 1-s window - 10; a live change lands within
# 100 ms, every later 100-ms window +-5 of the new share.
TOL = 0.03  # busy time +-3 points; the contention rows, whose throughput is their time at full load
TOL_BUSY_1S = 0.05  # the random-data matmul: every 1-s window of busy time +-5
TOL_PACE = 0.05  # pace never below min(1, s/u) - 5 points ...
TOL_PACE_1S = 0.10  # ... in any 1-s window - 10 (issue 34)
TOL_LIVE = 0.05  # every 100-ms window from 100 ms after a live change within +-5 of the new share
GROUPS = {"fitted": "fitted", "held_out": "held out", "held-out": "held out"}
# Named sets of scenarios, for one short device call each.
# issue34: what issue 34 missed, on the code that answers it (about 5 minutes): short kernels at
# 25/50/75, the conv net at 75, constant-data and JAX matmuls at 25/50/75, the random matmul at 50
# beside them (the model's fitted case), and the launch overhead.
# issue42: what issue 42 found at 75 % and in a live change (about 4.5 minutes): short kernels at
# 50/75, the conv net, the random and constant-data matmuls and JAX at 75, the live change 25 -> 75
# and back, and the launch overhead.
NAMED = {"issue34": ("small_25", "small_50", "small_75", "conv_75", "matmul_const_25", "matmul_const_50",
                     "matmul_const_75", "jax_25", "jax_50", "jax_75", "matmul_50", "overhead"),
         "issue42": ("small_50", "small_75", "conv_75", "matmul_75", "matmul_const_75", "jax_75", "live_25_75",
                     "live_75_25", "overhead")}

# worker flag <- orchestrator argument, per workload
SIZE_FLAGS = {
    "matmul": (("--matmul-size", "matmul_size"),),
    "matmul_const": (("--matmul-size", "matmul_size"),),
    "matmul_fp32": (("--fp32-size", "fp32_size"),),
    "matmul_fp8": (("--fp8-size", "fp8_size"),),
    "copy": (("--copy-mib", "copy_mib"),),
    "small": (("--small-rows", "small_rows"), ("--small-width", "small_width"), ("--small-layers", "small_layers")),
    "graph": (("--small-rows", "small_rows"), ("--small-width", "small_width"), ("--small-layers", "small_layers")),
    "conv": (("--conv-batch", "conv_batch"), ("--conv-channels", "conv_channels"), ("--conv-size", "conv_size"),
             ("--conv-blocks", "conv_blocks")),
    "attention": (("--attn-batch", "attn_batch"), ("--attn-heads", "attn_heads"), ("--attn-seq", "attn_seq"),
                  ("--attn-dim", "attn_dim")),
    "jax": (("--matmul-size", "jax_size"),),
}

# Time estimate, calibrated on the one full run on record: the 18-scenario
# plan of before issue 29 (10-s parts, --warmup 2) took 6 minutes on an
# H100, which these figures give (6.1 min).
STARTUP_EST_S = 4.5  # python + torch import + CUDA context + workload setup, per worker
TEARDOWN_EST_S = 0.5
SETUP_EXTRA_S = {"conv": 2.0, "attention": 0.5, "jax": 4.0}  # cudnn benchmark; jax import + compile (guesses)
BUILD_EST_S = 15.0
OVERHEAD_ROUND_EST_S = 9.0  # one round of three driver_overhead pairs runs (start-up, 1 s warm-up, 0.8 s of pairs)


class ScenarioError(Exception):
    pass


class WorkloadSkipped(Exception):
    """A worker said it cannot run this workload here ({"skipped": why})."""


def say(*parts):
    print(*parts, flush=True)


# ---- plan -------------------------------------------------------------------


def worker(name, workload, share=None, mode="hard", change=None, slice_name=None):
    """One process of a scenario; workers with the same *slice_name* share a slice."""
    return {"name": name, "workload": workload, "share": share, "mode": mode, "change": change,
            "slice": slice_name or name}


def fit_of(workload):
    return WORKLOADS[workload][0] if workload in WORKLOADS else "held out"


def describe(wl, a):
    return {
        "matmul": f"bf16 matmul {a.matmul_size}^3 loop, random data",
        "copy": f"memory-bound copy by a kernel ({a.copy_mib} MiB, bf16 dst = src * 1)",
        "small": f"short kernels, eager ({a.small_layers} x [{a.small_rows}x{a.small_width}] "
                 f"@ [{a.small_width}x{a.small_width}] + relu + bias)",
        "graph": "short kernels, the same step as one CUDA graph replay",
        "matmul_const": f"bf16 matmul {a.matmul_size}^3 loop on torch.ones (constant data)",
        "matmul_fp32": f"fp32 matmul {a.fp32_size}^3 loop, TF32 off",
        "matmul_fp8": f"fp8 (e4m3) torch._scaled_mm {a.fp8_size}^3 loop, bf16 out",
        "conv": f"conv net training step ({a.conv_blocks} x Conv2d+BatchNorm+ReLU, {a.conv_channels} ch, "
                f"batch {a.conv_batch} x {a.conv_size}^2, bf16, channels_last, SGD)",
        "attention": f"scaled_dot_product_attention fwd+bwd (batch {a.attn_batch}, {a.attn_heads} heads, "
                     f"seq {a.attn_seq}, dim {a.attn_dim}, bf16)",
        "jax": f"JAX bf16 jnp matmul {a.jax_size}^3 loop on jnp.ones",
    }[wl]


def build_plan(a):
    """Every scenario, in order; --only then keeps some (select())."""
    S = a.seconds
    plan = []

    def add(name, title, check, workers=None, seconds=S, kind="workers", **extra):
        fit = fit_of(extra.get("workload"))
        plan.append(dict(name=name, title=title, check=check, kind=kind, seconds=seconds,
                         workers=workers or [], fit=fit, **extra))

    def workload_rows(wl):
        what = describe(wl, a)
        add(f"baseline_{wl}", f"{what}, no preload", "baseline", [worker("A", wl)], workload=wl)
        for p in SHARES:
            add(f"{wl}_{p}", f"{wl} at {p} % (hard), alone", "alone", [worker("A", wl, p)],
                workload=wl, share=p, busy_1s=TOL_BUSY_1S if wl == "matmul" else None)

    for wl in FITTED:
        workload_rows(wl)
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
    for old, new in ((25, 75), (75, 25)):
        add(f"live_{old}_{new}", f"matmul at {old} % (hard), set_sm_share(..., {new}) at t = {a.change_at:g} s",
            "live", [worker("A", "matmul", old, "hard", change=(a.change_at, new))],
            seconds=a.live_seconds, workload="matmul", new_share=new, band=TOL_LIVE)
    for wl in HELD_OUT:
        workload_rows(wl)
    add("overhead", "cuLaunchKernel CPU time the hook adds (bench/driver_overhead.c pairs)", "overhead",
        kind="overhead", workload=LAUNCH)
    add("baseline_matmul_end", "matmul baseline again, for the drift over the run", "drift",
        [worker("A", "matmul")], workload="matmul")
    return select(plan, a.only)


def select(plan, only):
    """The scenarios --only names: exact names, name prefixes, or the groups
    'fitted' / 'held_out'; each kept row brings its workload's baseline."""
    if not only:
        return plan
    wanted = [s.strip() for s in only.split(",") if s.strip()]
    names = [s["name"] for s in plan]
    unknown = [w for w in wanted
               if w not in GROUPS and w not in NAMED and not any(n == w or n.startswith(w) for n in names)]
    if unknown:
        raise SystemExit(f"--only: no scenario named {', '.join(unknown)}; have the groups "
                         f"{', '.join(sorted(set(GROUPS) - {'held-out'}) + sorted(NAMED))} and {', '.join(names)}")
    keep = {n for w in wanted for n in NAMED.get(w, ())}
    for s in plan:
        for w in wanted:
            if w in NAMED:
                continue
            if (w in GROUPS and s["fit"] == GROUPS[w]) or s["name"] == w or s["name"].startswith(w):
                keep.add(s["name"])
    for s in plan:  # a fraction needs the baseline of its workload
        if s["name"] in keep and s["check"] not in ("baseline", "overhead"):
            keep.add(f"baseline_{s['workload']}")
    return [s for s in plan if s["name"] in keep]


def scenario_estimate_s(s, a):
    if s["kind"] == "overhead":
        return a.overhead_cap + OVERHEAD_ROUND_EST_S
    start = STARTUP_EST_S + SETUP_EXTRA_S.get(s["workload"], 0.0)
    delay = a.pair_delay if len(s["workers"]) > 1 else 0.3
    return start + a.warmup + delay + s["seconds"] + TEARDOWN_EST_S


def estimate_s(plan, a):
    """Seconds for *plan*: an upper bound where the launch rounds run to their
    cap and every workload runs (a skipped one takes only its start-up)."""
    return BUILD_EST_S + sum(scenario_estimate_s(s, a) for s in plan)


def short_target(share, u):
    """Fraction of its own unthrottled pace a slice keeps at a *share*
    (percent) of GPU time when alone it kept the GPU busy *u* (0..1) of the
    time: min(1, s/u), what a share promises at least; None when u is
    unknown."""
    if u is None or u <= 0:
        return None
    return min(1.0, share / 100.0 / u)


def alone_target_text(scn, u=None, u_known=True):
    """The target of a lone slice's row: busy time min(s, u) +-3, pace never
    below min(1, s/u) of alone - 5 (every 1 s - 10); with u once its baseline
    told it (u_known False: taken as 100 % for compute- or memory-bound work
    without NVML)."""
    p = scn["share"]
    if u is None:
        text = (f"busy min({p} %, u) +-{round(TOL * 100)}; pace >= min(1, {p}/u) of alone "
                f"-{round(TOL_PACE * 100)}, every 1 s -{round(TOL_PACE_1S * 100)}")
    else:
        told = f"u = {100 * u:.0f} % busy alone" if u_known else "u taken as 100 %: no NVML figure"
        text = (f"busy {100 * min(p / 100, u):.0f} % +-{round(TOL * 100)}; pace >= {100 * short_target(p, u):.0f} % "
                f"of alone -{round(TOL_PACE * 100)}, every 1 s -{round(TOL_PACE_1S * 100)} ({told})")
    if scn.get("busy_1s") is not None:
        text += f"; busy every 1 s +-{round(scn['busy_1s'] * 100)}"
    return text


def planned_target(s):
    """The target as the plan states it before anything ran."""
    c = s["check"]
    if c == "baseline":
        return "reference (short kernels: also u, its NVML busy share)" if WORKLOADS[s["workload"]][1] == "short" \
            else "reference"
    if c == "alone":
        return alone_target_text(s)
    if c == "quad":
        return f"{s['share']} % +-{round(s['tol'] * 100)} (slice total)"
    if c == "pair":
        return " / ".join(f"{w['share']} %" for w in s["workers"]) + f" +-{round(s['tol'] * 100)} each"
    if c == "elastic_alone":
        return f">= {round(s['floor'] * 100)} % of baseline"
    if c == "pair_elastic":
        return " / ".join(f">= {w['share']} %" for w in s["workers"]) + f" (-{round(s['tol'] * 100)})"
    if c == "live":
        return (f"every 100-ms window from 100 ms after the change: busy {s['new_share']} % "
                f"+-{round(s['band'] * 100)} (throughput less the clock's part)")
    if c == "overhead":
        return " / ".join(t for _m, t, _l in OVERHEAD_TARGETS) + ": the upper end of each 95 % CI"
    return "drift (info)"


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
    script = WORKER_JAX if w["workload"] == "jax" else WORKER
    cmd = [a.python, str(script), "--workload", w["workload"], "--seconds", f"{scn['seconds']:g}",
           "--window", f"{a.window:g}", "--warmup", f"{a.warmup:g}",
           "--ready-file", f"{sdir}/{w['name']}.ready", "--start-file", f"{sdir}/start",
           "--label", f"{scn['name']}/{w['name']}"]
    for flag, attr in SIZE_FLAGS[w["workload"]]:
        cmd += [flag, str(getattr(a, attr))]
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


def overhead_command(a):
    return [str(OVERHEAD_BIN), "pairs", str(a.overhead_pairs), str(a.overhead_block), f"{a.overhead_warmup:g}"]


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



def skipped_reason(path):
    """The reason in a worker's {"skipped": ...} line, or None."""
    try:
        doc = last_json(Path(path).read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return doc.get("skipped") if isinstance(doc, dict) else None


def run_workers(scn, tmp, a):
    """Run a scenario's workers; returns ({worker name: its JSON}, T0)."""
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
                    why = skipped_reason(sdir / f"{w['name']}.out")
                    if why:
                        raise WorkloadSkipped(why)
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
            if results[w["name"]].get("skipped"):
                raise WorkloadSkipped(results[w["name"]]["skipped"])
            results[w["name"]]["stderr_tail"] = tail(sdir / (w["name"] + ".err"), 600)
            if w["share"] is not None:
                results[w["name"]]["slice_after"] = slice_snapshot(sdir / f"{w['name']}.slice")
        if tracer:
            tracer.stop.set()
            tracer.join(timeout=5)
            scn["trace"] = tracer.summary(t0, scn["seconds"])
            say(f"  trace: {json.dumps(scn['trace'])}")
        return results, t0
    finally:
        for _w, p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()


def run_overhead(a, tmp):
    """Rounds of the three modes (order rotated each round; each process warms
    itself up) until bench/sm_overhead.py's rule stops them."""
    if not OVERHEAD_BIN.exists():
        raise ScenarioError(f"{OVERHEAD_BIN.relative_to(REPO)} was not built")
    odir = Path(tmp) / "overhead"
    odir.mkdir(parents=True)
    names = [m for m, _ in overhead_modes(odir, 0)]
    samples = {m: [] for m in names}
    t_start = time.monotonic()
    r = 0
    while True:
        modes = overhead_modes(odir, r)
        k = (r + 1) % len(modes)
        for mode, extra in modes[k:] + modes[:k]:  # rotate the order each round
            env = clean_env()
            env.update(extra)
            p = subprocess.run(overhead_command(a), env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise ScenarioError(f"driver_overhead ({mode}) failed (rc {p.returncode}): "
                                    f"{(p.stderr or p.stdout)[-800:].strip()}")
            sample = last_json(p.stdout)
            sample["stderr_tail"] = p.stderr[-300:]
            samples[mode].append(sample)
        r += 1
        stop, why = sm_overhead.stop_rule(samples, a.rounds, time.monotonic() - t_start, a.overhead_cap)
        if stop:
            break
    return overhead_result(samples, why, a, time.monotonic() - t_start)


def overhead_result(samples, stopped, a, elapsed_s):
    """What the rows and the JSON need from the rounds' samples."""
    cis = sm_overhead.intervals(samples)
    modes = sm_overhead.MODES
    return {"rounds": min(len(samples[m]) for m in modes), "min_rounds": a.rounds,
            "pairs": a.overhead_pairs, "block": a.overhead_block,
            "cap_s": a.overhead_cap, "elapsed_s": round(elapsed_s, 1), "stopped": stopped,
            # ns per launch: the driver's own entry point, and the hook's, medians over rounds
            "driver_launch_ns": {m: statistics.median(x["real_ns"] for x in samples[m]) for m in modes},
            "hooked_launch_ns": {m: statistics.median(x["hooked_ns"] for x in samples[m]) for m in modes},
            "added_ns": {m: sm_overhead.added(samples, m) for m in modes},
            "ci_ns": {m: list(ci) if ci else None for m, ci in cis.items()},
            "instructions_added": {m: sm_overhead.instructions(samples, m) for m in modes},
            "pinned": all(x.get("pinned") for m in modes for x in samples[m]),
            "samples": samples}


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


def not_run_row(scn, why):
    r = row(scn["name"], planned_target(scn), f"not run: {why}", "", None, "")
    r["not_run"] = why
    return r


def need_baseline(scn, baselines):
    base = baselines.get(scn["workload"])
    if base is None:
        raise ScenarioError(f"no baseline for {scn['workload']} in this run (baseline scenario failed or skipped)")
    return base


def busy_stats(tel, t0, seconds, step=0.1):
    """From NVML's samples of the measured part [t0, t0 + seconds]: the GPU's
    busy share (utilization.gpu) over it, the mean of every 1-s window
    (stepping *step*), and the mean SM clock; None where NVML said nothing."""
    util = [(x["t"], x["util_gpu"]) for x in tel if x.get("util_gpu") is not None]
    busy = statistics.mean(v for _t, v in util) / 100.0 if util else None
    windows = []
    for i in range(int(round(max(0.0, seconds - 1.0) / step)) + 1):
        lo = t0 + i * step
        inside = [v for t, v in util if lo <= t < lo + 1.0]
        if inside:
            windows.append(statistics.mean(inside) / 100.0)
    mhz = [x["sm_mhz"] for x in tel if x.get("sm_mhz") is not None]
    return busy, windows, (statistics.mean(mhz) if mhz else None)


def analyze_alone(scn, res, base, tel, t0):
    """A slice alone at a hard share: its busy time against min(s, u) +-3
    (NVML's utilization; the random-data matmul also in every 1-s window),
    its pace never below min(1, s/u) of alone - 5 and in any 1-s window - 10,
    and what it got beyond its busy time, beside the SM clock's rise over
    its baseline's: a GPU that clocks higher under a share than at full load
    gives that to the slice, and the row is met on busy time."""
    st = fraction_stats(res, base)
    share = scn["share"] / 100
    short = WORKLOADS[scn["workload"]][1] == "short"
    u = base.get("util_alone")
    u_known = u is not None
    if u is None and not short:
        u = 1.0  # compute- or memory-bound work keeps the GPU busy by itself
    busy, busy_1s, mhz = busy_stats(tel, t0, scn["seconds"])
    base_mhz = base.get("sm_mhz_alone")
    clock = mhz / base_mhz if mhz and base_mhz else None
    due = short_target(scn["share"], u)
    values = dict(st, busy=busy, busy_sliding_1s=[round(b, 4) for b in busy_1s], target_fraction=due,
                  util_alone=u, sm_mhz=mhz, sm_mhz_alone=base_mhz, clock_ratio=clock)
    measured = f"busy {pct(busy)}, pace {pct(st['fraction'])}"
    one_s = f"pace {span(st['min_1s'], st['max_1s'])}"
    if busy_1s:
        one_s += f"; busy {span(min(busy_1s), max(busy_1s))}"
    if due is None:
        return row(scn["name"], f"min(1, {scn['share']}/u) of alone: unknown u (no NVML utilization in its "
                   "baseline), not judged", measured, one_s, None, "", **values)
    busy_target = min(share, u)
    pace_ok = st["fraction"] >= due - TOL_PACE - 1e-9 and \
        (st["min_1s"] is None or st["min_1s"] >= due - TOL_PACE_1S - 1e-9)
    busy_ok = None if busy is None else abs(busy - busy_target) <= TOL + 1e-9
    busy_1s_ok = None
    if scn.get("busy_1s") is not None and busy_1s:
        busy_1s_ok = all(abs(b - busy_target) <= scn["busy_1s"] + 1e-9 for b in busy_1s)
    notes = []
    if busy is None:
        notes.append("busy time unknown (no NVML utilization): judged on pace alone")
    else:
        gained = st["fraction"] - busy / u
        part = f"pace {pct(st['fraction'])} against busy {pct(busy)} of u {pct(u)}: {100 * gained:+.1f} points"
        if clock is not None:
            part += f"; SM clock {mhz:.0f} MHz against {base_mhz:.0f} alone (x{clock:.2f})"
            if gained > TOL_PACE and clock > 1.01:
                part += ": the clock's part, the slice's to keep"
        notes.append(part)
    if res.get("sync_wait_frac") is not None:
        notes.append(f"sync wait {res['sync_wait_frac']:.2f}")
    values.update(busy_target=busy_target, pace_ok=pace_ok, busy_ok=busy_ok, busy_1s_ok=busy_1s_ok)
    result = pace_ok and busy_ok is not False and busy_1s_ok is not False
    return row(scn["name"], alone_target_text(scn, u, u_known), measured, one_s, result, "; ".join(notes), **values)


def analyze(scn, data, baselines, tel=None, t0=0.0):
    """The rows of one scenario; TEL: NVML's samples of its measured part,
    which starts at T0 (time.monotonic())."""
    c = scn["check"]
    name = scn["name"]
    if c in ("baseline", "drift"):
        res = data["A"]
        own = sliding_1s(res, res["units_per_s"])
        note = f"sync wait {res['sync_wait_frac']:.2f} of batch time" if res.get("sync_wait_frac") is not None else ""
        if c == "baseline" and scn["workload"] != "matmul" and (res.get("sync_wait_frac") or 0) < 0.1:
            note += "; little sync wait: the GPU may be waiting on the CPU (launch-bound), so a share " \
                    "would not map to the same fraction of throughput"
        if c == "baseline" and WORKLOADS[scn["workload"]][1] == "short":
            u = res.get("util_alone")
            note += f"; u = {pct(u)} busy alone (NVML)" if u is not None else "; u unknown (no NVML utilization)"
        measured = f"{res['units_per_s']:.1f} units/s, {res['tflops']:.0f} TFLOP/s"
        if c == "baseline":
            return [row(name, "reference", measured, "own mean: " + span(min(own, default=None), max(own, default=None)),
                        None, note, units_per_s=res["units_per_s"], util_alone=res.get("util_alone"))]
        start = baselines.get("matmul")
        if start is None:
            return [row(name, "drift (info)", measured, "", None, "no first matmul baseline")]
        drift = res["units_per_s"] / start["units_per_s"]
        note = "fractions above use the first baseline" + (
            "; it drifted more than 2 %, read the fractions with that uncertainty" if abs(drift - 1) > 0.02 else "")
        return [row(name, "drift (info)", f"end/start = {drift:.3f}", measured, None, note, drift=drift)]

    base = need_baseline(scn, baselines)
    if c == "alone":
        return [analyze_alone(scn, data["A"], base, tel or [], t0)]

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
        return analyze_live(scn, data["A"], base, tel or [], t0)
    raise ScenarioError(f"unknown check {c}")


def window_clocks(tel, t0, n, w):
    """The mean SM clock in each of N report windows of W s from T0: a window
    without a sample of its own takes the nearest sample's; None without any."""
    clocked = [(x["t"], x["sm_mhz"]) for x in tel if x.get("sm_mhz") is not None]
    out = []
    for i in range(n):
        lo, hi = t0 + i * w, t0 + (i + 1) * w
        inside = [m for t, m in clocked if lo <= t < hi]
        if inside:
            out.append(statistics.mean(inside))
        else:
            out.append(min(clocked, key=lambda c: abs(c[0] - (lo + hi) / 2))[1] if clocked else None)
    return out


def analyze_live(scn, res, base, tel, t0):
    """A live change of the share: every report window (100 ms) from 100 ms
    after the change must keep the GPU busy the new share +-5. A window's
    busy time is its throughput over the baseline's, less the clock's part:
    times the baseline's SM clock over the window's (NVML). The time until
    every later 1-s window of throughput is within the band is given too."""
    ch = res.get("change")
    if not ch:
        raise ScenarioError("the worker never made the change (measured part too short?)")
    if ch.get("error"):
        raise ScenarioError(f"set_sm_share failed in the worker: {ch['error']}")
    bu = base["units_per_s"]
    w = res["window"]
    win = res["window_units"]
    sl = sliding_1s(res, bu)
    tc = ch["at"]
    new = scn["new_share"] / 100
    band = scn["band"]
    rate = [u / w / bu for u in win]
    base_mhz = base.get("sm_mhz_alone")
    clocks = window_clocks(tel, t0, len(win), w)
    busy = [r * base_mhz / c if base_mhz and c else r for r, c in zip(rate, clocks)]
    judged_from = int(math.ceil((tc + 0.1) / w - 1e-9))  # first window starting 100 ms after the change
    outside = [i for i in range(judged_from, len(busy)) if abs(busy[i] - new) > band + 1e-9]
    first_after = int(math.ceil(tc / w - 1e-9))
    settle_idx = None
    for j in range(len(sl) - 1, first_after - 1, -1):  # smallest j from which every 1-s window is in band
        if abs(sl[j] - new) <= band + 1e-9:
            settle_idx = j
        else:
            break
    before_n = int(tc / w)
    before = sum(rate[:before_n]) / before_n if before_n else None
    after = sum(busy[judged_from:]) / len(busy[judged_from:]) if busy[judged_from:] else None
    from_window = int(tc / w)
    extra = {"change_at_s": tc, "change_call_s": ch["done"] - ch["at"], "before_fraction": before,
             "rate_100ms_after": [round(x, 4) for x in rate[from_window:]],
             "busy_100ms_after": [round(x, 4) for x in busy[from_window:]], "rate_100ms_after_from_s": from_window * w,
             "judged_from_s": judged_from * w, "outside_s": [round(i * w - tc, 2) for i in outside],
             "clock_known": bool(base_mhz and any(clocks)), "sliding_1s": [round(x, 4) for x in sl],
             "settle_s": None if settle_idx is None else settle_idx * w - tc}
    target = planned_target(scn)
    if judged_from >= len(busy):
        return [row(scn["name"], target, "not enough time after the change", "", False, "", **extra)]
    judged = len(busy) - judged_from
    measured = "every window within" if not outside else \
        f"{len(outside)} of {judged} windows outside (first {outside[0] * w - tc:+.1f} s after)"
    settle = "never" if settle_idx is None else f"{settle_idx * w - tc:.2f} s"
    how = "busy = throughput x SM clock alone / the window's" if extra["clock_known"] else \
        "no SM clock: busy taken as the throughput"
    note = (f"{how}; every later 1 s of throughput within the band after {settle}; first 100-ms windows after "
            f"the change, busy (throughput): " + " ".join(f"{100 * b:.0f} ({100 * r:.0f})" for b, r in
                                                           zip(busy[from_window:from_window + 15],
                                                               rate[from_window:from_window + 15])))
    return [row(scn["name"], target, measured, f"before {pct(before)}, after {pct(after)} busy", not outside, note,
                **extra)]


OVERHEAD_TARGETS = (("preload", "<= 50 ns added (no SM limit)", 50),
                    ("preload_sm90", "<= 200 ns added (SM limit 90, not binding)", 200))


def _interval_text(ci, rounds, pairs):
    if ci is None:
        return f"no interval ({rounds} rounds)"
    return (f"95 % CI {ci[0]:+.1f} .. {ci[1]:+.1f} ns (width {ci[1] - ci[0]:.1f}), "
            f"{rounds} rounds of {pairs} pairs")


def overhead_rows(o):
    """One row per compared mode: the median of its in-process pairs, the
    interval and the rounds; met when the upper end of the 95 % interval is
    within the target (after at least the minimum rounds), however wide.
    Then the method's noise (no preload), beside them."""
    enough = o["rounds"] >= o["min_rounds"]
    out = []
    for mode, target, limit in OVERHEAD_TARGETS:
        added = o["added_ns"][mode]
        ci = o["ci_ns"].get(mode)
        met = enough and ci is not None and ci[1] <= limit
        note = ""
        if not enough or ci is None:
            note = f"fewer than {o['min_rounds']} rounds ({o['stopped']}): no interval to judge, not met; "
        elif not met:
            note = f"the interval reaches {ci[1]:+.1f} ns, past {limit} ns: not met; "
        note += (f"per launch, medians over {o['rounds']} rounds: the driver's entry point "
                 f"{o['driver_launch_ns'][mode]:.1f} ns, the hook {o['hooked_launch_ns'][mode]:.1f} ns")
        ins = o["instructions_added"].get(mode)
        note += f"; {ins:+.0f} instructions a launch" if ins is not None else "; instructions: not countable here"
        out.append(row(f"launch overhead, {mode}", f"{target}: the upper end of its 95 % CI", f"{added:+.1f} ns",
                       _interval_text(ci, o["rounds"], o["pairs"]), met, note,
                       added_ns=added, ci_ns=ci, rounds=o["rounds"],
                       ci_width_ns=None if ci is None else ci[1] - ci[0]))
    ci = o["ci_ns"].get("none")
    out.append(row("launch overhead, none (the method's noise)", "about 0 (info: the driver on both sides)",
                   f"{o['added_ns']['none']:+.1f} ns", _interval_text(ci, o["rounds"], o["pairs"]), None,
                   f"no preload: the driver's entry point {o['driver_launch_ns']['none']:.1f} ns per launch",
                   added_ns=o["added_ns"]["none"], ci_ns=ci))
    return out


# ---- reporting ----------------------------------------------------------------------


def verdict(r):
    if r.get("error"):
        return "ERROR"
    if r.get("not_run"):
        return "NOT RUN"
    return {True: "PASS", False: "FAIL", None: "-"}[r["result"]]


def row_line(r):
    s = f"   {r['scenario']} [{r.get('fit', '?')}]: {r['measured']}"
    if r["one_s"]:
        s += f" [1 s: {r['one_s']}]" if "sliding_1s" in r["values"] else f" [{r['one_s']}]"
    s += f"  target {r['target']}: {verdict(r)}"
    if r["note"]:
        s += f"  ({r['note']})"
    return s


def gpu_cell(t):
    if not t:
        return ""
    def f(v, unit):
        return "?" if v is None else f"{v:.0f}{unit}"
    return (f"{f(t['sm_mhz'], ' MHz')}, {f(t['power_w'], ' W')}, cap {f(t['sw_power_cap_pct'], ' %')}, "
            f"slowdown {f(t['slowdown_pct'], ' %')}, util {f(t['util_gpu'], ' %')}")


def markdown(rows):
    lines = ["| scenario | fit | target | measured | 1-s windows / detail | result "
             "| GPU (mean SM clock, power, % samples SW power cap, % thermal/HW slowdown, util) | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [r["scenario"], r.get("fit", ""), r["target"], r["measured"], r["one_s"], verdict(r),
                 gpu_cell(r.get("telemetry")), r["note"]]
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
         "library": str(LIB_IN_USE[0]), "fitted": list(FITTED), "held_out": list(HELD_OUT),
         "overhead": {"min_rounds": a.rounds, "cap_s": a.overhead_cap, "pairs": a.overhead_pairs,
                      "block": a.overhead_block, "warmup_s": a.overhead_warmup,
                      "ci_width_ns": sm_overhead.CI_WIDTH_NS}}
    for key, cmd in (("git", ["git", "rev-parse", "HEAD"]), ("git_dirty", ["git", "status", "--porcelain"]),
                     ("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                              "power.limit", "--format=csv,noheader"])):
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
    p.add_argument("--quick", action="store_true", help="4-s measured parts, launch rounds capped at 60 s")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"JSON results (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--dry-run", action="store_true", help="print the plan, commands and time estimate, start nothing")
    p.add_argument("--only", help="comma-separated scenario names or prefixes, the groups 'fitted' and "
                                  "'held_out', or the sets 'issue34' and 'issue42' (each kept row brings its "
                                  "baseline)")
    p.add_argument("--seconds", type=float, help="measured part per scenario (default 6, quick 4)")
    p.add_argument("--live-seconds", type=float, help="measured part of the live change (default 12, quick 6)")
    p.add_argument("--change-at", type=float, help="when the live change is made (default 4, quick 2)")
    p.add_argument("--window", type=float, default=0.1, help="report window of the workers, s")
    p.add_argument("--warmup", type=float, default=1.0, help="worker warm-up before ready, s")
    p.add_argument("--pair-delay", type=float, default=1.0,
                   help="seconds between both workers being ready and the start of the measured part")
    p.add_argument("--rounds", type=int, default=5,
                   help="launch overhead: rounds before the interval rule may stop them (default 5)")
    p.add_argument("--overhead-cap", type=float,
                   help="launch overhead: seconds after which no round starts (default 120, quick 60)")
    p.add_argument("--overhead-pairs", type=int, default=200, help="launch overhead: pairs of blocks per process")
    p.add_argument("--overhead-block", type=int, default=500, help="launch overhead: launches per block")
    p.add_argument("--overhead-warmup", type=float, default=1.0,
                   help="launch overhead: seconds each process launches before its pairs count")
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the bf16 matmuls (matmul, matmul_const)")
    p.add_argument("--fp32-size", type=int, default=4096, help="n of the fp32 matmul")
    p.add_argument("--fp8-size", type=int, default=8192, help="n of the fp8 matmul")
    p.add_argument("--jax-size", type=int, default=8192, help="n of the JAX matmul")
    p.add_argument("--copy-mib", type=int, default=1024, help="MiB per copy")
    p.add_argument("--small-rows", type=int, default=8192)
    p.add_argument("--small-width", type=int, default=512)
    p.add_argument("--small-layers", type=int, default=8)
    p.add_argument("--conv-batch", type=int, default=128)
    p.add_argument("--conv-channels", type=int, default=128)
    p.add_argument("--conv-size", type=int, default=56)
    p.add_argument("--conv-blocks", type=int, default=4)
    p.add_argument("--attn-batch", type=int, default=8)
    p.add_argument("--attn-heads", type=int, default=16)
    p.add_argument("--attn-seq", type=int, default=4096)
    p.add_argument("--attn-dim", type=int, default=128)
    p.add_argument("--ready-timeout", type=float, default=150.0, help="s for workers to import torch and warm up")
    p.add_argument("--finish-timeout", type=float, default=30.0, help="s allowed past the measured part")
    p.add_argument("--python", default=sys.executable, help="interpreter for the workers (needs torch; jax for jax)")
    p.add_argument("--keep-tmp", action="store_true", help="keep slice files and worker logs")
    p.add_argument("--lib", help="the preload library for throttled workers (default: this checkout's build), "
                                 "to compare two builds")
    p.add_argument("--fast-telemetry", default="",
                   help="comma-separated workloads whose scenarios NVML is read for every "
                        f"{sm_telemetry.FAST_PERIOD:g} s instead of 0.1 s (the SM clock and instant power "
                        "inside and outside the windows)")
    p.add_argument("--trace", action="store_true",
                   help="record each slice's open window and NVML view, and NVML's per-process time, "
                        "every 50 ms; print their means per scenario")
    a = p.parse_args(argv)
    if a.lib:
        LIB_IN_USE[0] = Path(a.lib).resolve()
    q = a.quick
    a.seconds = a.seconds if a.seconds is not None else (4.0 if q else 6.0)
    a.live_seconds = a.live_seconds if a.live_seconds is not None else (6.0 if q else 12.0)
    a.change_at = a.change_at if a.change_at is not None else (2.0 if q else 4.0)
    a.overhead_cap = a.overhead_cap if a.overhead_cap is not None else (60.0 if q else 120.0)
    if a.change_at + 1.5 > a.live_seconds:
        p.error("--change-at must leave at least 1.5 s of the live scenario after the change")
    if a.seconds < 1.0:
        p.error("--seconds must be at least 1 (1-s windows)")
    if a.rounds < 2:
        p.error("--rounds must be at least 2 (an interval needs two rounds)")
    return a


def minutes(s):
    return f"{s / 60:.1f} min"


def dry_run(plan, a):
    say("# build (from the repository root)")
    for c in BUILD_CMDS:
        say("  " + " ".join(shlex.quote(x) for x in c))
    say(f"\n# scenarios, one after the other ($TMP is a fresh temporary directory; results -> {a.out})")
    dropped = ", ".join(sorted(LIMIT_VARS) + [p + "*" for p in LIMIT_PREFIXES])
    say(f"# every command runs in the repository root with the caller's environment minus {dropped};")
    say(f"# plus PYTHONPATH={REPO} PYTHONUNBUFFERED=1 and the variables shown")
    say(f"# fitted workloads (the model was fitted or tuned on them): {', '.join(FITTED)}; "
        f"held out: {', '.join(HELD_OUT)}, and the launch loop of the overhead rows")
    for s in plan:
        say(f"\n[{s['name']}] ({s['fit']}) {s['title']}")
        say(f"  target: {planned_target(s)}; about {scenario_estimate_s(s, a):.0f} s")
        if s["kind"] == "overhead":
            say(f"  rounds, order rotated each round, until both 95 % intervals of the median in-process "
                f"difference are < {sm_overhead.CI_WIDTH_NS:g} ns wide (at least {a.rounds} rounds) "
                f"or {a.overhead_cap:g} s have passed; each round:")
            for mode, env in overhead_modes("$TMP/overhead", "R"):
                cmd = overhead_command(a)
                cmd[0] = str(OVERHEAD_BIN.relative_to(REPO))
                say(f"    {mode}: " + show_cmd(cmd, env))
            continue
        if len(s["workers"]) > 1:
            say(f"  {len(s['workers'])} workers started together; one measured part of {s['seconds']:g} s "
                f"starting {a.pair_delay:g} s after all are warm")
        else:
            say(f"  1 worker; measured part {s['seconds']:g} s starting 0.3 s after it is warm")
        for w in s["workers"]:
            cmd, env = worker_command(s, w, f"$TMP/{s['name']}", a)
            say(f"  {w['name']}: " + show_cmd(cmd, env))
    say("\n# plan")
    say("| scenario | fit | target |")
    say("| --- | --- | --- |")
    for s in plan:
        say(f"| {s['name']} | {s['fit']} | {planned_target(s)} |")
    say(f"\n# about {minutes(estimate_s(plan, a))} in all ({len(plan)} scenarios; an upper bound where the "
        f"launch rounds run to their {a.overhead_cap:g} s cap and every workload runs; a skipped one takes "
        f"only its start-up)")
    if not a.only:
        full = build_plan(a)
        for g in ("fitted", "held_out"):
            part = select(full, g)
            say(f"#   --only {g}: about {minutes(estimate_s(part, a))} ({len(part)} scenarios)")


def run_scenario(s, a, tmp, state, telemetry):
    """Run one scenario; returns (record for the JSON, rows, whether it failed
    to run). *state* carries the baselines and the skipped workloads."""
    t_start = time.monotonic()
    measured = None
    rec = {"name": s["name"], "title": s["title"], "check": s["check"], "fit": s["fit"],
           "workload": s.get("workload")}
    failed = False
    wl = s.get("workload")
    if telemetry is not None:
        fast = wl in {w.strip() for w in a.fast_telemetry.split(",")}
        telemetry.period = sm_telemetry.FAST_PERIOD if fast else getattr(telemetry, "base_period", 0.1)
    try:
        if wl in state["skipped"]:
            rows = [not_run_row(s, state["skipped"][wl])]
            rec["not_run"] = state["skipped"][wl]
        elif s["kind"] == "overhead":
            rec["overhead"] = run_overhead(a, tmp)
            measured = (t_start, time.monotonic())
            rows = overhead_rows(rec["overhead"])
        else:
            if s["check"] not in ("baseline", "drift") and wl not in state["baselines"]:
                raise ScenarioError(f"skipped: no {wl} baseline in this run")
            data, t0 = run_workers(s, tmp, a)
            measured = (t0, t0 + s["seconds"])
            tel = telemetry.samples(*measured) if telemetry else []
            if s["check"] == "baseline":
                summ = sm_telemetry.summary(tel)
                util = summ.get("util_gpu") if summ else None
                data["A"]["util_alone"] = util / 100.0 if util is not None else None
                data["A"]["sm_mhz_alone"] = summ.get("sm_mhz") if summ else None
                state["baselines"][wl] = data["A"]
            rec["workers"] = data
            if "trace" in s:
                rec["trace"] = s["trace"]
            rows = analyze(s, data, state["baselines"], tel, t0)
        rec["ok"] = True
    except WorkloadSkipped as e:
        state["skipped"][wl] = str(e)
        rec["ok"] = True
        rec["not_run"] = str(e)
        rows = [not_run_row(s, str(e))]
    except Exception as e:  # report and go on
        failed = True
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"
        rows = [row(s["name"], "-", "did not run", "", None, rec["error"][:300])]
        rows[0]["error"] = True
    t_end = time.monotonic()
    summ = None
    if telemetry is not None:
        rec["telemetry"] = {"series": sm_telemetry.series(telemetry.samples(t_start, t_end), t_start)}
        if measured:
            summ = sm_telemetry.summary(telemetry.samples(*measured))
            rec["telemetry"].update(measured_from_s=round(measured[0] - t_start, 3),
                                    measured_to_s=round(measured[1] - t_start, 3), summary=summ)
    for r in rows:
        r["fit"] = s["fit"]
        r["telemetry"] = summ
    rec["rows"] = rows
    rec["wall_s"] = round(t_end - t_start, 2)
    return rec, rows, failed


def main():
    a = parse_args()
    plan = build_plan(a)
    if a.dry_run:
        dry_run(plan, a)
        return 0

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    say(f"sm_share: {len(plan)} scenarios, about {minutes(estimate_s(plan, a))}; JSON -> {a.out}")
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

    doc = {"meta": meta(a), "plan": [{"scenario": s["name"], "fit": s["fit"], "target": planned_target(s)}
                                     for s in plan], "scenarios": [], "rows": []}
    say(f"GPU: {doc['meta'].get('gpu')}  git {doc['meta'].get('git')}")
    telemetry = sm_telemetry.Telemetry()
    note = telemetry.open()
    if note:
        say(f"note: {note}; the rows still run, the short-kernel rows' u is unknown and they are not judged")
        telemetry = None
    else:
        say(f"telemetry: every {telemetry.period:g} s from {telemetry.device}")
    doc["meta"]["telemetry"] = note or telemetry.device
    tmp = tempfile.mkdtemp(prefix="hami-sm-bench-")
    state = {"baselines": {}, "skipped": {}}
    failed = 0
    t_all = time.monotonic()
    try:
        for s in plan:
            say(f"\n== {s['name']} ({s['fit']}): {s['title']}")
            rec, rows, bad = run_scenario(s, a, tmp, state, telemetry)
            failed += bad
            doc["scenarios"].append(rec)
            doc["rows"].extend(rows)
            for r in rows:
                say(row_line(r))
            if rows and rows[0].get("telemetry"):
                say(f"   GPU: {sm_telemetry.text(rows[0]['telemetry'])}")
            say(f"   ({rec['wall_s']:.1f} s; {time.monotonic() - t_all:.0f} s so far)")
            write_json(a.out, doc)
    except KeyboardInterrupt as e:
        say(f"\ninterrupted ({e}); results so far:")
        doc["interrupted"] = str(e)
        failed += 1
    finally:
        if telemetry is not None:
            telemetry.close()
        doc["wall_s"] = round(time.monotonic() - t_all, 1)
        write_json(a.out, doc)
        if a.keep_tmp:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    passed = sum(1 for r in doc["rows"] if r["result"] is True)
    judged = sum(1 for r in doc["rows"] if r["result"] is not None)
    held = [r for r in doc["rows"] if r.get("fit") == "held out" and r["result"] is not None]
    say("\n" + markdown(doc["rows"]))
    workers = [w for sc in doc["scenarios"] for w in (sc.get("workers") or {}).values()]
    gpus = sorted({str(w.get("device")) for w in workers})
    torch_v = sorted({str(w.get("torch")) for w in workers if w.get("torch")})
    say(f"\n{passed}/{judged} targets met ({sum(1 for r in held if r['result'])}/{len(held)} of the held-out rows); "
        f"{failed} scenario(s) did not run; not run here: "
        f"{'; '.join(f'{k} ({v})' for k, v in state['skipped'].items()) or 'none'}; "
        f"device {', '.join(gpus) or 'none'}, torch {', '.join(torch_v) or 'none'}; {doc['wall_s']:.0f} s; "
        f"JSON: {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
