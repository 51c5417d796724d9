"""A notebook kernel started by HamiProvisioner runs PyTorch under its cap (real GPU).

The kernel is a real ipykernel started by a real KernelManager from the
``hami-python3`` kernelspec; the test talks to it over its channels, as
JupyterLab would.
"""

import json

import pytest
from gpu_helpers import fast_park_env, run_in_kernel

pytestmark = pytest.mark.gpu

GiB = 1 << 30

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


def test_provisioned_kernel_runs_torch_under_its_cap(hami_kernel):
    km, kc = hami_kernel("4g")
    r = json.loads(run_in_kernel(kc, FILL).strip().splitlines()[-1])
    print(f"kernel {km.kernel_id}: torch total {r['total']}, {r['tensors']} x 256 MiB before OOM")
    assert r["total"] == 4 * GiB
    assert r["oom"] and 8 <= r["tensors"] <= 16
    status = json.loads(run_in_kernel(kc, "%hami status --json"))
    gpu = status["gpus"][0]
    print(f"%hami status: {gpu['memory_used'] / GiB:.2f} / {gpu['memory_limit'] / GiB:.2f} GiB, "
          f"level {gpu['memory_level']}")
    assert gpu["memory_limit"] == 4 * GiB
    assert gpu["memory_used"] > 3 * GiB and gpu["memory_level"] in ("warning", "critical")
    assert [k["kernel_id"] for k in status["kernels"]] == [km.kernel_id]


@pytest.mark.parametrize("asks,cap,tensors", [("64g", 4 * GiB, (8, 16)), ("2g", 2 * GiB, (4, 8))],
                         ids=["more", "less-nested"])
def test_plain_kernelspec_under_the_hub_runs_torch_in_the_hubs_slice(tmp_path, monkeypatch, preload_lib,
                                                                     asks, cap, tensors):
    """Under a hub slice every kernel goes through the provisioner: a kernelspec
    with no provisioner metadata, as ipykernel installs it, asking for 64 GiB
    in its env, still gets the hub's 4 GiB slice; one asking for 2 GiB gets
    that cap nested inside the slice (issue 12, items 1 and 2)."""
    jupyter_client = pytest.importorskip("jupyter_client")
    import os
    import sys

    from hami_jupyter.hub.policy import parse_size_spec
    from hami_jupyter.hub.slice_files import prepare_user_slice
    from hami_jupyter.provisioning.factory import route_every_kernel, stop_routing

    for name in list(os.environ):
        if name.startswith(("HAMI_", "CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM")):
            monkeypatch.delenv(name)
    for name, value in fast_park_env().items():
        monkeypatch.setenv(name, value)
    root = tmp_path / "hub"
    path = prepare_user_slice("alice", parse_size_spec("gpu", {"memory": "4g"}), os.getuid(), os.getgid(),
                              str(root))
    spec = tmp_path / "kernels" / "kernels" / "plain"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain", "language": "python", "env": {"CUDA_DEVICE_MEMORY_LIMIT": asks}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "kernels"))
    monkeypatch.setenv("HAMI_SLICE_ROOT", str(root))
    monkeypatch.setenv("HAMI_SLICE", str(path))
    monkeypatch.setenv("HAMI_HUB_SLICE", str(path))
    route_every_kernel()
    km = jupyter_client.KernelManager(kernel_name="plain")
    try:
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        r = json.loads(run_in_kernel(kc, FILL).strip().splitlines()[-1])
        print(f"plain kernelspec asking {asks} under a 4 GiB hub slice: torch total {r['total']}, "
              f"{r['tensors']} x 256 MiB before OOM")
        assert r["total"] == cap
        assert r["oom"] and tensors[0] <= r["tensors"] <= tensors[1]
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
        stop_routing()
