#!/usr/bin/env python3
"""One GPU workload process for bench/sm_share.py (the SM-share benchmark).

Runs a PyTorch workload in a loop on cuda:0 and prints ONE JSON line on stdout
at the end: the work units (matmuls, steps or graph replays) completed in each
`--window`-second window of the measured part, their total and units_per_s.

    python3 bench/sm_worker.py --workload matmul|copy|small|graph [--seconds 10]
        [--window 0.1] [--warmup 1.0] [--ready-file F --start-file G]
        [--change-at T --change-to P [--slice PATH]]

Timing. Work is launched in batches sized to take about --sync-interval
(10 ms) each, and every batch ends with torch.cuda.synchronize(), so a batch's
end time is when its work had really finished on the GPU. A batch's units are
spread evenly over [launch of its first unit, end of its synchronize] and cut
into the windows it overlaps; batches straddling the start or the end of the
measured part count in proportion. Times are time.monotonic() (CLOCK_MONOTONIC
on Linux, the same clock in every process of the machine), reported relative
to the start of the measured part, T0.

Start. After --warmup seconds of running the workload the worker touches
--ready-file (if given). Without --start-file it then measures at once;
with it, it keeps running the workload (uncounted) until the file appears,
reads T0 from it (a time.monotonic() value written by the orchestrator) and
measures [T0, T0 + seconds]. So two workers started together measure the
same stretch of time while both are warm and busy.

Live change. With --change-at T the worker itself calls
hami_jupyter.slice.change.set_sm_share(slice, device, P, mode) at the first
batch boundary at or after T0 + T (right after launching that batch, while the
GPU is busy) and records when the call began and returned.
"""
import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("matmul", "copy", "small", "graph"), required=True)
    p.add_argument("--copy-mib", type=int, default=1024, help="MiB per device-to-device copy (copy workload)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the measured part")
    p.add_argument("--window", type=float, default=0.1, help="report granularity, seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of work before ready")
    p.add_argument("--sync-interval", type=float, default=0.01,
                   help="target seconds of work between two torch.cuda.synchronize()")
    p.add_argument("--ready-file", help="touched once warmed up")
    p.add_argument("--start-file", help="wait for this file; it holds T0 (time.monotonic())")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="give up when the start file has not come this long after ready")
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the n x n x n bf16 matmul")
    p.add_argument("--small-rows", type=int, default=8192, help="rows of the small workload's activations")
    p.add_argument("--small-width", type=int, default=512, help="width of its square weights")
    p.add_argument("--small-layers", type=int, default=8, help="matmul+relu+bias layers per step")
    p.add_argument("--change-at", type=float, help="seconds after T0 to call set_sm_share")
    p.add_argument("--change-to", type=int, help="the new share in percent")
    p.add_argument("--change-mode", choices=("hard", "elastic"), help="also change the mode")
    p.add_argument("--change-device", default="0", help="slice device index or GPU UUID (default 0)")
    p.add_argument("--slice", help="slice file for the change (default: $HAMI_SLICE)")
    p.add_argument("--label", default="", help="free text, echoed in the output")
    args = p.parse_args(argv)
    if args.window <= 0 or args.seconds < args.window:
        p.error("need 0 < --window <= --seconds")
    if args.change_at is not None:
        if args.change_to is None:
            p.error("--change-at needs --change-to")
        args.slice = args.slice or os.environ.get("HAMI_SLICE")
        if not args.slice:
            p.error("--change-at needs --slice or HAMI_SLICE")
    return args


def load_set_sm_share():
    try:
        from hami_jupyter.slice.change import set_sm_share
    except ImportError:
        sys.path.insert(0, REPO)
        from hami_jupyter.slice.change import set_sm_share
    return set_sm_share


def build_workload(args, torch):
    """(unit, flops_per_unit, description); unit() launches one unit of work."""
    dev = torch.device("cuda", 0)
    bf16 = torch.bfloat16
    if args.workload == "matmul":
        n = args.matmul_size
        a = torch.randn(n, n, device=dev, dtype=bf16)
        b = torch.randn(n, n, device=dev, dtype=bf16)
        c = torch.empty(n, n, device=dev, dtype=bf16)

        def matmul():
            torch.matmul(a, b, out=c)

        return matmul, 2.0 * n * n * n, {"unit": "matmul", "shape": [n, n, n], "dtype": "bfloat16"}
    if args.workload == "copy":
        # Memory-bound: a device-to-device copy by a kernel (an elementwise
        # copy of bf16 to bf16 through the SMs), whose speed is the memory's.
        # (cudaMemcpy between device buffers is no kernel launch: see docs/sm-share.md.)
        n = (args.copy_mib << 20) // 2
        src = torch.randn(n, device=dev, dtype=bf16)
        dst = torch.empty(n, device=dev, dtype=bf16)

        def copy():
            torch.mul(src, 1, out=dst)

        return copy, 0.0, {"unit": "copy", "bytes": 2 * n, "how": "elementwise kernel dst = src * 1, bf16"}

    rows, width, layers = args.small_rows, args.small_width, args.small_layers
    x = torch.randn(rows, width, device=dev, dtype=bf16)
    weights = [torch.randn(width, width, device=dev, dtype=bf16) * width ** -0.5 for _ in range(layers)]
    biases = [torch.randn(width, device=dev, dtype=bf16) * 0.01 for _ in range(layers)]
    bufs = [torch.empty(rows, width, device=dev, dtype=bf16) for _ in range(layers)]

    def step():
        h = x
        for w, bias, buf in zip(weights, biases, bufs):
            torch.matmul(h, w, out=buf)  # [rows, width] x [width, width]
            buf.relu_()
            buf.add_(bias)
            h = buf
        return h

    flops = layers * 2.0 * rows * width * width
    desc = {"unit": "step", "rows": rows, "width": width, "layers": layers,
            "kernels_per_step": 3 * layers, "dtype": "bfloat16"}
    if args.workload == "small":
        return step, flops, desc

    # CUDA graph of the same step (static buffers, captured after a side-stream warm-up).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()

    def replay():
        graph.replay()

    desc = dict(desc, unit="graph replay (one step)")
    return replay, flops, desc


