"""What issue 41 adds to the REST answers: every kernel named by its notebook
(item 1), and the whole GPU beside the slice, from NVML (item 7).

A kernel started for a notebook (``POST api/sessions``, as JupyterLab starts
one) is named by the notebook's path in the kernel answer, in every kernel
record of its slice, in ``hami/v1/slices`` and in its registry entry, which
other processes read (``%hami status`` in another kernel, the CLI, the hub
view); a rename follows. The whole GPU: its memory as NVML counts it (every
process's), this slice's share, each other slice this user may read by name,
the rest as one total, and its utilization, power and temperature.
"""

import asyncio
import json
import os
import subprocess
import time
from dataclasses import asdict

import pytest

from hami_jupyter import native
from hami_jupyter.gpus import read_gpus_as
from hami_jupyter.server import host
from hami_jupyter.slice import registry
from hami_jupyter.slice.status import format_text, slice_status

USER = "alice"
MiB = 1 << 20
CONTEXT = 64 * MiB  # the simulated GPU's context


@pytest.fixture
def jp_base_url():
    return f"/user/{USER}/"


@pytest.fixture(autouse=True)
def hub_user(slice_env, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_USER", USER)


async def wait_for(what, check, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        await asyncio.sleep(0.1)


@pytest.fixture
def session(jp_fetch, jp_serverapp):
    """``await session(path)``: a notebook session on hami-python3, as JupyterLab
    starts one; its model. Every session is deleted (its kernel shut down) at teardown."""
    made = []

    async def start(path):
        response = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
            {"path": path, "name": os.path.basename(path), "type": "notebook",
             "kernel": {"name": "hami-python3"}}))
        model = json.loads(response.body)
        made.append(model["id"])
        return model

    yield start

    async def delete():
        for session_id in made:
            await jp_fetch("api", "sessions", session_id, method="DELETE", raise_error=False)

    asyncio.get_event_loop().run_until_complete(delete())


@pytest.fixture
def started(jp_serverapp, jp_asyncio_loop):
    """What ServerApp.start does once its loop runs (pytest-jupyter stops short of
    it): the extensions' starters run, with ours the activity publisher."""
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    yield
    for name in ("hami_parking", "hami_activity", "hami_history"):
        jp_serverapp.web_app.settings[name].stop()


async def test_a_kernel_is_named_by_its_notebook_everywhere(started, session, jp_fetch, get_json,
                                                           slice_env, jp_root_dir):
    (jp_root_dir / "work").mkdir()  # the kernel starts in its notebook's folder
    model = await session("work/analysis.ipynb")
    kernel_id = model["kernel"]["id"]
    body = await get_json("hami", "v1", "kernels", kernel_id)
    assert body["notebook"] == "work/analysis.ipynb", body
    (record,) = [k for k in body["kernels"] if k["kernel_id"] == kernel_id]
    assert record["notebook"] == "work/analysis.ipynb"
    slices = await get_json("hami", "v1", "slices")
    assert slices["notebooks"] == {kernel_id: "work/analysis.ipynb"}
    (s,) = slices["slices"]
    assert [k["notebook"] for k in s["kernels"]] == ["work/analysis.ipynb"]

    # Other processes read the name from the registry: the provisioner wrote it at
    # launch from JPY_SESSION_NAME, relative to the server's root as JupyterLab names it.
    path = slice_env.root / f"{USER}.slice"
    (entry,) = registry.kernels(path)
    assert (entry.kernel_id, entry.notebook) == (kernel_id, "work/analysis.ipynb")
    text = format_text(slice_status(path))
    assert f"    work/analysis.ipynb  ({kernel_id}, {USER}, hami-python3): " in text, text

    # Renamed in JupyterLab: the answer at once, the registry within the publisher's second.
    await jp_fetch("api", "sessions", model["id"], method="PATCH",
                   body=json.dumps({"path": "work/renamed.ipynb", "name": "renamed.ipynb"}))
    body = await get_json("hami", "v1", "kernels", kernel_id)
    assert body["notebook"] == "work/renamed.ipynb"
    await wait_for("the registry to follow the rename",
                   lambda: [e.notebook for e in registry.kernels(path)] == ["work/renamed.ipynb"])


class Holder:
    """A process of slice *path* holding *mib* MiB on the simulated GPU (cudrive)."""

    def __init__(self, sim_state, path, mib):
        env = native.sim_env(sim_state, LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(path),
                             HAMI_MEMORY_LIMIT="1g")
        self.proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        for line in ("init", "ctx 0", f"alloc {mib}m"):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self.proc.stdout.readline())
            assert reply["rc"] == 0, (line, reply)

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)


