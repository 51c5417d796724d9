"""Live means live, on the real GPU: a running PyTorch kernel follows `hami-jupyter slice set`.

A kernel under a 2 GiB cap fails to allocate 3 GiB; the cap is raised to
4 GiB from outside (the CLI, as an admin would) and the same kernel's next
try succeeds. Then its SM share is lowered while a matmul loop runs, and the
loop slows down. The figures are printed for the issue note.
"""

import json

import pytest
from gpu_helpers import run_in_kernel

pytestmark = pytest.mark.gpu

RAISE = """
import json, subprocess, sys, time, os, torch
x = torch.empty(1, device="cuda")
try:
    torch.empty(3 << 30, dtype=torch.uint8, device="cuda"); before = "ok"
except torch.cuda.OutOfMemoryError:
    before = "oom"
subprocess.run([sys.executable, "-m", "hami_jupyter", "slice", "set", os.environ["HAMI_SLICE"],
                "--memory", "4g"], check=True, capture_output=True)
t0 = time.monotonic(); after = None
while time.monotonic() - t0 < 5:
    try:
        big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda"); after = time.monotonic() - t0; break
    except torch.cuda.OutOfMemoryError:
        time.sleep(0.01)
print(json.dumps({"before": before, "after_s": after, "total": torch.cuda.mem_get_info()[1]}))
"""

SLOW = """
import json, subprocess, sys, time, os, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
windows, t_start, changed = [], time.monotonic(), None
while time.monotonic() - t_start < 6:
    w0, n = time.monotonic(), 0
    while time.monotonic() - w0 < 0.2:
        (a @ a); n += 1
        torch.cuda.synchronize()
    windows.append((round(w0 - t_start, 2), n / (time.monotonic() - w0)))
    if changed is None and time.monotonic() - t_start > 2:
        subprocess.run([sys.executable, "-m", "hami_jupyter", "slice", "set", os.environ["HAMI_SLICE"],
                        "--sm", "25"], check=True, capture_output=True)
        changed = time.monotonic() - t_start
print(json.dumps({"changed_at": changed, "windows": windows}))
"""


def run_json(kc, code):
    return json.loads(run_in_kernel(kc, code).strip().splitlines()[-1])


def test_raised_cap_lets_the_running_kernel_allocate(hami_kernel):
    r = run_json(hami_kernel("2g")[1], RAISE)
    print(f"3 GiB under 2 GiB: {r['before']}; after the CLI raised the cap to 4 GiB: "
          f"succeeded {r['after_s']} s later; torch now sees {r['total']} bytes")
    assert r["before"] == "oom"
    assert r["after_s"] is not None and r["after_s"] <= 1.0
    assert r["total"] == 4 << 30


def test_lowered_sm_share_slows_the_running_loop(hami_kernel):
    r = run_json(hami_kernel("2g")[1], SLOW)
    changed, windows = r["changed_at"], r["windows"]
    before = [rate for t, rate in windows if 0.5 <= t < changed - 0.2]
    base = sorted(before)[len(before) // 2]
    slowed = next(t for t, rate in windows if t >= changed and rate < 0.6 * base)
    late = [rate for t, rate in windows if t >= changed + 2]
    print(f"matmul {base:.0f}/s before; share 25 % set at {changed:.2f} s; first window under 60 %: "
          f"{slowed:.2f} s ({slowed - changed:.2f} s after); last 2 s: "
          f"{sum(late) / len(late) / base * 100:.1f} % of before")
    assert slowed - changed <= 1.0
