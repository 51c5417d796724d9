"""Parking on the real GPU (docs/parking.md): a notebook kernel's GPU memory goes
to host memory, the GPU has it free for others, and the kernel's next cell
brings it back with training going on bit for bit.

Two paths: the kernel's own CUDA call asking for its state back (a kernel
started by a KernelManager, parked by hand), and the Jupyter server parking
an idle kernel by itself and resuming it for its next cell (a real
``jupyter server`` with ``c.HamiParking``, the cell sent over the kernel
websocket as JupyterLab sends it).
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from gpu_helpers import REPO, fast_park_env, run_in_kernel

pytestmark = pytest.mark.gpu

GiB = 1 << 30

TRAIN = """
import torch
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
ballast = torch.ones(8 << 30, dtype=torch.uint8, device="cuda")  # what parking moves
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randn(4096, 1024, device="cuda", generator=g)
y = torch.randint(0, 10, (4096,), device="cuda", generator=g)
def steps(n):
    out = []
    for _ in range(n):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item().hex())
    return out
"""


def nvml_figures(pid):
    """``(bytes NVML lists for pid on GPU 0, the GPU's free bytes)``."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mine = sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                   if p.pid == pid)
        return mine, pynvml.nvmlDeviceGetMemoryInfo(handle).free
    finally:
        pynvml.nvmlShutdown()


def grab(gib):
    """Another process (no slice) allocates *gib* GiB on GPU 0; whether it got them."""
    code = ("import torch\n"
            f"t = torch.empty({int(gib * GiB)}, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize(); print('got')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",) and not k.startswith("HAMI_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    return done.stdout.strip() == "got"


def kernel_pid(km):
    from hami_jupyter.slice.file import read_snapshot
    from hami_jupyter.slice.parking import kernel_slots

    (slot,) = kernel_slots(read_snapshot(km.provisioner.slice_path), km.kernel_id)
    return slot.pid


def test_a_parked_kernel_frees_the_gpu_and_trains_on_bit_for_bit(hami_kernel, monkeypatch):
    from hami_jupyter.slice.file import read_snapshot
    from hami_jupyter.slice.parking import park_kernel, park_state

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS in the kernels
    km, kc = hami_kernel("24g")
    run_in_kernel(kc, TRAIN)
    straight = json.loads(run_in_kernel(kc, "import json; print(json.dumps(steps(10)))"))
    kc.stop_channels()
    km.shutdown_kernel(now=True)

    km, kc = hami_kernel("24g")
    run_in_kernel(kc, TRAIN)
    first = json.loads(run_in_kernel(kc, "import json; print(json.dumps(steps(5)))"))
    pid = kernel_pid(km)
    held_before, free_before = nvml_figures(pid)
    result = park_kernel(km.provisioner.slice_path, km.kernel_id)
    held_parked, free_parked = nvml_figures(pid)
    print(f"park: {result.bytes / GiB:.2f} GiB in {result.seconds:.2f} s; NVML for the kernel "
          f"{held_before / GiB:.2f} -> {held_parked / GiB:.2f} GiB; GPU free "
          f"{free_before / GiB:.2f} -> {free_parked / GiB:.2f} GiB")
    assert park_state(read_snapshot(km.provisioner.slice_path), km.kernel_id) == "parked"
    assert result.bytes >= 8 * GiB and free_parked - free_before >= 8 * GiB
    # More than was free before the park: only the parked memory makes it fit.
    want = (free_before + free_parked) / 2 / GiB
    assert grab(want), f"another process could not allocate {want:.1f} GiB while the kernel was parked"
    t0 = time.monotonic()
    rest = json.loads(run_in_kernel(kc, "import json; print(json.dumps(steps(5)))"))
    print(f"resume by the kernel's own call, with 5 steps: {time.monotonic() - t0:.2f} s")
    assert park_state(read_snapshot(km.provisioner.slice_path), km.kernel_id) == "running"
    assert first + rest == straight


# ---- the server parks an idle kernel by itself -----------------------------------------

HOLD = """
import torch, hashlib
torch.manual_seed(7)
data = torch.randn(4 << 30, dtype=torch.bfloat16, device="cuda")  # 8 GiB
def digest():
    return hashlib.sha256(data.view(torch.uint8)[::4096].cpu().numpy().tobytes()).hexdigest()
print(digest())
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_server_parks_an_idle_kernel_and_its_next_cell_brings_it_back(preload_lib, tmp_path):
    pytest.importorskip("jupyter_server")
    from tornado.websocket import websocket_connect

    sys.path.insert(0, str(REPO / "tests"))
    from cell_result import run_over_websocket

    port, token = free_port(), "hami-gpu-test"
    (tmp_path / "jupyter_server_config.py").write_text(
        "c.ServerApp.jpserver_extensions = {'hami_jupyter': True}\n"
        "c.HamiParking.enabled = True\n"
        "c.HamiParking.idle_seconds = 5\n"
        "c.HamiParking.check_interval = 1\n"
        "c.HamiParking.min_bytes = '1g'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE_MEMORY"))}
    env.update(JUPYTER_PATH=str(REPO / "share" / "jupyter"), JUPYTER_CONFIG_DIR=str(tmp_path),
               HAMI_SLICE_ROOT=str(tmp_path / "slices"), HAMI_MEMORY_LIMIT="16g",
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), **fast_park_env())
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
                               f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
                               f"--ServerApp.root_dir={tmp_path}"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def call(method, path, body=None):
        req = urllib.request.Request(f"{base}/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read() or b"null")

    def server_log():
        log.flush()
        return (tmp_path / "server.log").read_text()[-6000:]

    async def scenario():
        for _ in range(300):
            try:
                call("GET", "api/status")
                break
            except OSError:
                await asyncio.sleep(0.1)
        kernel = call("POST", "api/kernels", {"name": "hami-python3"})
        conn = await websocket_connect(f"ws://127.0.0.1:{port}/api/kernels/{kernel['id']}/channels"
                                       f"?token={token}")
        first = await run_over_websocket(conn, HOLD, closed=server_log)
        assert first.error is None, first
        parked_after = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            state = call("GET", f"hami/v1/kernels/{kernel['id']}")["kernel"]
            if state["park_state"] == "parked":
                parked_after = time.monotonic() - t0
                break
            await asyncio.sleep(0.5)
        assert parked_after is not None, f"not parked within 60 s\n{server_log()}"
        pid = state["processes"][0]["pid"]
        held, free = nvml_figures(pid)
        print(f"parked {parked_after:.1f} s after the cell (idle_seconds 5): "
              f"{state['memory_parked'] / GiB:.2f} GiB in host memory; NVML for the kernel "
              f"{held / GiB:.2f} GiB, GPU free {free / GiB:.2f} GiB")
        assert state["memory_parked"] >= 8 * GiB
        t0 = time.monotonic()
        second = await run_over_websocket(conn, "print(digest())", closed=server_log)
        print(f"next cell: {second.stdout.strip()!r} in {time.monotonic() - t0:.2f} s")
        assert second.error is None, second
        assert "GPU memory restored" in second.stdout
        assert second.stdout.strip().splitlines()[-1] == first.stdout.strip().splitlines()[-1]
        conn.close()
        call("DELETE", f"api/kernels/{kernel['id']}")

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
