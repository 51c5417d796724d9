"""Shared test set-up: the native build, the GPU marker, the simulated GPU."""

import os
import subprocess
from pathlib import Path

import pytest

from hami_jupyter import native

REPO = Path(__file__).resolve().parent.parent
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def _why_no_gpu():
    """None when tests marked ``gpu`` may run, else the reason they may not."""
    if not NVIDIA_DRIVER.exists():
        return f"needs a real NVIDIA GPU ({NVIDIA_DRIVER} is absent)"
    if os.environ.get("HAMI_TEST_GPU") != "1":
        return "needs a real NVIDIA GPU and HAMI_TEST_GPU=1"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_no_gpu()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def native_build():
    """Build native/ (library, simulated GPU, tools) once per session; fail loudly if make does."""
    cmd = ["make", "-C", str(REPO / "native"), "-j", str(os.cpu_count() or 1), "all", "sim", "tools"]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}",
            pytrace=False,
        )
    return REPO / "native" / "build"


@pytest.fixture
def sim_gpu(native_build, tmp_path):
    """Environment for a subprocess that sees a fresh simulated GPU of its own."""
    yield native.sim_env(tmp_path / "sim-state")
