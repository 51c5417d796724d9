"""The fast park on the real GPU (docs/parking.md, "The fast park").

A PyTorch process under the preload library with HAMI_FAST_PARK=1 parks
itself when hami-park asks: its memory goes to host memory and comes back at
the same addresses, training on bit for bit, with its context alone left on
the GPU. PyTorch's expandable segments (memory the program maps itself) are
checkpointed instead. And memory the library backs answers the driver's
pointer questions as the driver's own allocation does.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from gpu_helpers import GiB

pytestmark = pytest.mark.gpu

WORKER = r'''
import json, sys, torch
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
data = torch.randn(int(float(sys.argv[1]) * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randn(4096, 1024, device="cuda", generator=g)
y = torch.randint(0, 10, (4096,), device="cuda", generator=g)
def digest():  # chunk by chunk: a sum of the whole in int64 would take four times its memory
    return sum(int(c.sum(dtype=torch.int64)) for c in data.view(torch.int16).split(1 << 26))
print(json.dumps({"ready": True, "digest": digest()}), flush=True)
for line in sys.stdin:
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(json.dumps({"loss": loss.item().hex(), "digest": digest()}), flush=True)
'''

ATTRIBUTES = r'''
import ctypes, json, torch
t = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # a 20 MiB segment of PyTorch's
cuda = ctypes.CDLL("libcuda.so.1")
base, size = ctypes.c_uint64(), ctypes.c_size_t()
rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(t.data_ptr()))
start, ipc = ctypes.c_uint64(), ctypes.c_int()
rc2 = cuda.cuPointerGetAttribute(ctypes.byref(start), 11, ctypes.c_uint64(t.data_ptr()))  # RANGE_START_ADDR
rc3 = cuda.cuPointerGetAttribute(ctypes.byref(ipc), 10, ctypes.c_uint64(t.data_ptr()))  # IS_LEGACY_CUDA_IPC_CAPABLE
print(json.dumps({"rc": [rc, rc2, rc3], "offset": t.data_ptr() - base.value, "size": size.value,
                  "start_offset": t.data_ptr() - start.value, "ipc": ipc.value}), flush=True)
'''


def nvml_bytes(pid):
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                   if p.pid == pid)
    finally:
        pynvml.nvmlShutdown()


def start(env, gib):
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(gib)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    first = json.loads(proc.stdout.readline())
    assert first["ready"]
    return proc, first["digest"]


def step(proc):
    proc.stdin.write("step\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def hami_park(env, pid):
    from hami_jupyter import native

    tool_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    done = subprocess.run([str(native.park_tool_path()), "park", env["HAMI_SLICE"], str(pid), "30000", "asked"],
                          env=tool_env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_pytorch_parks_itself_and_trains_on_bit_for_bit(slice_env):
    env = slice_env(limit="40g", HAMI_FAST_PARK="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    straight, _ = start(env, 8)
    losses = [step(straight)["loss"] for _ in range(6)]
    straight.stdin.close()
    straight.wait(60)

    proc, digest = start(env, 8)
    try:
        got = [step(proc)["loss"] for _ in range(3)]
        before = nvml_bytes(proc.pid)
        t0 = time.monotonic()
        answer = hami_park(env, proc.pid)
        parked_s = time.monotonic() - t0
        left = nvml_bytes(proc.pid)
        print(f"park: {answer!r} in {parked_s:.2f} s; NVML {before / GiB:.2f} -> {left / GiB:.2f} GiB")
        assert answer.endswith(" fast"), answer
        assert left < GiB  # the context alone stays
        t0 = time.monotonic()
        out = step(proc)  # its next CUDA call brings it back
        print(f"resume and a step: {time.monotonic() - t0:.2f} s")
        got += [out["loss"]] + [step(proc)["loss"] for _ in range(2)]
        assert out["digest"] == digest  # 8 GiB bit for bit
        assert got == losses
    finally:
        proc.kill()
        proc.wait(60)


def test_expandable_segments_are_checkpointed_with_their_data(slice_env):
    env = slice_env(limit="40g", HAMI_FAST_PARK="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
                    HAMI_LOG_LEVEL="2")
    proc, digest = start(env, 4)
    try:
        answer = hami_park(env, proc.pid)
        print(f"park: {answer!r}")
        assert answer.endswith(" checkpoint"), answer
        assert step(proc)["digest"] == digest
    finally:
        proc.kill()
        proc.wait(60)


def test_backed_memory_answers_as_the_drivers_own(slice_env):
    """cuMemGetAddressRange and the range start of a PyTorch tensor: the same
    with the fast park as without; it is not IPC-capable (the one difference)."""
    answers = {}
    for fast in ("0", "1"):
        env = slice_env(limit="8g", HAMI_FAST_PARK=fast)
        done = subprocess.run([sys.executable, "-c", ATTRIBUTES], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        answers[fast] = json.loads(done.stdout.strip().splitlines()[-1])
    print(answers)
    plain, backed = answers["0"], answers["1"]
    assert plain["rc"] == backed["rc"] == [0, 0, 0]
    for key in ("offset", "size", "start_offset"):
        assert backed[key] == plain[key], key
    assert (plain["ipc"], backed["ipc"]) == (1, 0)
