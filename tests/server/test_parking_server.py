"""Parking through a real Jupyter Server: REST, the kernel websocket's resume, the views.

The kernels run on the simulated GPU, whose driver really moves a parked
process's memory to host memory and back (with its contents); cells reach the
kernel over its websocket, as from JupyterLab, so the server's resume before a
cell is what is tested. docs/parking.md.
"""

import asyncio
import fcntl
import json
import os
import subprocess

import pytest
from cell_result import run_over_websocket
from tornado.httpclient import HTTPClientError

from hami_jupyter import native
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import HAMI_PARK_PARKED, HAMI_PARK_PARKING, HamiSlot, slot_offset
from hami_jupyter.slice.locks import F_OFD_SETLK, flock_bytes
from hami_jupyter.slice.status import slice_status
from hami_jupyter.slice.parking import kernel_slots

MiB = 1 << 20
CONTEXT = 64 * MiB
# A park takes the context along with the driver's checkpoint; a kernel that
# parks itself (HAMI_FAST_PARK=1 in the kernels' environment) leaves it.
PARKED_CONTEXT = 0 if os.environ.get("HAMI_FAST_PARK") == "1" else CONTEXT
WAIT_S = 30

FILL = """\
from hami_jupyter import driver_memory as c
c.init()
held = c.DeviceBuffer({mib} << 20)
held.write(bytes(range(256)) * 4096)
print("filled")
"""

CHECK = """\
print("intact" if held.read(1 << 20) == bytes(range(256)) * 4096 else "CHANGED")
"""


def slice_of(serverapp, kernel_id):
    return serverapp.kernel_manager.get_kernel(kernel_id).provisioner.slice_path


async def post(jp_fetch, kernel_id, action):
    response = await jp_fetch("hami", "v1", "kernels", kernel_id, action, method="POST", body="{}")
    return json.loads(response.body)


async def cell(jp_ws_fetch, kernel_id, code):
    conn = await jp_ws_fetch("api", "kernels", kernel_id, "channels")
    try:
        return await asyncio.wait_for(run_over_websocket(conn, code), WAIT_S)
    finally:
        conn.close()


def kernel_state(path, kernel_id):
    return [s.park_state for s in kernel_slots(read_snapshot(path), kernel_id)]


@pytest.fixture
def parking(jp_serverapp):
    """The server's parking manager (its configuration can be changed per test)."""
    return jp_serverapp.web_app.settings["hami_parking"]


async def test_a_parked_kernels_next_cell_brings_its_memory_back(
        start_kernel, jp_fetch, jp_ws_fetch, get_json, slice_env):
    k = await start_kernel()
    assert (await cell(jp_ws_fetch, k.id, FILL.format(mib=512))).stdout == "filled\n"
    body = await post(jp_fetch, k.id, "park")
    parked = PARKED_CONTEXT + 512 * MiB
    assert body["park_state"] == "parked" and body["parked_bytes"] == parked

    status = await get_json("hami", "v1", "kernels", k.id)
    assert status["kernel"]["park_state"] == "parked"
    assert status["kernel"]["park_reason"] == "asked"  # over REST: a user asked
    assert status["kernel"]["memory_parked"] == parked
    assert status["memory_used"] == CONTEXT - PARKED_CONTEXT and status["gpus"][0]["memory_parked"] == parked
    metrics = (await jp_fetch("metrics")).body.decode()
    assert any(line.startswith("hami_kernel_parked_bytes{") and f'kernel_id="{k.id}"' in line and
               float(line.split()[-1]) == parked for line in metrics.splitlines())

    result = await cell(jp_ws_fetch, k.id, CHECK)
    assert result.error is None, result.error
    assert result.stdout.startswith("hami: GPU memory restored: 576.0 MiB in "), result.stdout
    assert result.stdout.endswith("intact\n")
    status = await get_json("hami", "v1", "kernels", k.id)
    assert status["kernel"]["park_state"] == "running" and status["kernel"]["memory_parked"] == 0
    assert status["kernel"]["park_reason"] is None
    assert status["memory_used"] == CONTEXT + 512 * MiB


