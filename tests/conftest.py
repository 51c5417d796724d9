"""Shared test set-up: tests marked ``gpu`` run only beside a real NVIDIA driver, and no
test may leave a process behind (leftovers.py: the session fails naming the test files).

The native build and the simulated GPU fixtures live in tests/native/conftest.py."""

import os
from pathlib import Path

import pytest
from leftovers import pytest_runtest_protocol, pytest_sessionfinish, pytest_sessionstart  # noqa: F401 (hooks)

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
