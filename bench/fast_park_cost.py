"""What backing allocations for the fast park costs (HAMI_FAST_PARK=1 against 0).

    python3 bench/fast_park_cost.py [--rounds 5] [--churn-seconds 2] [--out FILE]

One GPU, PyTorch needed. It builds native/ (libvgpu.so, cudrive), then runs,
each under the preload library in a slice of its own, HAMI_FAST_PARK=0 and 1
in alternation (so that drift in the machine's speed hits both alike):

1. alloc+free: cudrive's `churn SIZE SECONDS` (cuMemAlloc_v2 and cuMemFree_v2
   of one size, over and over) at 2 MiB, 64 MiB and 1 GiB: microseconds per
   pair. With the fast park each is a reserved range, a physical allocation,
   a mapping and its access (and the reverse): more driver calls than one
   cuMemAlloc. PyTorch's caching allocator keeps its blocks, so a program
   rarely pays it per tensor.
2. PyTorch start: a fresh process's import of torch, its first CUDA call
   (the context) and a model moved to the GPU, in that process's own clock
   (the import, which no allocation touches, apart), and the process's wall
   time from start to exit.
3. a training step: bench/torch_step.py (a small conv net, batch 128), the
   median step time of several timed windows.

Targets (issue 40): the step within +1 %, the start within +5 %.
Prints JSON lines, a markdown table, and writes JSON (--out, default
native/build/bench/fast_park_cost.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MODES = ("0", "1")
CHURN_SIZES = ("2m", "64m", "1g")

START = r'''
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
x = torch.randn(64, 4096, device="cuda")
model(x).sum().item()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "context_s": t2 - t1, "model_s": t3 - t2, "cuda_s": t3 - t1}))
'''


def build():
    subprocess.run(["make", "-C", str(REPO / "native"), "-j", str(os.cpu_count() or 2), "all", "tools"],
                   check=True, stdout=subprocess.DEVNULL)


def env_for(mode, tmp, name):
    from hami_jupyter import native

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE_"))}
    env.update(LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(Path(tmp) / f"{name}-{mode}.slice"),
               HAMI_FAST_PARK=mode, PYTHONUNBUFFERED="1")
    return env


def last_json(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def churn(args, tmp, out):
    cudrive = REPO / "native" / "build" / "tools" / "cudrive"
    rows = []
    for rnd in range(args.rounds):
        for size in CHURN_SIZES:
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                done = subprocess.run([str(cudrive), "init", "ctx", "0", "churn", size, str(args.churn_seconds)],
                                      env=env_for(mode, tmp, "churn"), capture_output=True, text=True, timeout=300)
                rec = [json.loads(line) for line in done.stdout.splitlines() if '"op":"churn"' in line][-1]
                if rec["rc"] != 0 or rec["other"] or not rec["ok"]:
                    raise RuntimeError(f"churn {size} with HAMI_FAST_PARK={mode}: {rec}\n{done.stderr[-2000:]}")
                row = {"round": rnd, "size": size, "fast_park": mode,
                       "us_per_pair": round(rec["elapsed_ns"] / rec["loops"] / 1e3, 2), "loops": rec["loops"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    out["churn"] = rows


def start(args, tmp, out):
    rows = []
    for rnd in range(args.rounds):
        for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", START], env=env_for(mode, tmp, "start"),
                                  capture_output=True, text=True, timeout=300)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"PyTorch start with HAMI_FAST_PARK={mode}: {done.stderr[-2000:]}")
            row = dict(last_json(done.stdout), round=rnd, fast_park=mode, wall_s=wall)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out["start"] = rows


def step(args, tmp, out):
    rows = []
    for rnd in range(args.rounds):
        for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
            done = subprocess.run([sys.executable, str(REPO / "bench" / "torch_step.py")],
                                  env=env_for(mode, tmp, "step"), capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"torch_step with HAMI_FAST_PARK={mode}: {done.stderr[-2000:]}")
            row = dict(last_json(done.stdout), round=rnd, fast_park=mode)
            print(json.dumps({k: v for k, v in row.items() if k != "windows_ms"}), flush=True)
            rows.append(row)
    out["step"] = rows


def summary(out):
    """Medians per mode and the change in percent, one row per figure."""
    rows = []

    def add(what, values0, values1):
        a, b = statistics.median(values0), statistics.median(values1)
        rows.append({"what": what, "fast_park_0": a, "fast_park_1": b, "change_percent": (b - a) / a * 100})

    for size in CHURN_SIZES:
        picks = [r for r in out.get("churn", []) if r["size"] == size]
        if picks:
            add(f"cuMemAlloc+cuMemFree of {size}, us per pair",
                [r["us_per_pair"] for r in picks if r["fast_park"] == "0"],
                [r["us_per_pair"] for r in picks if r["fast_park"] == "1"])
    for key, what in (("cuda_s", "PyTorch start: context + model on the GPU, s"),
                      ("wall_s", "PyTorch start: the whole process, s")):
        picks = out.get("start", [])
        if picks:
            add(what, [r[key] for r in picks if r["fast_park"] == "0"], [r[key] for r in picks if r["fast_park"] == "1"])
    picks = out.get("step", [])
    if picks:
        add("training step (bench/torch_step.py), ms", [r["step_ms"] for r in picks if r["fast_park"] == "0"],
            [r["step_ms"] for r in picks if r["fast_park"] == "1"])
    return rows


def table(rows):
    lines = ["| figure | HAMI_FAST_PARK=0 (median) | =1 (median) | change |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['what']} | {r['fast_park_0']:.4g} | {r['fast_park_1']:.4g} | "
                     f"{r['change_percent']:+.1f} % |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--churn-seconds", type=float, default=2.0)
    ap.add_argument("--only", default="churn,start,step")
    ap.add_argument("--out", type=Path, default=REPO / "native" / "build" / "bench" / "fast_park_cost.json")
    args = ap.parse_args()
    build()
    out = {}
    with tempfile.TemporaryDirectory(prefix="hami-fast-park-cost-") as tmp:
        for part in args.only.split(","):
            {"churn": churn, "start": start, "step": step}[part](args, tmp, out)
            out["summary"] = summary(out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(table(out["summary"]))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
