"""A notebook kernel started by HamiProvisioner runs PyTorch under its cap (real GPU).

The kernel is a real ipykernel started by a real KernelManager from the
``hami-python3`` kernelspec; the test talks to it over its channels, as
JupyterLab would.
"""

import json

import pytest
from gpu_helpers import run_in_kernel

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