async def test_resume_over_rest_and_a_kernel_that_comes_back_by_itself(
        start_kernel, jp_fetch, jp_serverapp):
    k = await start_kernel()
    await k.run(FILL.format(mib=256))
    await post(jp_fetch, k.id, "park")
    body = await post(jp_fetch, k.id, "resume")
    assert body["park_state"] == "running" and body["restored_bytes"] == CONTEXT + 256 * MiB
    # Parked again, the kernel is reached by another client than the server's
    # websocket (as after a server restart): its own first CUDA call asks.
    await post(jp_fetch, k.id, "park")
    assert await k.run(CHECK) == "intact\n"
    assert kernel_state(slice_of(jp_serverapp, k.id), k.id) == [0]


async def test_a_cell_that_arrives_while_a_park_is_under_way_waits_then_runs(
        start_kernel, jp_fetch, jp_ws_fetch, jp_serverapp, slice_env):
    """The test plays the parker: it holds the slot's park lock and says
    PARKING; the cell waits (the kernel never sees it); the park ends; the
    cell's resume follows, then the cell."""
    k = await start_kernel()
    await k.run(FILL.format(mib=128))
    path = slice_of(jp_serverapp, k.id)
    [slot] = kernel_slots(read_snapshot(path), k.id)
    at = slot_offset(slot.index) + HamiSlot.park_state.offset
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, at))
        os.pwrite(fd, HAMI_PARK_PARKING.to_bytes(4, "little"), at)
        pending = asyncio.ensure_future(cell(jp_ws_fetch, k.id, CHECK))
        await asyncio.sleep(1.0)
        assert not pending.done()
        assert jp_serverapp.kernel_manager.get_kernel(k.id).execution_state == "idle"
        env = native.sim_env(slice_env.sim_state)
        for step in ("lock", "checkpoint"):
            done = subprocess.run([str(native.cudrive_path()), "init", "ckpt", step, str(slot.pid)], env=env,
                                  capture_output=True, text=True, timeout=WAIT_S)
            answer = [json.loads(line) for line in done.stdout.splitlines() if '"ckpt"' in line]
            assert answer and answer[0]["rc"] == 0, done.stdout + done.stderr
        os.pwrite(fd, HAMI_PARK_PARKED.to_bytes(4, "little"), at)
    finally:
        os.close(fd)  # the park is done: its lock goes
    result = await pending
    assert result.error is None and result.stdout.endswith("intact\n"), result
    assert "GPU memory restored" in result.stdout


async def test_no_room_fails_the_cell_and_the_kernel_stays_parked(
        start_kernel, jp_fetch, jp_ws_fetch, jp_serverapp, parking):
    a = await start_kernel()
    await a.run(FILL.format(mib=512))  # 576 MiB of the slice's 1 GiB
    await post(jp_fetch, a.id, "park")
    b = await start_kernel()  # the same user's other kernel takes the room meanwhile
    await b.run(FILL.format(mib=800))
    parking.config.resume_timeout = 1.0
    result = await cell(jp_ws_fetch, a.id, CHECK)
    assert result.status == "error" and result.error["ename"] == "GPUMemoryParked"
    assert "room under the slice's memory cap" in result.error["evalue"]
    assert "stays parked in host memory, nothing is lost" in result.error["evalue"]
    # Said while waiting, with why it was parked (a REST call: on request).
    assert ("hami: this kernel's GPU memory was parked in host memory on request; bringing it back "
            "waits for room under the slice's memory cap") in result.stdout, result.stdout
    path = slice_of(jp_serverapp, a.id)
    assert kernel_state(path, a.id) == [HAMI_PARK_PARKED]
    assert not any(s.park_wanted for s in kernel_slots(read_snapshot(path), a.id))
    await b.run("held.free()")
    result = await cell(jp_ws_fetch, a.id, CHECK)
    assert result.error is None and result.stdout.endswith("intact\n"), result


