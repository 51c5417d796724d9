"""Parking on a real GPU: both paths side by side, the link's own speed, bit for bit.

    python3 bench/parking.py [--sizes 8,16] [--repeats 2] [--paths fast,checkpoint]
                             [--cycles 10] [--only link,sizes,training,others] [--out FILE]

One GPU (cuda:0), PyTorch and pynvml needed, run as root or as the user of the
processes it parks. It builds native/ (libvgpu.so, hami-park), then:

0. link: the ceiling. Without the preload library, one process copies 1 GiB
   between a pinned host buffer and device memory (cudaMemcpyAsync from
   pinned memory, each way, several times): the host link's own GiB/s.
1. sizes: a process under the preload library (its own slice, no cap) holds
   N GiB of random bf16 data, made chunk by chunk from known seeds. For each
   path, in turn (fast, checkpoint, fast, ...): HAMI_FAST_PARK=1 (the process
   parks itself, docs/parking.md) or 0 (the driver's checkpoint). The park
   (hami_jupyter.slice.parking.park_kernel, as the server and the agent park)
   is timed; while parked, the bytes NVML still lists for the process and the
   driver's word on it (running: it parked itself; checkpointed: the
   checkpoint did) are read; then its own next CUDA call (a synchronize)
   brings it back, timed; then every chunk is made again from its seed and
   compared, bit for bit.
2. training: a small model trained twice with the same seeds and
   deterministic algorithms beside ~7 GiB of ballast, once straight and once
   parked and resumed between steps (--cycles times), on the first path
   given; the losses must match bit for bit.
3. others: while a 16 GiB process is parked (first path), a process of
   another slice allocates what the GPU then has free (more than it could
   before), frees it, and the parked one resumes intact.

Prints every figure and markdown tables, and writes JSON (--out, default
native/build/bench/parking.json). Every wait is bounded. The targets (issue
40) are in docs/benchmarks.md.
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
GiB = 1 << 30
PATHS = {"fast": "1", "checkpoint": "0"}

WORKER = r'''
import os, sys, time, json
import torch
mode, gib = sys.argv[1], float(sys.argv[2])
torch.manual_seed(1234)
CHUNK = 1 << 28  # bf16 elements: 512 MiB
def say(**kw):
    print(json.dumps(kw), flush=True)
def chunk_of(i, n):
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    return torch.randn(n, dtype=torch.bfloat16, device="cuda", generator=g)
if mode == "hold":
    data = torch.empty(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    for i, part in enumerate(data.split(CHUNK)):
        part.copy_(chunk_of(i, part.numel()))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # what is parked is the data and the context, no cached blocks
    say(ready=True)
    for line in sys.stdin:
        t0 = time.monotonic()
        torch.cuda.synchronize()  # the first CUDA call since the park: it brings the memory back
        resumed = time.monotonic() - t0
        same = all(torch.equal(part, chunk_of(i, part.numel())) for i, part in enumerate(data.split(CHUNK)))
        torch.cuda.empty_cache()
        say(resumed=resumed, same=same)
elif mode == "train":
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    ballast = torch.empty(int(gib * (1 << 30)) - (1 << 30), dtype=torch.uint8, device="cuda")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(99)
    x = torch.randn(8192, 1024, device="cuda", generator=g)
    y = torch.randint(0, 10, (8192,), device="cuda", generator=g)
    say(ready=True)
    for line in sys.stdin:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        say(loss=loss.item().hex())
elif mode == "grab":
    free, total = torch.cuda.mem_get_info()
    want = int(float(sys.argv[2]) * (1 << 30))
    try:
        t = torch.empty(want, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        say(grabbed=want, free_before=free)
    except torch.cuda.OutOfMemoryError:
        say(grabbed=0, free_before=free)
elif mode == "link":
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    rows = {}
    for name, dst, src in (("to_host", host, dev), ("to_device", dev, host)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(int(sys.argv[2])):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        rows[name] = 1.0 / sorted(times)[len(times) // 2]  # 1 GiB over the median time
    say(**{f"{k}_gib_s": round(v, 2) for k, v in rows.items()})
'''


def build():
    subprocess.run(["make", "-C", str(REPO / "native"), "-j", str(os.cpu_count() or 2), "all"],
                   check=True, stdout=subprocess.DEVNULL)


def base_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE_"))}


class Worker:
    """A python worker under the preload library, in a slice of its own."""

    def __init__(self, tmp, name, mode, gib, path="fast", limit=None):
        from hami_jupyter import native

        self.slice = Path(tmp) / f"{name}.slice"
        env = base_env()
        env.update(LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(self.slice),
                   HAMI_KERNEL_ID=f"bench-{name}", PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8",
                   HAMI_FAST_PARK=PATHS[path])
        if limit:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = limit
        self.kernel_id = env["HAMI_KERNEL_ID"]
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, mode, str(gib)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self, timeout=600):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.kernel_id} ended (exit {self.proc.poll()})")
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker {self.kernel_id}: no answer within {timeout} s")

    def send(self, line="go"):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def nvml_bytes(pid):
    """Device bytes NVML shows for *pid* on GPU 0 (0 when it lists it not)."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == pid:
            return p.usedGpuMemory or 0
    return 0


def park(worker):
    from hami_jupyter.slice import parking

    t0 = time.monotonic()
    result = parking.park_kernel(worker.slice, worker.kernel_id, lock_timeout_ms=30000)
    return time.monotonic() - t0, result.bytes


def driver_state(pid):
    from hami_jupyter.slice import parking

    try:
        return parking.checkpoint_state(pid)
    except parking.ParkError as e:
        return f"unknown ({e})"


