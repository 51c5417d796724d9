"""Kernel start time: hami-provisioner against jupyter_client's local-provisioner.

Starts the same ipykernel N times through each provisioner, alternating so
that drift in the machine's speed hits both alike, and times
``start_kernel()`` + ``wait_for_ready()`` (what a user waits for after
choosing a kernel). The HAMi kernel starts in a slice with a memory cap; on a
machine without an NVIDIA driver both kernels see the simulated GPU.

    python3 bench/kernel_start.py [--rounds 15] [--out result.json]

Target (issue 4): at most 100 ms added by hami-provisioner.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]


def plain_kernelspec(workdir):
    """A kernelspec identical to hami-python3 except for the provisioner."""
    spec = json.loads((REPO / "share/jupyter/kernels/hami-python3/kernel.json").read_text())
    spec["display_name"] = "Python 3 (local-provisioner)"
    spec["metadata"]["kernel_provisioner"] = {"provisioner_name": "local-provisioner", "config": {}}
    d = Path(workdir) / "kernels" / "bench-local"
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(json.dumps(spec))
    return str(Path(workdir))


def start_once(name):
    km = KernelManager(kernel_name=name)
    t0 = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    elapsed = time.perf_counter() - t0
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="hami-bench-start-")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [plain_kernelspec(work), str(REPO / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")])
    os.environ["HAMI_SLICE_ROOT"] = str(Path(work) / "slices")
    os.environ.setdefault("HAMI_MEMORY_LIMIT", "4g")
    if not os.path.exists("/proc/driver/nvidia/version"):
        sys.path.insert(0, str(REPO))
        from hami_jupyter import native
        os.environ.update(native.sim_env(Path(work) / "sim", base={}))
    specs = KernelSpecManager().find_kernel_specs()
    assert "hami-python3" in specs and "bench-local" in specs, specs

    for name in ("bench-local", "hami-python3"):  # warm caches (imports, page cache)
        start_once(name)
    times = {"local-provisioner": [], "hami-provisioner": []}
    for _ in range(args.rounds):
        times["local-provisioner"].append(start_once("bench-local"))
        times["hami-provisioner"].append(start_once("hami-python3"))

    result = {k: {"median_ms": 1e3 * statistics.median(v), "min_ms": 1e3 * min(v),
                  "max_ms": 1e3 * max(v)} for k, v in times.items()}
    paired = [1e3 * (h - l) for h, l in zip(times["hami-provisioner"], times["local-provisioner"])]
    result["added_median_ms"] = statistics.median(paired)
    result["rounds"] = args.rounds
    for k in ("local-provisioner", "hami-provisioner"):
        r = result[k]
        print(f"{k:18s} median {r['median_ms']:7.1f} ms  (min {r['min_ms']:.1f}, max {r['max_ms']:.1f})")
    print(f"added by hami-provisioner: median of paired differences {result['added_median_ms']:+.1f} ms "
          f"over {args.rounds} rounds")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
