"""Two real GPUs (issue 18): per-GPU caps with PyTorch, CUDA_VISIBLE_DEVICES=1,0
in %hami status, and a two-process DDP training over NCCL under caps.

Skipped unless a real driver is there (tests/conftest.py) and torch sees at
least two GPUs. Every process starts with NVLink multicast off (NCCL NVLS,
PyTorch symmetric memory, NVSHMEM): the caps do not cover multicast objects.
The simulated-GPU half of the issue is tests/native/test_multi_gpu.py.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_helpers import GiB, MiB, parse_result, run_in_kernel

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parent / "two_gpu_scenarios.py"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
DDP_TIMEOUT = 300     # a healthy run takes seconds; past this it is a hang
FAIL_TIMEOUT = 180    # a cap too small must fail well before this


def _plain_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HAMI_", "CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM", "LD_PRELOAD"))}
    env.update(NO_MULTICAST)
    return env


@pytest.fixture(scope="module")
def physical_uuids():
    """The GPUs' UUIDs in NVML (physical) order; skips with fewer than two."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           env=_plain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    count = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
    if count < 2:
        pytest.skip(f"needs two GPUs that torch sees (found {count}; {probe.stderr.strip()[-200:]})")
    res = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], env=_plain_env(),
                         stdout=subprocess.PIPE, text=True, timeout=60, check=True)
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


@pytest.fixture
def env2(slice_env, physical_uuids):
    """slice_env with multicast off everywhere."""

    def make(**extra):
        return slice_env(**{**NO_MULTICAST, **extra})

    return make


def _run(env, *args, timeout=300):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    r = parse_result(args[0], proc.stdout, proc.stderr, proc.returncode)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return r


def _uuid(torch_uuid):
    """torch's UUID ("xxxxxxxx-...") in NVML's form ("GPU-xxxxxxxx-...")."""
    return torch_uuid if torch_uuid.startswith("GPU-") else f"GPU-{torch_uuid}"


@pytest.mark.parametrize("cvd", [None, "1,0"])
def test_each_gpu_holds_its_own_cap_with_pytorch(env2, physical_uuids, cvd):
    caps = [2 * GiB, 3 * GiB]
    extra = {"CUDA_VISIBLE_DEVICES": cvd} if cvd else {}
    env = env2(limit="8g", CUDA_DEVICE_MEMORY_LIMIT_0="2g", CUDA_DEVICE_MEMORY_LIMIT_1="3g", **extra)
    r = _run(env, "caps", *caps)
    order = [1, 0] if cvd == "1,0" else [0, 1]
    for dev, (seen, cap) in enumerate(zip(r["devices"], caps)):
        print(f"cuda:{dev}: total {seen['total'] / GiB:.2f} GiB, reached {seen['reached'] / GiB:.2f} GiB")
        assert seen["total"] == cap
        assert seen["oom"] and seen["reached"] <= cap
        assert seen["reached"] >= cap - GiB  # the context and allocator take the rest
        assert _uuid(seen["uuid"]) == physical_uuids[order[dev]]


