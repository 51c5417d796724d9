"""GPU tests: the preload library on the real driver, each scenario in a subprocess.

Every test here carries the ``gpu`` marker and is skipped without a real
NVIDIA driver (tests/conftest.py decides). A scenario runs as
``python3 tests/gpu/gpu_scenarios.py NAME`` under LD_PRELOAD, so a crash cannot
take pytest down; it prints its figures and a last line ``RESULT {json}``,
which the test prints again so the figures land in the log.
"""

import os
import subprocess
import sys

import pytest

from gpu_helpers import REPO, SCENARIOS, fast_park_env, parse_result


@pytest.fixture(scope="session")
def preload_lib():
    cmd = ["make", "-C", str(REPO / "native"), "-j", str(os.cpu_count() or 1), "all", "tools"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if res.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-6000:]}", pytrace=False)
    from hami_jupyter import native

    return native.library_path()


@pytest.fixture
def slice_env(preload_lib, tmp_path):
    """``slice_env(limit="4g", name="gpu-slice", **extra)``: env of a process in that slice."""

    def make(limit="4g", name="gpu-slice", **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HAMI_", "CUDA_DEVICE_MEMORY", "LIBCUDA_", "PYTORCH_CUDA_ALLOC"))}
        env["LD_PRELOAD"] = str(preload_lib)
        env["HAMI_SLICE"] = str(tmp_path / name)
        env["CUDA_DEVICE_MEMORY_LIMIT"] = str(limit)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(fast_park_env())
        env.update({k: str(v) for k, v in extra.items()})
        return env

    return make


@pytest.fixture
def scenario():
    """``scenario(name, env, *args, timeout=300)`` -> the RESULT dict (exit code 0 required)."""

    def run(name, env, *args, timeout=300):
        proc = subprocess.run([sys.executable, str(SCENARIOS), name, *map(str, args)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
        result = parse_result(name, proc.stdout, proc.stderr, proc.returncode)
        assert proc.returncode == 0, f"scenario {name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        return result

    return run


@pytest.fixture
def hami_kernel(tmp_path, monkeypatch, preload_lib):
    """``hami_kernel(memory="4g")`` -> ``(km, kc)``: a hami-python3 kernel started by a
    real KernelManager through the provisioner, in a fresh slice with that cap."""
    jupyter_client = pytest.importorskip("jupyter_client")
    from importlib.metadata import entry_points

    names = [ep.name for ep in entry_points(group="jupyter_client.kernel_provisioners")]
    assert "hami-provisioner" in names, "hami-jupyter is not installed (no hami-provisioner entry point)"
    for name in list(os.environ):
        if name.startswith(("HAMI_", "CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM")):
            monkeypatch.delenv(name)
    for name, value in fast_park_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("JUPYTER_PATH", str(REPO / "share" / "jupyter"))
    monkeypatch.setenv("HAMI_SLICE_ROOT", str(tmp_path))
    started = []

    def start(memory="4g"):
        monkeypatch.setenv("HAMI_MEMORY_LIMIT", memory)
        km = jupyter_client.KernelManager(kernel_name="hami-python3")
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        started.append((km, kc))
        kc.wait_for_ready(timeout=120)
        return km, kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