async def test_too_little_host_memory_refuses_the_park(start_kernel, jp_fetch, parking,
                                                        jp_serverapp):
    k = await start_kernel()
    await k.run(FILL.format(mib=64))
    parking.config.host_memory_reserve = "1024t"
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, k.id, "park")
    assert refused.value.code == 409
    assert "host memory too low" in refused.value.response.body.decode()
    assert kernel_state(slice_of(jp_serverapp, k.id), k.id) == [0]
    assert await k.run(CHECK) == "intact\n"


async def test_a_kernel_with_nothing_on_the_gpu_is_not_parked(start_kernel, jp_fetch):
    k = await start_kernel()
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, k.id, "park")
    assert refused.value.code == 409 and "no process on the GPU" in refused.value.response.body.decode()
    with pytest.raises(HTTPClientError) as unknown:
        await post(jp_fetch, "no-such-kernel", "park")
    assert unknown.value.code == 404


async def test_a_kernel_shut_down_while_parked_leaves_nothing(
        start_kernel, jp_fetch, jp_serverapp, slice_env):
    k = await start_kernel()
    await k.run(FILL.format(mib=256))
    await post(jp_fetch, k.id, "park")
    path = slice_of(jp_serverapp, k.id)
    [slot] = kernel_slots(read_snapshot(path), k.id)
    await jp_fetch("api", "kernels", k.id, method="DELETE")
    status = json.loads(subprocess.run([str(native.simctl_path()), "status"],
                                       env=native.sim_env(slice_env.sim_state), capture_output=True,
                                       text=True, timeout=WAIT_S, check=True).stdout)
    process = [p for p in status.get("processes", []) if p.get("pid") == slot.pid]
    assert not process or not process[0].get("checkpoint_host_bytes"), process
    assert all(g["memory_parked"] == 0 for g in slice_status(path)["gpus"])


def _shell(msg_type, content):
    """A shell message as a browser sends it over the kernel websocket."""
    import uuid
    from datetime import datetime, timezone

    return json.dumps({
        "channel": "shell",
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "test",
                   "session": uuid.uuid4().hex, "date": datetime.now(timezone.utc).isoformat(),
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": content, "buffers": []})


async def test_a_page_that_opens_the_notebook_leaves_the_kernel_parked(
        start_kernel, jp_fetch, jp_ws_fetch, jp_serverapp):
    """Issue 35, item 1: what a browser tab sends when it opens a notebook (its
    kernel_info_request, and the widget manager's comm_open and comm_msg on
    jupyter.widget.control) brought a parked kernel back 0.2 s later, with no
    cell run. It stays parked; its next cell brings it back."""
    k = await start_kernel()
    await k.run(FILL.format(mib=256))
    await post(jp_fetch, k.id, "park")
    path = slice_of(jp_serverapp, k.id)
    assert kernel_state(path, k.id) == [HAMI_PARK_PARKED]
    conn = await jp_ws_fetch("api", "kernels", k.id, "channels")
    try:
        comm = "hami-test-comm"
        for msg in (_shell("kernel_info_request", {}),
                    _shell("comm_info_request", {"target_name": "jupyter.widget"}),
                    _shell("comm_open", {"comm_id": comm, "target_name": "jupyter.widget.control",
                                         "data": {}}),
                    _shell("comm_msg", {"comm_id": comm, "data": {"method": "request_states"}})):
            conn.write_message(msg)
        await asyncio.sleep(3)  # it took 0.2 s
        assert kernel_state(path, k.id) == [HAMI_PARK_PARKED]
        result = await asyncio.wait_for(run_over_websocket(conn, CHECK), WAIT_S)
    finally:
        conn.close()
    assert result.stdout.startswith("hami: GPU memory restored"), result.stdout
    assert result.stdout.endswith("intact\n")
