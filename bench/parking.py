"""Parking on a real GPU: seconds per GiB, bit-for-bit training, the freed memory in use.

    python3 bench/parking.py [--sizes 1,8,32] [--repeats 3] [--cycles 20] [--out FILE]

One GPU (cuda:0), PyTorch needed, run as root or as the user of the
processes it parks. It builds native/ (libvgpu.so, hami-park), then:

1. sizes: a process under the preload library (its own slice, no cap) holds
   N GiB of random bf16 data; hami-park parks it (lock + checkpoint) and the
   process's own next CUDA call brings it back (its housekeeper reserves,
   restores, unlocks). Per size and repeat: park seconds, resume seconds (from
   the call to its return), bytes NVML shows for the process while parked,
   and whether the data's checksum survived.
2. training: the same small model trained twice with the same seeds and
   deterministic algorithms, once straight and once parked and resumed
   between steps (--cycles times), holding ~8 GiB; the losses must match bit
   for bit.
3. others: while a 16 GiB process is parked, a process of another slice
   allocates what the GPU then has free (more than it could before), frees
   it, and the parked one resumes.

Prints every figure, a markdown table, and writes JSON (--out, default
native/build/bench/parking.json). Every wait is bounded.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GiB = 1 << 30

WORKER = r'''
import os, sys, time, json, hashlib
import torch
mode, gib = sys.argv[1], float(sys.argv[2])
torch.manual_seed(1234)
def say(**kw):
    print(json.dumps(kw), flush=True)
def fingerprint(data):
    """Every byte counted (int64 sums of the int16 view, 256 MiB at a time, so
    no copy of the whole) and a sample hashed."""
    total = sum(int(c.sum(dtype=torch.int64)) for c in data.view(torch.int16).split(1 << 27))
    sample = data.view(torch.uint8)[::4096].cpu().numpy().tobytes()
    return total, hashlib.sha256(sample).hexdigest()
if mode == "hold":
    n = int(gib * (1 << 30) / 2)
    data = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    before = fingerprint(data)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # what is parked is the data and the context, no cached blocks
    say(ready=True)
    for line in sys.stdin:
        t0 = time.monotonic()
        after = fingerprint(data)
        say(resumed=time.monotonic() - t0, same=(after == before))
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
'''


def build():
    subprocess.run(["make", "-C", str(REPO / "native"), "-j", str(os.cpu_count() or 2), "all"],
                   check=True, stdout=subprocess.DEVNULL)


class Worker:
    """A python worker under the preload library, in a slice of its own."""

    def __init__(self, tmp, name, mode, gib, limit=None):
        from hami_jupyter import native

        self.slice = Path(tmp) / f"{name}.slice"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE_"))}
        env.update(LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(self.slice),
                   HAMI_KERNEL_ID=f"bench-{name}", PYTHONUNBUFFERED="1",
                   CUBLAS_WORKSPACE_CONFIG=":4096:8")
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


def sizes(args, tmp, out):
    rows = []
    for gib in args.sizes:
        for rep in range(args.repeats):
            w = Worker(tmp, f"size{gib}-{rep}", "hold", gib)
            try:
                ready = w.read()
                assert ready.get("ready"), ready
                seconds, moved = park(w)
                parked_nvml = nvml_bytes(w.proc.pid)
                t0 = time.monotonic()
                w.send()  # the worker's own CUDA calls bring it back
                answer = w.read()
                resume_s = time.monotonic() - t0
                row = {"gib": gib, "repeat": rep, "park_s": round(seconds, 3),
                       "resume_s": round(resume_s, 3), "moved_bytes": moved,
                       "nvml_bytes_parked": parked_nvml, "intact": answer["same"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
            finally:
                w.close()
    out["sizes"] = rows


def training(args, tmp, out):
    def run(parked):
        w = Worker(tmp, f"train-{'parked' if parked else 'straight'}", "train", 8)
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
    out["training"] = {"steps": len(straight), "cycles": args.cycles, "identical": straight == parked,
                       "losses_straight": straight, "losses_parked": parked,
                       "park_s_median": sorted(park_s)[len(park_s) // 2] if park_s else None,
                       "resume_s_median": sorted(resume_s)[len(resume_s) // 2] if resume_s else None}
    print(json.dumps({k: v for k, v in out["training"].items() if not k.startswith("losses")}),
          flush=True)


def others(args, tmp, out):
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    hold_gib = min(16, total / GiB / 2)
    w = Worker(tmp, "parked16", "hold", hold_gib)
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
    out["others"] = {"holder_gib": hold_gib, "wanted_gib": round(want, 2),
                     "grabbed_while_running": grabbed_before["grabbed"],
                     "grabbed_while_parked": grabbed_after["grabbed"],
                     "free_while_parked": grabbed_after["free_before"],
                     "holder_intact_after": resumed["same"]}
    print(json.dumps(out["others"]), flush=True)


def table(out):
    lines = ["| size | park s (median) | resume s (median) | park GiB/s | resume GiB/s | NVML while parked | intact |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for gib in sorted({r["gib"] for r in out.get("sizes", [])}):
        rows = [r for r in out["sizes"] if r["gib"] == gib]
        park = sorted(r["park_s"] for r in rows)[len(rows) // 2]
        resume = sorted(r["resume_s"] for r in rows)[len(rows) // 2]
        lines.append(f"| {gib} GiB | {park:.2f} | {resume:.2f} | {gib / park:.2f} | {gib / resume:.2f} | "
                     f"{max(r['nvml_bytes_parked'] for r in rows)} B | "
                     f"{all(r['intact'] for r in rows)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,8,32", type=lambda s: [float(x) for x in s.split(",")])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--only", default="sizes,training,others")
    ap.add_argument("--out", type=Path, default=REPO / "native" / "build" / "bench" / "parking.json")
    args = ap.parse_args()
    build()
    out = {"gpu": None}
    import torch

    out["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory(prefix="hami-park-bench-") as tmp:
        for part in args.only.split(","):
            {"sizes": sizes, "training": training, "others": others}[part](args, tmp, out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(table(out))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