def test_reordered_kernel_names_the_physical_gpu_in_hami_status(hami_kernel, monkeypatch, physical_uuids):
    """A kernel under CUDA_VISIBLE_DEVICES=1,0 allocates on cuda:0: %hami status
    --json charges physical GPU 1 (by UUID) and nothing on physical GPU 0."""
    for k, v in NO_MULTICAST.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    km, kc = hami_kernel("4g")
    run_in_kernel(kc, "import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0')\n"
                      "torch.cuda.synchronize()")
    status = json.loads(run_in_kernel(kc, "%hami status --json"))
    by_uuid = {g["uuid"]: g for g in status["gpus"]}
    print(f"%hami status gpus: {[(g['uuid'], g['memory_used']) for g in status['gpus']]}")
    assert physical_uuids[1] in by_uuid, status["gpus"]
    assert by_uuid[physical_uuids[1]]["memory_used"] >= GiB
    assert by_uuid.get(physical_uuids[0], {"memory_used": 0})["memory_used"] < 256 * MiB
    # The REST answer is slice_status of the same file (tests/server checks
    # that on the sim); here the file itself, read from outside the kernel.
    from hami_jupyter.slice.status import format_text, slice_status

    outside = slice_status(status["path"])
    assert {g["uuid"] for g in outside["gpus"]} == set(by_uuid)
    assert physical_uuids[1] in format_text(outside)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp(env2, timeout, steps=20, **extra):
    """Start the two ranks in one slice; (exit codes, stdouts, stderrs, seconds).
    A rank still running at *timeout* is killed and the test fails: a hang."""
    port = _free_port()
    procs = []
    start = time.monotonic()
    for rank in (0, 1):
        env = env2(**extra, RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, TORCH_NCCL_ASYNC_ERROR_HANDLING=1, NCCL_DEBUG="WARN")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "ddp", str(steps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    outs = []
    try:
        for p in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            try:
                outs.append(p.communicate(timeout=left))
            except subprocess.TimeoutExpired:
                pytest.fail(f"DDP rank {procs.index(p)} still running after {timeout} s: a hang, "
                            "not a clear failure")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return [p.returncode for p in procs], [o for o, _ in outs], [e for _, e in outs], \
        time.monotonic() - start


def test_ddp_over_nccl_trains_under_per_gpu_caps(env2, physical_uuids):
    rcs, outs, errs, took = _ddp(env2, DDP_TIMEOUT, limit="6g", CUDA_DEVICE_MEMORY_LIMIT_1="5g")
    assert rcs == [0, 0], "\n".join(e[-3000:] for e in errs)
    results = [parse_result(f"ddp rank {i}", outs[i], errs[i], rcs[i]) for i in (0, 1)]
    print(f"DDP: {took:.1f} s; {results}")
    assert [r["total"] for r in results] == [6 * GiB, 5 * GiB]
    assert results[0]["sums"] == results[1]["sums"]  # replicas in step
    assert [_uuid(r["uuid"]) for r in results] == physical_uuids[:2]


def test_ddp_with_a_cap_too_small_for_nccl_buffers_fails_clearly(env2, physical_uuids):
    """NCCL asked for 1.5 GiB buffers in a 1 GiB slice: both ranks end with an
    error that says out of memory, well within the timeout, never a hang.
    (Not 2 GiB: NCCL 2.28 keeps the size in a 32-bit int, and on two H100s
    NCCL_BUFFSIZE=2g became a cuMemCreate of 16777216 TiB, refused at any cap.)"""
    rcs, outs, errs, took = _ddp(env2, FAIL_TIMEOUT, limit="1g", NCCL_BUFFSIZE=str(3 * GiB // 2))
    print(f"DDP with too small a cap: exit codes {rcs} after {took:.1f} s")
    for e in errs:
        print(e[-3000:])
    assert all(rc != 0 for rc in rcs), rcs
    assert any("out of memory" in e.lower() for e in errs), "no rank said it ran out of memory"
    assert any('hami: slice "' in e and "out of memory" in e for e in errs), \
        "the library's line naming the slice and its cap is missing"


TWO_GPU_HOLDER = """
import sys, torch
held = [torch.empty(3 << 30, dtype=torch.uint8, device=f"cuda:{d}") for d in (0, 1)]
for d, t in enumerate(held):
    t[: 64 << 20].fill_(7 + d); t[-(64 << 20):].fill_(11 + d)
torch.cuda.synchronize()
print("held", flush=True)
for line in sys.stdin:
    ok = all(bool((t[: 64 << 20] == 7 + d).all()) and bool((t[-(64 << 20):] == 11 + d).all())
             for d, t in enumerate(held))
    print("intact" if ok else "CHANGED", flush=True)
"""


def _nvml_bytes(pid):
    """``{uuid: bytes}`` NVML lists for process *pid* on each GPU, and each GPU's free bytes."""
    import pynvml

    pynvml.nvmlInit()
    try:
        held, free = {}, {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            held[uuid] = sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                             if p.pid == pid)
            free[uuid] = pynvml.nvmlDeviceGetMemoryInfo(h).free
        return held, free
    finally:
        pynvml.nvmlShutdown()


def test_a_process_on_both_gpus_parks_and_comes_back_intact(env2, physical_uuids, preload_lib, tmp_path):
    """Issue 43: a PyTorch process holding 3 GiB on each GPU is parked (the fast
    park, or the checkpoint when the tests run without it) and resumed at its
    next call: each GPU's memory leaves and comes back (NVML), the data on both
    intact."""
    from gpu_helpers import fast_park_tested

    env = env2(limit="8g")
    proc = subprocess.Popen([sys.executable, "-c", TWO_GPU_HOLDER], env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "held"
        before, free_before = _nvml_bytes(proc.pid)
        print("before:", {u[:12]: round(b / GiB, 2) for u, b in before.items()})
        assert all(before[u] >= 3 * GiB for u in physical_uuids[:2])
        tool = Path(preload_lib).parent / "hami-park"
        park_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
        began = time.monotonic()
        done = subprocess.run([str(tool), "park", env["HAMI_SLICE"], str(proc.pid), "10000", "asked"],
                              env=park_env, capture_output=True, text=True, timeout=300)
        print(f"park: {done.stdout.strip()} in {time.monotonic() - began:.2f} s")
        assert done.stdout.startswith("ok "), done.stdout + done.stderr
        parked, free_parked = _nvml_bytes(proc.pid)
        print("parked:", {u[:12]: round(b / GiB, 2) for u, b in parked.items()})
        for u in physical_uuids[:2]:
            assert parked[u] < before[u] - 2 * GiB  # the 3 GiB left each GPU (the context may stay)
            assert free_parked[u] > free_before[u] + 2 * GiB
        began = time.monotonic()
        proc.stdin.write("check\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "intact"
        print(f"resumed and checked in {time.monotonic() - began:.2f} s "
              f"({'fast park' if fast_park_tested() else 'checkpoint'})")
        after, _ = _nvml_bytes(proc.pid)
        for u in physical_uuids[:2]:
            assert after[u] >= 3 * GiB  # back on each GPU
    finally:
        proc.kill()
        proc.wait(30)