def link(args, tmp, out):
    env = base_env()
    done = subprocess.run([sys.executable, "-c", WORKER, "link", "8"], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the link worker failed: {done.stderr[-2000:]}")
    out["link"] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({"link": out["link"]}), flush=True)


def sizes(args, tmp, out):
    rows = []
    for gib in args.sizes:
        for rep in range(args.repeats):
            order = args.paths if rep % 2 == 0 else list(reversed(args.paths))
            for path in order:
                w = Worker(tmp, f"size{gib}-{rep}-{path}", "hold", gib, path)
                try:
                    ready = w.read()
                    assert ready.get("ready"), ready
                    seconds, moved = park(w)
                    parked_nvml = nvml_bytes(w.proc.pid)
                    state = driver_state(w.proc.pid)
                    w.send()  # the worker's own CUDA call brings it back
                    answer = w.read()
                    row = {"gib": gib, "repeat": rep, "path": path, "park_s": round(seconds, 3),
                           "resume_s": round(answer["resumed"], 3), "moved_bytes": moved,
                           "nvml_bytes_parked": parked_nvml, "driver_state_parked": state,
                           "intact": answer["same"]}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                finally:
                    w.close()
    out["sizes"] = rows


def training(args, tmp, out):
    path = args.paths[0]

    def run(parked):
        w = Worker(tmp, f"train-{'parked' if parked else 'straight'}", "train", 8, path)
        losses, park_s, resume_s = [], [], []
        try:
            assert w.read().get("ready")
            for step in range(args.cycles + 5):
                if parked and 0 < step <= args.cycles:
                    seconds, _ = park(w)
                    park_s.append(seconds)
                t0 = time.monotonic()
                w.send()
                losses.append(w.read()["loss"])
                if parked and 0 < step <= args.cycles:
                    resume_s.append(time.monotonic() - t0)
        finally:
            w.close()
        return losses, park_s, resume_s

    straight, _, _ = run(False)
    parked, park_s, resume_s = run(True)
    out["training"] = {"path": path, "steps": len(straight), "cycles": args.cycles,
                       "identical": straight == parked, "losses_straight": straight, "losses_parked": parked,
                       "park_s_median": statistics.median(park_s) if park_s else None,
                       "resume_s_median": statistics.median(resume_s) if resume_s else None}
    print(json.dumps({k: v for k, v in out["training"].items() if not k.startswith("losses")}), flush=True)


def others(args, tmp, out):
    import torch

    path = args.paths[0]
    total = torch.cuda.get_device_properties(0).total_memory
    hold_gib = min(16, total / GiB / 2)
    w = Worker(tmp, "parked16", "hold", hold_gib, path)
    try:
        assert w.read().get("ready")
        want = (total / GiB) - hold_gib * 0.5  # more than fits while the holder is on the GPU
        before = Worker(tmp, "grab-before", "grab", want)
        grabbed_before = before.read()
        before.close()
        park(w)
        after = Worker(tmp, "grab-after", "grab", want)
        grabbed_after = after.read()
        after.close()
        w.send()
        resumed = w.read()
    finally:
        w.close()
    out["others"] = {"path": path, "holder_gib": hold_gib, "wanted_gib": round(want, 2),
                     "grabbed_while_running": grabbed_before["grabbed"],
                     "grabbed_while_parked": grabbed_after["grabbed"],
                     "free_while_parked": grabbed_after["free_before"],
                     "holder_intact_after": resumed["same"]}
    print(json.dumps(out["others"]), flush=True)


def tables(out):
    lines = []
    if "link" in out:
        lines += ["| the link, pinned host memory (median of 8 x 1 GiB) | to host GiB/s | to device GiB/s |",
                  "| --- | ---: | ---: |",
                  f"| cudaMemcpyAsync, no preload | {out['link'].get('to_host_gib_s')} | "
                  f"{out['link'].get('to_device_gib_s')} |", ""]
    if out.get("sizes"):
        lines += ["| size | path | park s (median) | resume s (median) | park GiB/s | resume GiB/s | "
                  "NVML while parked (max) | driver says | intact |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for gib in sorted({r["gib"] for r in out["sizes"]}):
            for path in dict.fromkeys(r["path"] for r in out["sizes"]):
                rows = [r for r in out["sizes"] if r["gib"] == gib and r["path"] == path]
                if not rows:
                    continue
                p = statistics.median(r["park_s"] for r in rows)
                q = statistics.median(r["resume_s"] for r in rows)
                lines.append(f"| {gib} GiB | {path} | {p:.2f} | {q:.2f} | {gib / p:.1f} | {gib / q:.1f} | "
                             f"{max(r['nvml_bytes_parked'] for r in rows) / 2**20:.0f} MiB | "
                             f"{', '.join(sorted({r['driver_state_parked'] for r in rows}))} | "
                             f"{all(r['intact'] for r in rows)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16", type=lambda s: [float(x) for x in s.split(",")])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--paths", default="fast,checkpoint", type=lambda s: s.split(","))
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--only", default="link,sizes,training,others")
    ap.add_argument("--out", type=Path, default=REPO / "native" / "build" / "bench" / "parking.json")
    args = ap.parse_args()
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        ap.error(f"--paths: {', '.join(unknown)} (fast, checkpoint)")
    build()
    import torch

    out = {"gpu": torch.cuda.get_device_name(0), "paths": args.paths}
    with tempfile.TemporaryDirectory(prefix="hami-park-bench-") as tmp:
        for part in args.only.split(","):
            {"link": link, "sizes": sizes, "training": training, "others": others}[part](args, tmp, out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(tables(out))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
