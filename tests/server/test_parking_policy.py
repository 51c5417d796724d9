"""The server parks its idle kernels by itself (c.HamiParking), and only those it should."""

import asyncio
import json

import pytest
from traitlets.config import Config

from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.parking import park_state

from test_parking_server import CHECK, FILL, cell, slice_of

WAIT_S = 30


@pytest.fixture
def jp_server_config():
    return Config({
        "ServerApp": {"jpserver_extensions": {"hami_jupyter": True}},
        "HamiParking": {"enabled": True, "idle_seconds": 1.0, "check_interval": 0.2,
                        "min_bytes": "200m", "host_memory_reserve": "0"},
    })


@pytest.fixture(autouse=True)
def started(jp_serverapp, jp_asyncio_loop):
    """What ServerApp.start does once its loop runs (pytest-jupyter stops short of
    it): the extensions' starters run, and with ours the idle-kernel watcher."""
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    yield
    jp_serverapp.web_app.settings["hami_parking"].stop()
    jp_serverapp.web_app.settings["hami_activity"].stop()


def state(serverapp, kernel_id):
    return park_state(read_snapshot(slice_of(serverapp, kernel_id)), kernel_id)


async def settle(seconds):
    await asyncio.sleep(seconds)


async def test_an_idle_kernel_is_parked_and_its_next_cell_resumes_it(
        start_kernel, jp_serverapp, jp_ws_fetch, jp_fetch):
    big = await start_kernel()
    small = await start_kernel()
    await big.run(FILL.format(mib=300))
    await small.run(FILL.format(mib=16))  # under min_bytes: left alone
    for _ in range(int(WAIT_S / 0.1)):
        if state(jp_serverapp, big.id) == "parked":
            break
        await settle(0.1)
    assert state(jp_serverapp, big.id) == "parked"
    assert state(jp_serverapp, small.id) == "running"
    body = json.loads((await jp_fetch("hami", "v1", "kernels", big.id)).body)
    assert body["kernel"]["park_state"] == "parked"
    assert body["kernel"]["park_reason"] == "idle"  # the server's idle policy parked it
    result = await cell(jp_ws_fetch, big.id, CHECK)
    assert "GPU memory restored" in result.stdout and result.stdout.endswith("intact\n"), result


async def test_a_busy_kernel_is_not_parked(start_kernel, jp_serverapp):
    k = await start_kernel()
    await k.run(FILL.format(mib=300))
    # A cell that keeps running (and calling the GPU) for longer than idle_seconds.
    task = asyncio.ensure_future(k.run(
        "import time\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 3:\n"
        "    held.write(b'x')\n"
        "    time.sleep(0.05)\n"))
    await settle(2.5)
    assert state(jp_serverapp, k.id) == "running"
    await task
