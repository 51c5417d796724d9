"""Fixtures for the Jupyter-side tests: real kernels on the simulated GPU.

* ``hami_env``: this test's environment for everything Jupyter starts: the
  simulated GPU (one device of 16 GiB, 64 MiB per context) on
  ``LD_LIBRARY_PATH``, a private slice root (``hami_env.root``), a stand-in
  for the hub's root that this process looks at (``hami_env.hub_root``, not
  made), and none of the limit variables of the machine running the tests.
* ``start_kernel(kernel_name="hami-python3", env=None, server_config=None,
  **config)``: a real
  ``KernelManager`` through the real provisioner; returns ``(km, kc)`` and
  shuts every kernel down at teardown.
* ``run_cell(kc, code)``: executes *code* and returns a ``CellResult`` with
  stdout, stderr, the rich outputs and the error, if any.
"""

import os
import re
from types import SimpleNamespace

import pytest
from cell_result import CellResult

from hami_jupyter import native
from hami_jupyter.slice import paths as slice_paths

LIMIT_VARS = re.compile(
    r"(HAMI_(MEMORY_LIMIT|SM_LIMIT|SM_MODE|SLICE|SLICE_ROOT|SLICE_NAME|KERNEL_ID|HUB_SLICE)"
    r"|CUDA_DEVICE_(MEMORY_LIMIT|SM_LIMIT)(_[0-9]+)?|CUDA_DEVICE_MEMORY_SHARED_CACHE"
    r"|JUPYTERHUB_USER|LD_PRELOAD)"
)
KERNEL_TIMEOUT = 60


@pytest.fixture
def hami_env(tmp_path, monkeypatch):
    for name in list(os.environ):
        if LIMIT_VARS.fullmatch(name):
            monkeypatch.delenv(name)
    root = tmp_path / "slices"
    sim = native.sim_env(tmp_path / "sim-state", base={},
                         HAMI_SIM_DEVICES="1", HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m")
    for k, v in sim.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HAMI_SLICE_ROOT", str(root))
    # The hub's slice root, which `hami-jupyter status` lists too: this test's
    # (absent until a test makes it), never the machine's /run/hami-jupyter.
    monkeypatch.setattr(slice_paths, "HUB_ROOT", tmp_path / "hub-root")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return SimpleNamespace(root=root, sim_state=tmp_path / "sim-state", tmp=tmp_path,
                           hub_root=tmp_path / "hub-root")


def run_cell(kc, code, timeout=KERNEL_TIMEOUT):
    result = CellResult()
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=result.collect)
    if reply["content"]["status"] == "error" and result.error is None:
        result.error = reply["content"]
    return result


@pytest.fixture
def start_kernel(hami_env):
    from jupyter_client.manager import KernelManager

    started = []

    def start(kernel_name="hami-python3", env=None, server_config=None, **config):
        """*server_config*: ``{"memory_limit": "2g"}`` as ``c.HamiProvisioner.*`` would
        set it; *config*: what the kernelspec's provisioner config carries."""
        from traitlets.config import Config

        cfg = Config()
        for k, v in (server_config or {}).items():
            setattr(cfg.HamiProvisioner, k, v)
        km = KernelManager(kernel_name=kernel_name, config=cfg)
        started.append(km)
        if config:
            # What a kernelspec's provisioner "config" would carry.
            km.kernel_spec.metadata["kernel_provisioner"]["config"].update(config)
        km.start_kernel(env={**os.environ, **(env or {})})
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=KERNEL_TIMEOUT)
        km._test_client = kc
        return km, kc

    yield start
    for km in started:
        kc = getattr(km, "_test_client", None)
        if kc is not None:
            kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


@pytest.fixture
def cell():
    return run_cell
