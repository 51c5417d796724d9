"""cudrive on the real driver under the preload library: the same scripts as on the sim."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_helpers import REPO, GiB

pytestmark = pytest.mark.gpu

CUDRIVE = REPO / "native" / "build" / "tools" / "cudrive"


def run(args, env):
    proc = subprocess.run([str(CUDRIVE), *args.split()], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    print(f"cudrive {args}\n{proc.stdout}\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0
    return records, proc.stderr


@pytest.mark.parametrize("resolve", ["dlsym", "next", "default", "procaddr", "procaddr1"])
def test_fill_stops_at_the_cap(preload_lib, slice_env, resolve):
    records, stderr = run(f"resolve {resolve} init ctx 0 meminfo totalmem 0 fill 256m", slice_env(limit="4g"))
    by_op = {r["op"]: r for r in records}
    assert by_op["meminfo"]["total"] == 4 * GiB
    assert by_op["totalmem"]["total"] == 4 * GiB
    fill = by_op["fill"]
    print(f"{resolve}: filled {fill['bytes'] / GiB:.2f} GiB in {fill['count']} chunks; last {fill['last_err']}")
    assert fill["last_rc"] == 2 and fill["bytes"] <= 4 * GiB
    assert "out of memory" in stderr


def test_hooks_resolve_to_the_library(preload_lib, slice_env):
    records, _ = run("getproc cuMemAlloc 12000 0 dlsym cuMemAlloc_v2 getproc cuMemAllocAsync 12000 2 "
                     "dlsym cuMemAllocAsync_ptsz getproc cuDriverGetVersion 12000 0 dlsym cuGetExportTable",
                     slice_env(limit="4g"))
    libs = [Path(r.get("lib", "")).name for r in records]
    assert records[0]["ptr"] == records[1]["ptr"] and records[2]["ptr"] == records[3]["ptr"]
    assert libs[:4] == ["libvgpu.so"] * 4
    assert libs[4].startswith("libcuda.so") and libs[5].startswith("libcuda.so")


def test_null_output_pointers_on_the_real_driver(preload_lib, slice_env):
    whats = ["alloc", "pitch", "managed", "async", "poolalloc", "meminfo", "totalmem", "memcreate", "array",
             "array3d", "mipmap", "getproc"]
    script = "init ctx 0 " + " ".join(f"null {w}" for w in whats) + " nvml null nvmlmem echo end"
    records, _ = run(script, slice_env(limit="4g"))
    nulls = {r["what"]: r for r in records if r["op"] == "null"}
    assert records[-1]["op"] == "echo"
    wrong = {w: (r["rc"], r.get("err")) for w, r in nulls.items() if w != "nvmlmem" and r["rc"] != 1}
    assert not wrong, f"NULL outputs not answered CUDA_ERROR_INVALID_VALUE: {wrong}"
    assert nulls["nvmlmem"]["rc"] == 2 and nulls["nvmlmem"]["rc_v2"] == 2


FRAMEWORKS = {
    "torch": "import torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
             "print('torch', float((x @ x).item()))",
    "torch-async": "import torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
                   "print('torch', float(x.sum().item()))",
    "cupy": "import cupy; print('cupy', float(cupy.ones(1 << 20).sum()))",
    "jax": "import jax.numpy as jnp; print('jax', float(jnp.ones(1 << 20).sum()))",
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_frameworks_meet_no_entry_point_the_library_refuses(slice_env, framework):
    """Every entry point a framework asks cuGetProcAddress for is one the library
    knows (an unknown one for a hooked name is refused, and would break it)."""
    extra = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"} if framework == "torch-async" else {}
    if framework == "jax":
        extra = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    proc = subprocess.run([sys.executable, "-c", FRAMEWORKS[framework]], env=slice_env(limit="4g", **extra),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "does not know" not in proc.stderr
