"""Fixtures for the server extension's tests: a real Jupyter Server (through
pytest-jupyter) with the extension enabled, and real kernels on the simulated GPU.

* Every test here runs with ``hami_env`` (tests/jupyter/conftest.py: the
  simulated GPU, a private slice root), the ``hami-python3`` kernelspec where
  the test server looks for kernelspecs, and the slice limits the server
  gives its kernels: ``HAMI_MEMORY_LIMIT=1g``, ``HAMI_SM_LIMIT=25``.
* ``start_kernel(name="hami-python3")`` (async): starts a kernel through
  ``POST api/kernels`` and returns a :class:`Kernel` (its id, a ready client,
  ``await k.run(code)``); every kernel is shut down at teardown.
* ``get_json(*parts)`` (async): ``GET`` under the server's base URL, with the
  token; returns the decoded body.
"""

import asyncio
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

# pytest-jupyter registers no plugin entry point, and pytest allows
# ``pytest_plugins`` only in the top conftest: import its fixtures and hooks
# here, so they apply to this folder alone.
from pytest_jupyter.jupyter_server import *  # noqa: F403

REPO = Path(__file__).resolve().parents[2]
KERNELSPEC = REPO / "share" / "jupyter" / "kernels" / "hami-python3"
KERNEL_TIMEOUT = 60
SHUTDOWN_TIMEOUT = 30


def _jupyter_fixtures():
    """tests/jupyter/conftest.py as a module, for its ``hami_env`` fixture."""
    spec = importlib.util.spec_from_file_location(
        "hami_tests_jupyter_conftest", REPO / "tests" / "jupyter" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hami_env = _jupyter_fixtures().hami_env


@pytest.fixture
def jp_server_config():
    return Config({"ServerApp": {"jpserver_extensions": {"hami_jupyter": True}}})


@pytest.fixture(autouse=True)
def slice_env(hami_env, jp_data_dir, monkeypatch):
    """The simulated GPU, the kernelspec, and the limits of the kernels' slice:
    ``hami_env`` plus ``memory_limit`` (bytes) and ``sm_share``."""
    shutil.copytree(KERNELSPEC, jp_data_dir / "kernels" / KERNELSPEC.name)
    monkeypatch.setenv("HAMI_MEMORY_LIMIT", "1g")
    monkeypatch.setenv("HAMI_SM_LIMIT", "25")
    return SimpleNamespace(**vars(hami_env), memory_limit=1 << 30, sm_share=25)


@dataclass
class Kernel:
    id: str
    client: object

    async def run(self, code):
        """Execute *code*; its stdout. Fails the test if the cell raises."""
        out, errors = [], []

        def hook(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append("\n".join(msg["content"]["traceback"]))

        reply = await self.client.execute_interactive(code, timeout=KERNEL_TIMEOUT,
                                                      output_hook=hook)
        assert reply["content"]["status"] == "ok", errors or reply["content"]
        return "".join(out)


@pytest.fixture
def get_json(jp_fetch):
    async def get(*parts):
        response = await jp_fetch(*parts)
        assert response.code == 200
        return json.loads(response.body)

    return get


@pytest.fixture
def start_kernel(jp_fetch, jp_serverapp, jp_asyncio_loop):
    manager = jp_serverapp.kernel_manager
    started = []

    async def start(name="hami-python3"):
        response = await jp_fetch("api", "kernels", method="POST",
                                  body=json.dumps({"name": name}))
        kernel_id = json.loads(response.body)["id"]
        client = manager.get_kernel(kernel_id).client()
        started.append((kernel_id, client))
        client.start_channels()
        await client.wait_for_ready(timeout=KERNEL_TIMEOUT)
        return Kernel(kernel_id, client)

    yield start

    async def shutdown():
        for kernel_id, client in started:
            client.stop_channels()
            if kernel_id in manager.list_kernel_ids():
                await asyncio.wait_for(manager.shutdown_kernel(kernel_id, now=True),
                                       SHUTDOWN_TIMEOUT)

    jp_asyncio_loop.run_until_complete(shutdown())
