#!/usr/bin/env python3
"""The true-up under allocation churn, on a real GPU with PyTorch.

    python3 bench/true_up_churn.py            # this checkout's native/build/libvgpu.so
    LIB=path/to/libvgpu.so TAG=old python3 bench/true_up_churn.py

A PyTorch child under the preload library (8 GiB slice) runs a matmul and a
convolution, then for 8 s allocates 256 + 96 + 32 MiB and frees them with
torch.cuda.empty_cache() each step (real cudaMalloc / cudaFree as fast as it
can), then idles 6 s. Every 0.25 s the parent reads the child's slot (its
charge and driver_bytes, the part the true-up found to be the driver's own)
and NVML's figure for the child. It prints the last row and writes every row
to $OUT (or /tmp)/TAG_true_up_churn.json. What to look for: driver_bytes
should only move towards the driver's real figure, and at the end the slot
should equal NVML.
"""
import json, os, subprocess, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from hami_jupyter.slice.file import read_snapshot
import pynvml
CHILD = r'''
import torch, time, sys
x = torch.randn(4096, 4096, device="cuda"); (x @ x).sum().item()
conv = torch.nn.Conv2d(64, 64, 3).cuda(); conv(torch.randn(8, 64, 64, 64, device="cuda")).sum().item()
print("ready", flush=True)
end = time.time() + 8
n = 0
while time.time() < end:
    ts = [torch.empty(int(s), dtype=torch.uint8, device="cuda") for s in (256 << 20, 96 << 20, 32 << 20)]
    del ts; torch.cuda.empty_cache(); n += 1
print("churned", n, flush=True)
time.sleep(6)
print("done", flush=True)
'''
d = tempfile.mkdtemp()
env = dict(os.environ, LD_PRELOAD=os.path.abspath(os.environ.get("LIB", "native/build/libvgpu.so")),
           HAMI_SLICE=os.path.join(d, "churn.slice"), CUDA_DEVICE_MEMORY_LIMIT="8g")
p = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
assert p.stdout.readline().strip() == "ready"
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
def nvml_used():
    return sum(q.usedGpuMemory for q in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if q.pid == p.pid)
def slot():
    return [s for s in read_snapshot(env["HAMI_SLICE"]).slots if s.pid == p.pid][0]
out = {"driver_during_churn": [], "rows": []}
t0 = time.time()
while p.poll() is None and time.time() - t0 < 30:
    try:
        s = slot()
    except (IndexError, OSError):
        break
    out["rows"].append([round(time.time() - t0, 2), s.memory_used[0], s.driver_bytes[0], nvml_used()])
    time.sleep(0.25)
MiB = 1 << 20
last = out["rows"][-1] if out["rows"] else None
out["last"] = last and {"slot_MiB": last[1] / MiB, "driver_MiB": last[2] / MiB, "nvml_MiB": last[3] / MiB}
out["max_driver_MiB_first_9s"] = max((r[2] for r in out["rows"] if r[0] < 9), default=0) / MiB
out["child_out"] = p.stdout.read() if p.poll() is not None else "still running"
print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("TAG", "x") + "_true_up_churn.json"), "w"))
