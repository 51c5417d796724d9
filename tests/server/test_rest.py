"""``{base_url}hami/v1/``: the answers the status bar reads, under a JupyterHub
user's base URL, compared with what ``slice_status`` reads from the file."""

import json
import os
import uuid

import pytest
from fake_guard import seen, write_guard
from jupyter_server.utils import url_path_join

from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.slice.status import slice_status

MiB = 1 << 20
CONTEXT = 64 * MiB  # the simulated GPU's context
USER = "alice"

SUMMARY_KEYS = {"kernel_id", "notebook", "in_slice", "slice", "path", "memory_used", "memory_limit",
                "memory_gpu", "memory_guarantee", "memory_level", "sm_share", "sm_util", "kernel", "gpus", "kernels",
                "warning_fraction", "critical_fraction", "memory_real", "guard_state", "guard",
                "whole_gpus", "whole_gpus_error"}
NO_GUARD = {"running": False, "action": None, "written_unix": None, "error": None, "elsewhere": [], "parked": []}


@pytest.fixture
def jp_base_url():
    return f"/user/{USER}/"


@pytest.fixture(autouse=True)
def hub_user(slice_env, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_USER", USER)


def allocate(mib):
    return ("from hami_jupyter import driver_memory as c\n"
            "c.init()\n"
            "bufs = globals().setdefault('bufs', [])\n"
            f"bufs.append(c.DeviceBuffer({mib} << 20))")


HEARTBEAT = ("active_unix", "gpu_active_unix")  # refreshed by each process's housekeeper


def without_heartbeat(kernel):
    """A kernel's usage minus each process's last-activity times, which its
    housekeeping thread refreshes every 50 ms (two reads never agree on them)."""
    procs = [{k: v for k, v in p.items() if k not in HEARTBEAT} for p in kernel["processes"]]
    return {**kernel, "processes": procs}


def check_against_file(body):
    """*body*'s numbers are those slice_status() reads from the slice file now."""
    status = slice_status(body["path"])
    assert body["gpus"] == status["gpus"]
    # The top-level memory is the fullest GPU's: the highest used / cap of them all.
    fullest = max(status["gpus"], key=lambda g: g["memory_used"] / g["memory_limit"])
    assert body["memory_gpu"] == fullest["index"]
    assert (body["memory_used"], body["memory_limit"], body["memory_guarantee"]) == \
        (fullest["memory_used"], fullest["memory_limit"], fullest["memory_guarantee"])
    mine = next(k for k in status["kernels"] if k["kernel_id"] == body["kernel_id"])
    assert without_heartbeat(body["kernel"]) == without_heartbeat(
        {k: mine[k] for k in ("memory_used", "sm_util", "processes", "memory_parked", "park_state",
                              "park_wait", "park_reason", "room_wait")})
    assert body["sm_util"] == max(g["sm_util"] for g in status["gpus"])


async def test_kernel_usage_follows_the_slice_file(start_kernel, get_json, slice_env):
    k = await start_kernel()
    body = await get_json("hami", "v1", "kernels", k.id)
    assert set(body) == SUMMARY_KEYS
    path = slice_env.root / f"{USER}.slice"
    assert (body["kernel_id"], body["in_slice"], body["slice"], body["path"]) == \
        (k.id, True, USER, str(path))
    # No GPU used yet: the default limits, nothing used.
    assert (body["memory_used"], body["memory_limit"], body["memory_level"]) == \
        (0, slice_env.memory_limit, "ok")
    assert body["memory_gpu"] is None
    assert body["memory_guarantee"] == slice_env.memory_limit  # none set: the cap
    assert (body["sm_share"], body["sm_util"], body["gpus"]) == (slice_env.sm_share, 0, [])
    assert body["kernel"] == {"memory_used": 0, "sm_util": 0, "processes": [], "memory_parked": 0,
                              "park_state": "running", "park_wait": None,
                              "park_reason": None, "room_wait": None}
    assert [(e["kernel_id"], e["user"], e["this_server"]) for e in body["kernels"]] == \
        [(k.id, USER, True)]
    assert (body["warning_fraction"], body["critical_fraction"]) == (0.8, 0.95)
    assert (body["memory_real"], body["guard_state"], body["guard"]) == (None, None, NO_GUARD)

    # 1 GiB cap, the context included: 364 MiB is fine, 864 MiB over 80 %, 984 MiB over 95 %.
    used = CONTEXT
    for mib, level in ((300, "ok"), (500, "warning"), (120, "critical")):
        await k.run(allocate(mib))
        used += mib * MiB
        body = await get_json("hami", "v1", "kernels", k.id)
        assert set(body) == SUMMARY_KEYS
        assert (body["memory_used"], body["memory_limit"]) == (used, slice_env.memory_limit)
        assert body["memory_level"] == level
        assert body["sm_share"] == slice_env.sm_share
        (gpu,) = body["gpus"]
        assert (gpu["memory_used"], gpu["memory_limit"], gpu["memory_level"]) == \
            (used, slice_env.memory_limit, level)
        assert (gpu["memory_real"], gpu["guard_state"]) == (None, None)  # no guard here
        assert body["kernel"]["memory_used"] == used
        (proc,) = body["kernel"]["processes"]
        assert proc["memory_used"] == {gpu["uuid"]: used}
        check_against_file(body)


async def test_the_guards_figures_beside_the_slices(start_kernel, get_json, slice_env):
    k = await start_kernel()
    await k.run(allocate(300))
    path = slice_env.root / f"{USER}.slice"
    (gpu,) = slice_status(path)["gpus"]
    used = 300 * MiB + CONTEXT
    report = write_guard(slice_env.root, {USER: {gpu["uuid"]: seen(1300 * MiB, used, 1 << 30,
                                                                   "over")}}, interval=5.0)
    body = await get_json("hami", "v1", "kernels", k.id)
    assert set(body) == SUMMARY_KEYS
    assert (body["memory_used"], body["memory_real"], body["guard_state"]) == \
        (used, 1300 * MiB, "over")
    assert body["guard"] == {"running": True, "action": "kill",
                             "written_unix": report["written_unix"], "error": None, "elsewhere": [], "parked": []}
    (shown,) = body["gpus"]
    assert (shown["memory_used"], shown["memory_real"], shown["guard_state"]) == \
        (used, 1300 * MiB, "over")
    assert (shown["guard_limit"], shown["guard_reported"]) == (1 << 30, used)
    (s,) = (await get_json("hami", "v1", "slices"))["slices"]
    assert s["guard"] == body["guard"] and s["gpus"] == body["gpus"]

    # Within its cap; then a guard that stopped writing ten minutes ago: not believed.
    write_guard(slice_env.root, {USER: {gpu["uuid"]: seen(used + 20 * MiB, used, 1 << 30, "ok")}},
                interval=5.0)
    body = await get_json("hami", "v1", "kernels", k.id)
    assert (body["memory_real"], body["guard_state"]) == (used + 20 * MiB, "ok")
    write_guard(slice_env.root, {USER: {gpu["uuid"]: seen(1300 * MiB, used, 1 << 30, "over")}},
                written_unix=report["written_unix"] - 600)
    body = await get_json("hami", "v1", "kernels", k.id)
    assert (body["memory_real"], body["guard_state"]) == (None, None)
    assert body["guard"]["running"] is False and body["gpus"][0]["memory_real"] is None


async def test_kernel_outside_a_slice(start_kernel, get_json):
    k = await start_kernel("python3")
    body = await get_json("hami", "v1", "kernels", k.id)
    assert set(body) == {"kernel_id", "notebook", "in_slice", "reason"}
    assert (body["kernel_id"], body["notebook"], body["in_slice"]) == (k.id, None, False)
    assert "HAMi provisioner" in body["reason"]
    body = await get_json("hami", "v1", "slices")
    assert (body["slices"], body["kernels"]) == ([], {k.id: None})


async def test_unknown_kernel_is_a_json_404(jp_fetch):
    kernel_id = str(uuid.uuid4())
    response = await jp_fetch("hami", "v1", "kernels", kernel_id, raise_error=False)
    assert response.code == 404
    assert json.loads(response.body)["message"] == f"no kernel with id {kernel_id}"


async def test_requests_need_the_token_and_the_base_url(http_server_client, jp_auth_header,
                                                        jp_base_url):
    for parts in (("slices",), ("kernels", str(uuid.uuid4()))):
        url = url_path_join(jp_base_url, "hami", "v1", *parts)
        response = await http_server_client.fetch(url, raise_error=False)
        assert response.code in (401, 403), url
        # With the token, but outside the base URL: not there.
        response = await http_server_client.fetch(
            url[len(jp_base_url) - 1:], raise_error=False,
            headers=jp_auth_header)
        assert response.code == 404, url


async def test_slices_lists_the_kernels_slices(start_kernel, get_json, jp_fetch, slice_env,
                                               monkeypatch):
    a, b = await start_kernel(), await start_kernel()
    plain = await start_kernel("python3")
    await a.run(allocate(100))
    path = slice_env.root / f"{USER}.slice"
    # A kernel of another server in the same slice (this test process stands in for it).
    other = str(uuid.uuid4())
    kernel_registry.register(path, kernel_registry.new_entry(
        path, other, "bob", "hami-python3", os.getpid()))

    body = await get_json("hami", "v1", "slices")
    assert body["kernels"] == {a.id: USER, b.id: USER, plain.id: None}
    (s,) = body["slices"]
    status = slice_status(path)
    assert (s["slice"], s["path"], s["gpus"]) == (USER, str(path), status["gpus"])
    assert s["gpus"][0]["memory_used"] == 100 * MiB + CONTEXT
    flags = {k["kernel_id"]: (k["user"], k["this_server"]) for k in s["kernels"]}
    assert flags == {a.id: (USER, True), b.id: (USER, True), other: ("bob", False)}
    this_kernel = await get_json("hami", "v1", "kernels", b.id)
    assert {k["kernel_id"]: k["this_server"] for k in this_kernel["kernels"]} == \
        {a.id: True, b.id: True, other: False}
    assert this_kernel["kernel"] == {"memory_used": 0, "sm_util": 0, "processes": [], "memory_parked": 0,
                                     "park_state": "running", "park_wait": None,
                                     "park_reason": None, "room_wait": None}

    # Without kernels: only the server's own slice, when $HAMI_SLICE names one.
    for kernel in (a, b, plain):
        await jp_fetch("api", "kernels", kernel.id, method="DELETE")
    kernel_registry.unregister(path, other)
    empty = await get_json("hami", "v1", "slices")
    assert (empty["slices"], empty["kernels"], empty["kernel_activity"]) == ([], {}, {})
    monkeypatch.setenv("HAMI_SLICE", USER)
    (s,) = (await get_json("hami", "v1", "slices"))["slices"]
    assert (s["slice"], s["path"], s["kernels"]) == (USER, str(path), [])
    monkeypatch.setenv("HAMI_SLICE", "nobody")
    assert (await get_json("hami", "v1", "slices"))["slices"] == []


async def test_slices_say_where_the_server_runs(start_kernel, get_json, monkeypatch):
    """The hub service places each server's slices by these: the node (HAMI_NODE_NAME
    over the host name), the node's GPUs from NVML, each kernel's idle time."""
    monkeypatch.setenv("HAMI_NODE_NAME", "gpu-node-7")
    k = await start_kernel()
    await k.run("pass")
    body = await get_json("hami", "v1", "slices")
    assert body["node"] == "gpu-node-7"
    # This test's server runs in the pytest process, which cannot load the
    # simulated NVML (LD_LIBRARY_PATH counts at process start): the answer says
    # why there are no GPUs. The hub service's test reads them from real servers.
    assert body["host_gpus"] == []
    assert "NVML" in body["host_gpus_error"]
    activity = body["kernel_activity"][k.id]
    assert activity["execution_state"] == "idle"
    assert 0 <= activity["idle_seconds"] < 60
    monkeypatch.delenv("HAMI_NODE_NAME")
    import socket
    assert (await get_json("hami", "v1", "slices"))["node"] == socket.gethostname()


async def test_damaged_slice_file_is_advice(start_kernel, get_json, jp_fetch, slice_env):
    k = await start_kernel()  # no GPU work: nothing maps the file
    path = slice_env.root / f"{USER}.slice"
    path.write_bytes(b"junk" * 2048)
    body = await get_json("hami", "v1", "kernels", k.id)
    assert set(body) == {"kernel_id", "notebook", "in_slice", "slice", "path", "error"}
    assert (body["in_slice"], body["slice"], body["path"]) == (True, USER, str(path))
    assert body["error"].startswith("hami: ") and "damaged" in body["error"]
    assert "\n" not in body["error"]
    slices = await get_json("hami", "v1", "slices")
    assert slices["slices"] == [{"slice": USER, "path": str(path), "error": body["error"]}]
    assert slices["kernels"] == {k.id: USER}


@pytest.fixture
def fast_history(jp_server_config):
    """The server reads its slices' history every 0.2 s."""
    jp_server_config.SliceDisplay.history_interval = 0.2
    return jp_server_config


@pytest.fixture
def recording(fast_history, jp_serverapp):
    """The history recorder running, as ServerApp.start starts it (pytest-jupyter stops short of it)."""
    recorder = jp_serverapp.web_app.settings["hami_history"].start()
    yield recorder
    recorder.stop()


async def test_the_server_keeps_the_charts_history(recording, start_kernel, get_json, jp_fetch,
                                                  slice_env):
    """Issue 35, item 6: the panel's charts started over at every page load. The
    server keeps each GPU's and kernel's samples and answers them for a page
    opened later, in the panel's sample shape."""
    import asyncio
    import time

    k = await start_kernel()
    await k.run(allocate(300))
    used = 300 * MiB + CONTEXT
    before = time.time() * 1000
    deadline = time.monotonic() + 30
    while True:
        body = await get_json("hami", "v1", "kernels", k.id, "history")
        gpu = next(iter(body["gpus"].values()), [])
        if len([s for s in gpu if s["used"] == used]) >= 3:
            break
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.2)
    assert (body["kernel_id"], body["in_slice"], body["interval_s"]) == (k.id, True, 0.2)
    assert body["path"] == str(slice_env.root / f"{USER}.slice")
    assert list(body["gpus"]) == ["0"] and list(body["kernels"]) == [k.id]
    last = body["gpus"]["0"][-1]
    assert set(last) == {"t", "gap", "used", "sm", "cap", "share", "real", "parked", "state"}
    assert (last["gap"], last["used"], last["cap"], last["share"], last["state"]) == \
        (False, used, slice_env.memory_limit, slice_env.sm_share, None)
    mine = body["kernels"][k.id][-1]
    assert (mine["used"], mine["cap"], mine["state"]) == (used, slice_env.memory_limit, "running")
    times = [s["t"] for s in body["gpus"]["0"]]
    assert times == sorted(times) and times[-1] >= before - 1000
    # A shorter window answers fewer samples; an unknown kernel is a 404.
    short = json.loads((await jp_fetch("hami", "v1", "kernels", k.id, "history",
                                       params={"minutes": "1"})).body)
    assert short["gpus"]["0"] and short["gpus"]["0"][-1]["used"] == used
    from tornado.httpclient import HTTPClientError
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("hami", "v1", "kernels", str(uuid.uuid4()), "history")
    assert e.value.code == 404
