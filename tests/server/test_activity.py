"""The server publishes each kernel's activity in its registry entry, for the memory broker.

The broker parks only idle kernels; a cell that runs on the CPU (or waits
for input) makes no GPU call, so only the server can tell that its user is
at work. Here a real kernel runs a cell that waits for a file: while it
runs, its registry entry says busy; when it ends, the entry says idle again
with a later last activity.
"""

import asyncio

import pytest

from hami_jupyter.slice import registry

from test_parking_server import slice_of

WAIT_S = 30


@pytest.fixture(autouse=True)
def started(jp_serverapp, jp_asyncio_loop):
    """What ServerApp.start does once its loop runs (pytest-jupyter stops short of
    it): the extensions' starters run, and with ours the activity publisher."""
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    yield
    jp_serverapp.web_app.settings["hami_parking"].stop()
    jp_serverapp.web_app.settings["hami_activity"].stop()


async def entry_when(path, kernel_id, predicate, what):
    for _ in range(int(WAIT_S / 0.05)):
        found = {e.kernel_id: e for e in registry.kernels(path)}.get(kernel_id)
        if found is not None and predicate(found):
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"the registry entry of kernel {kernel_id} never showed {what}: {found}")


async def test_a_cell_moves_the_kernels_published_activity(start_kernel, jp_serverapp, tmp_path):
    k = await start_kernel()
    path = slice_of(jp_serverapp, k.id)
    before = await entry_when(path, k.id, lambda e: e.last_activity_unix > 0 and not e.busy,
                              "the kernel's start, idle")
    flag = tmp_path / "go"
    k.client.execute(f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n")
    busy = await entry_when(path, k.id, lambda e: e.busy, "the cell running")
    assert busy.last_activity_unix >= before.last_activity_unix
    flag.touch()
    after = await entry_when(path, k.id, lambda e: not e.busy and e.last_activity_unix > busy.last_activity_unix,
                             "the cell ended, with a later activity")
    assert (after.pid, after.kernelspec) == (before.pid, before.kernelspec)  # the rest of the entry kept
