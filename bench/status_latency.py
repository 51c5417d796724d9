"""How long ``%hami status`` takes: reading the slice, then the text and HTML views.

    python3 bench/status_latency.py [--reads N] [--processes P]

Runs on the simulated GPU (no NVIDIA driver needed): makes a slice in a
temporary folder, starts P ``cudrive`` processes under the preload library
in it (two "kernels", each process holding 100 MiB and its 64 MiB
context, P at most 64), then times N rounds of
``slice_status`` (read), ``format_text`` and ``format_html``, and prints the
median and 99th percentile of each in milliseconds. The target is a read
well under 10 ms: ``%hami watch`` does one every second.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hami_jupyter import native  # noqa: E402
from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.slice.limits import Limits  # noqa: E402
from hami_jupyter.slice.settings import AskedLimits  # noqa: E402
from hami_jupyter.slice.create import ensure_slice  # noqa: E402
from hami_jupyter.slice.status import format_text, slice_status  # noqa: E402
from hami_jupyter.slice.status_html import format_html  # noqa: E402

KERNELS = ("bench-kernel-a", "bench-kernel-b")
MAX_PROCESSES = 64
WAIT_S = 30


def clean_environment():
    """This environment without anything that would configure the preload library."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HAMI_", "CUDA_DEVICE_")) and k != "LD_PRELOAD"}


def start_process(path, tmp, kernel_id, procs):
    """Start one cudrive in the slice (added to *procs* at once, so it is always ended)."""
    env = native.sim_env(
        tmp / "sim-state", base=clean_environment(),
        HAMI_SIM_DEVICES=1, HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m",
        HAMI_SCHEDULE_DIR=tmp, LD_PRELOAD=native.library_path(),
        HAMI_SLICE=path, HAMI_KERNEL_ID=kernel_id,
    )
    proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)
    procs.append(proc)
    proc.stdin.write("init\nctx 0\nalloc 100m\n")
    proc.stdin.flush()
    for _ in range(3):  # one JSON answer per command; all must succeed
        answer = json.loads(proc.stdout.readline() or '{"rc": "no answer"}')
        if answer["rc"] != 0:
            raise SystemExit(f"cudrive {proc.pid} failed: {answer}")


def status_views(path):
    """What ``%hami status`` does: read once, render both views."""
    status = slice_status(path)
    return format_text(status), format_html(status)


def time_ms(fn, arg, reads):
    samples = []
    for _ in range(reads):
        t0 = time.perf_counter()
        fn(arg)
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    if not 1 <= args.processes <= MAX_PROCESSES:
        parser.error(f"--processes must be 1 to {MAX_PROCESSES} (each holds 164 MiB of 12 GiB)")

    with tempfile.TemporaryDirectory(prefix="hami-bench-") as tmp:
        tmp = Path(tmp)
        path = tmp / "bench.slice"
        ensure_slice(path, "bench", AskedLimits(Limits(memory_limit=12 << 30, sm_share=50)))
        procs = []
        try:
            for i in range(args.processes):
                kernel_id = KERNELS[i % len(KERNELS)]
                start_process(path, tmp, kernel_id, procs)
                # Register the kernels, as the provisioner does, so the registry is read too.
                kernel_registry.register(path, kernel_registry.new_entry(
                    path, kernel_id, "bench", "hami-python3", os.getpid()))
            status = slice_status(path)
            live = sum(len(k["processes"]) for k in status["kernels"])
            print(f"slice with {live} live processes, {len(status['kernels'])} kernels, "
                  f"{status['gpus'][0]['memory_used'] >> 20} MiB used; {args.reads} reads")
            rows = [
                ("slice_status (read)", time_ms(slice_status, path, args.reads)),
                ("format_text", time_ms(format_text, status, args.reads)),
                ("format_html", time_ms(format_html, status, args.reads)),
                ("all three", time_ms(status_views, path, args.reads)),
            ]
            print(f"{'step':<22}{'median ms':>10}{'p99 ms':>10}")
            for name, (median, p99) in rows:
                print(f"{name:<22}{median:>10.3f}{p99:>10.3f}")
        finally:
            for p in procs:
                p.stdin.close()  # cudrive exits at end of input
            for p in procs:
                p.wait(timeout=WAIT_S)


if __name__ == "__main__":
    main()
