"""PyTorch under a 4 GiB slice sees 4 GiB and cannot pass it (real GPU)."""

import subprocess
import sys

import pytest

from gpu_helpers import SCENARIOS, GiB, parse_result

pytestmark = pytest.mark.gpu

LIMIT = 4 * GiB


@pytest.mark.parametrize("alloc_conf", [None, "backend:cudaMallocAsync"], ids=["caching", "cudaMallocAsync"])
def test_torch_sees_and_keeps_to_the_slice(scenario, slice_env, alloc_conf):
    extra = {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf} if alloc_conf else {}
    r = scenario("torch_cap", slice_env(limit="4g", **extra), LIMIT)
    print(f"torch ({alloc_conf or 'native'}): total {r['total']} free {r['free']} "
          f"reached {r['reached'] / GiB:.2f} GiB")
    assert r["total"] == LIMIT
    assert r["oom"], "no torch.OutOfMemoryError before twice the limit"
    assert r["reached"] <= LIMIT
    assert r["reached"] >= 2 * GiB  # most of the slice is usable
    assert r["physical_total"] == LIMIT  # get_device_properties sees the slice too


def test_two_processes_share_one_slice(preload_lib, slice_env, scenario):
    env = slice_env(limit="4g", name="shared")
    holder = subprocess.Popen([sys.executable, str(SCENARIOS), "torch_hold", str(3 * GiB // 2)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.startswith("READY"), (line, holder.stderr.read() if holder.poll() is not None else "")
        print(f"holder: {line.strip()}")
        r = scenario("torch_cap", env, LIMIT)
        print(f"second process: total {r['total']} free {r['free']} reached {r['reached'] / GiB:.2f} GiB")
        assert r["total"] == LIMIT
        assert r["free"] <= LIMIT - 3 * GiB // 2
        assert r["oom"] and r["reached"] <= LIMIT - 3 * GiB // 2
    finally:
        out, err = holder.communicate(input="", timeout=120)
    held = parse_result("torch_hold", out, err, holder.returncode)
    assert held["held"] == 3 * GiB // 2


def test_training_loop_runs_unchanged(scenario, slice_env):
    r = scenario("train", slice_env(limit="4g"))
    print(f"training: loss {r['first_loss']} -> {r['last_loss']} in {r['seconds']:.2f} s")
    assert r["last_loss"] < r["first_loss"]
    assert r["max_allocated"] < LIMIT


def test_cublas_and_cudnn_run_unchanged(scenario, slice_env):
    r = scenario("kernels", slice_env(limit="4g"))
    print(f"kernels: {r}")
    assert r["matmul_err"] < 1e-2
    assert r["bf16_rel_err"] < 2e-2
    assert r["conv_err"] < 1e-3