async def test_the_whole_gpu_beside_the_slice(start_kernel, get_json, slice_env, monkeypatch):
    from hami_jupyter.server import whole_gpu

    # This server runs in the pytest process, which cannot load the simulated NVML
    # (LD_LIBRARY_PATH counts at process start): its GPUs are read in a child, the
    # way a server under the preload library reads them.
    monkeypatch.setattr(host, "host_gpus", lambda now=None: (
        lambda found: ([asdict(g) for g in found[0]], found[1]))(read_gpus_as(dict(os.environ))))
    k = await start_kernel()
    await k.run("from hami_jupyter import driver_memory as c\nc.init()\n"
                "b = c.DeviceBuffer(300 << 20)")
    mine = CONTEXT + 300 * MiB
    # bob: another slice of this user (readable, so named); carol: a slice this user may
    # not read (another user's, 0600): only in the total of the others.
    holders = [Holder(slice_env.sim_state, slice_env.root / "bob.slice", 200),
               Holder(slice_env.sim_state, slice_env.root / "carol.slice", 100)]
    carol = str(slice_env.root / "carol.slice")
    real_gpu_use = whole_gpu.gpu_use

    def gpu_use(path):
        if str(path) == carol:
            raise PermissionError(13, "Permission denied", carol)
        return real_gpu_use(path)

    monkeypatch.setattr(whole_gpu, "gpu_use", gpu_use)
    try:
        body = await get_json("hami", "v1", "kernels", k.id)
    finally:
        for h in holders:
            h.stop()
    assert body["whole_gpus_error"] is None, body["whole_gpus_error"]
    (gpu,) = body["gpus"]
    (whole,) = body["whole_gpus"]
    assert (whole["index"], whole["uuid"], whole["name"]) == (0, gpu["uuid"], "HAMi Simulated GPU")
    assert whole["memory_total"] == 16 << 30
    # NVML counts every process: this slice's, bob's and carol's.
    assert whole["memory_used"] == mine + (CONTEXT + 200 * MiB) + (CONTEXT + 100 * MiB), whole
    assert whole["slice_used"] == mine == gpu["memory_used"]
    assert whole["slices"] == [{"slice": "bob", "memory_used": CONTEXT + 200 * MiB}]
    assert whole["others_used"] == CONTEXT + 100 * MiB  # carol's, by no name
    # The simulated GPU's sensors follow its utilization: idle here.
    assert (whole["utilization"], whole["power_w"], whole["power_limit_w"], whole["temperature_c"]) == \
        (0, 70.0, 700.0, 31)


async def test_no_whole_gpu_where_nvml_cannot_tell(start_kernel, get_json):
    k = await start_kernel()
    await k.run("from hami_jupyter import driver_memory as c\nc.init()\nb = c.DeviceBuffer(1 << 20)")
    body = await get_json("hami", "v1", "kernels", k.id)
    # The pytest process has no NVML (see above): no figures, and why.
    assert body["whole_gpus"] == []
    assert "NVML" in body["whole_gpus_error"], body["whole_gpus_error"]


def test_the_servers_history_charts_a_two_gpu_kernel_against_its_gpus_caps():
    """Issue 41, item 2: the history the panel's charts start from draws a kernel
    with 2.6 GiB over two GPUs of 2.0 GiB caps against 4.0 GiB (65 %), never
    against one GPU's cap (131 %), and says each GPU's figure; and it keeps the
    whole GPU's samples beside the slice's."""
    from hami_jupyter.server.history import SliceHistory

    GiB = 1 << 30
    gpus = [{"index": i, "uuid": f"GPU-{i}", "memory_used": used, "memory_limit": 2 * GiB,
             "sm_share": 25, "sm_util": 0} for i, used in ((0, int(0.8 * GiB)), (1, int(1.8 * GiB)))]
    kernel = {"kernel_id": "k1", "memory_used": int(2.6 * GiB), "sm_util": 0,
              "processes": [{"memory_used": {"GPU-0": int(0.8 * GiB), "GPU-1": int(1.8 * GiB)}}]}
    status = {"gpus": gpus, "kernels": [kernel], "default_limit": {"sm_share": 25, "memory_limit": 2 * GiB}}
    whole = [{"index": 0, "uuid": "GPU-0", "utilization": 40, "memory_used": 5 * GiB,
              "memory_total": 80 * GiB, "slice_used": int(0.8 * GiB), "power_w": 300.0,
              "power_limit_w": 700.0, "temperature_c": 50}]
    history = SliceHistory(minutes=5)
    history.record("/x/alice.slice", status, t=1000, whole=whole)
    kept = history.samples("/x/alice.slice", now=1000)
    (sample,) = kept["kernels"]["k1"]
    assert (sample["used"], sample["cap"]) == (int(2.6 * GiB), 4 * GiB)
    assert sample["split"] == [{"gpu": 0, "used": int(0.8 * GiB), "cap": 2 * GiB},
                               {"gpu": 1, "used": int(1.8 * GiB), "cap": 2 * GiB}]
    assert kept["whole"]["0"] == [{"t": 1000, "gap": False, "util": 40, "used": 5 * GiB,
                                   "total": 80 * GiB, "slice": int(0.8 * GiB), "power": 300.0,
                                   "power_limit": 700.0, "temp": 50}]
    history.record("/x/alice.slice", status, t=2000)  # no whole GPU this time: a gap
    assert [s["gap"] for s in history.samples("/x/alice.slice", now=2000)["whole"]["0"]] == [False, True]
