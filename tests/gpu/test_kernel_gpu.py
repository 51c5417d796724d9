"""A notebook kernel started by HamiProvisioner runs PyTorch under its cap (real GPU).

The kernel is a real ipykernel started by a real KernelManager from the
``hami-python3`` kernelspec; the test talks to it over its channels, as
JupyterLab would.
"""

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[2]

FILL = """
import json, torch
free, total = torch.cuda.mem_get_info()
held, oom = [], False
try:
    while len(held) < 64:
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    oom = True
x = torch.randn(2048, 2048, device="cuda")
y = (x @ x).sum().item()  # the GPU computes under the preload
print(json.dumps({"total": total, "tensors": len(held), "oom": oom}))
"""


@pytest.fixture
def kernel(tmp_path, monkeypatch, preload_lib):
    jupyter_client = pytest.importorskip("jupyter_client")
    from importlib.metadata import entry_points

    names = [ep.name for ep in entry_points(group="jupyter_client.kernel_provisioners")]
    assert "hami-provisioner" in names, "hami-jupyter is not installed (no hami-provisioner entry point)"
    for name in list(os.environ):
        if name.startswith(("HAMI_", "CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JUPYTER_PATH", str(REPO / "share" / "jupyter"))
    monkeypatch.setenv("HAMI_SLICE_ROOT", str(tmp_path))
    monkeypatch.setenv("HAMI_MEMORY_LIMIT", "4g")
    km = jupyter_client.KernelManager(kernel_name="hami-python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def run(kc, code):
    """stdout of *code*, followed by the text/plain of what it displayed."""
    out, err = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            (out if msg["content"]["name"] == "stdout" else err).append(msg["content"]["text"])
        elif msg["msg_type"] in ("display_data", "execute_result"):
            out.append(msg["content"]["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            err.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=300, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(err)
    return "".join(out)


def test_provisioned_kernel_runs_torch_under_its_cap(kernel):
    km, kc = kernel
    r = json.loads(run(kc, FILL).strip().splitlines()[-1])
    print(f"kernel {km.kernel_id}: torch total {r['total']}, {r['tensors']} x 256 MiB before OOM")
    assert r["total"] == 4 * GiB
    assert r["oom"] and 8 <= r["tensors"] <= 16
    status = json.loads(run(kc, "%hami status --json"))
    gpu = status["gpus"][0]
    print(f"%hami status: {gpu['memory_used'] / GiB:.2f} / {gpu['memory_limit'] / GiB:.2f} GiB, "
          f"level {gpu['memory_level']}")
    assert gpu["memory_limit"] == 4 * GiB
    assert gpu["memory_used"] > 3 * GiB and gpu["memory_level"] in ("warning", "critical")
    assert [k["kernel_id"] for k in status["kernels"]] == [km.kernel_id]