def read_start(path):
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def windows_from_batches(batches, t0, n, width):
    """Units per window over [t0, t0 + n*width], each batch spread over its span."""
    win = [0.0] * n
    end = n * width
    for ts, _tl, te, units in batches:
        a, b = ts - t0, te - t0
        if b <= 0 or a >= end:
            continue
        lo, hi = max(a, 0.0), min(b, end)
        span = b - a
        if span <= 0:
            win[min(n - 1, int(lo / width))] += units
            continue
        i = min(n - 1, int(lo / width))
        last = min(n - 1, int(hi / width))
        while i <= last:
            w_lo, w_hi = i * width, (i + 1) * width
            overlap = min(hi, w_hi) - max(lo, w_lo)
            if overlap > 0:
                win[i] += units * overlap / span
            i += 1
    return win


def main():
    args = parse_args()
    clock = time.monotonic
    t_begin = clock()
    import torch

    t_imported = clock()
    set_sm_share = load_set_sm_share() if args.change_at is not None else None
    if not torch.cuda.is_available():
        raise SystemExit("sm_worker: torch sees no CUDA device")
    torch.cuda.set_device(0)
    unit, flops, desc = build_workload(args, torch)
    torch.cuda.synchronize()
    t_setup = clock()

    n_win = max(1, int(round(args.seconds / args.window)))
    measure_s = n_win * args.window
    change_device = int(args.change_device) if args.change_device.isdigit() else args.change_device
    change = None
    change_pending = args.change_at is not None
    ppid = os.getppid()

    batches = []  # (launch start, launches done, synchronize returned, units)
    batch = 1
    warm_end = clock() + args.warmup
    t_ready = None
    t0 = None
    while True:
        ts = clock()
        for _ in range(batch):
            unit()
        tl = clock()
        if change_pending and t0 is not None and tl - t0 >= args.change_at:
            change_pending = False
            change = {"requested_at": args.change_at, "to": args.change_to, "mode": args.change_mode,
                      "device": change_device, "slice": args.slice}
            ca = clock()
            try:
                change["generation"] = set_sm_share(args.slice, change_device, args.change_to,
                                                    mode=args.change_mode)
            except Exception as e:  # recorded; the run goes on so the rest is still measured
                change["error"] = f"{type(e).__name__}: {e}"
            cb = clock()
            change["at"] = ca - t0
            change["done"] = cb - t0
        torch.cuda.synchronize()
        te = clock()
        batches.append((ts, tl, te, batch))
        # Size the next batch for about sync_interval of wall time (growth at most 4x).
        dt = te - ts
        want = batch * args.sync_interval / dt if dt > 0 else batch * 4
        batch = max(1, min(batch * 4, int(want + 0.5)))

        if t0 is None:
            if te < warm_end:
                continue
            if t_ready is None:
                t_ready = te
                if args.ready_file:
                    with open(args.ready_file, "w") as f:
                        f.write(f"{te}\n")
            if not args.start_file:
                t0 = te
            else:
                t0 = read_start(args.start_file) if os.path.exists(args.start_file) else None
                if t0 is None:
                    if te - t_ready > args.start_timeout:
                        raise SystemExit(f"sm_worker: no start file after {args.start_timeout} s")
                    if os.getppid() != ppid:
                        raise SystemExit("sm_worker: orchestrator gone")
        elif te >= t0 + measure_s:
            break

    if t0 < batches[0][0]:  # cannot happen: T0 comes after warm-up batches
        raise SystemExit("sm_worker: T0 lies before the first batch")
    win = windows_from_batches(batches, t0, n_win, args.window)
    total = sum(win)
    measured = [b for b in batches if b[2] > t0 and b[0] < t0 + measure_s]
    busy = sum(te - ts for ts, _tl, te, _u in measured)
    waited = sum(te - tl for _ts, tl, te, _u in measured)
    out = {
        "workload": args.workload,
        "label": args.label,
        "desc": desc,
        "flops_per_unit": flops,
        "seconds": measure_s,
        "window": args.window,
        "window_start": [round(i * args.window, 6) for i in range(n_win)],
        "window_units": [round(u, 4) for u in win],
        "units": round(total, 4),
        "elapsed": measure_s,
        "units_per_s": total / measure_s,
        "tflops": total / measure_s * flops / 1e12,
        "batches": len(measured),
        "mean_batch_s": busy / len(measured) if measured else None,
        "max_batch_s": max((te - ts for ts, _tl, te, _u in measured), default=None),
        "sync_wait_frac": waited / busy if busy > 0 else None,
        "import_s": t_imported - t_begin,
        "setup_s": t_setup - t_imported,
        "ready_to_start_s": t0 - t_ready,
        "change": change,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("HAMI_SLICE", "CUDA_DEVICE_SM_LIMIT", "HAMI_SM_MODE",
                                               "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")},
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
