#!/usr/bin/env python3
"""One GPU workload process for bench/sm_share.py (the SM-share benchmark).

Runs a PyTorch workload in a loop on cuda:0 and prints ONE JSON line on stdout
at the end: the work units (matmuls, steps or graph replays) completed in each
`--window`-second window of the measured part, their total and units_per_s.

    python3 bench/sm_worker.py --workload WORKLOAD [--seconds 10]
        [--window 0.1] [--warmup 1.0] [--ready-file F --start-file G]
        [--change-at T --change-to P [--slice PATH]] [size flags]

Workloads (each unit takes milliseconds on an H100 at the default sizes):

  matmul        bf16 n^3 matmul (--matmul-size, 8192), random data
  matmul_const  the same on torch.ones inputs: constant data toggles fewer
                bits, draws less power, so a power-capped GPU clocks higher
  matmul_fp32   fp32 n^3 matmul with TF32 off (--fp32-size, 4096)
  matmul_fp8    torch._scaled_mm on float8_e4m3fn inputs, tensor-wise scales,
                bf16 out (--fp8-size, 8192); needs compute capability >= 8.9
  copy          memory-bound: dst = src * 1 over --copy-mib MiB of bf16
  small         short kernels launched one by one (--small-*)
  graph         the same step as one CUDA graph replay
  conv          a small conv net (--conv-blocks x Conv2d+BatchNorm+ReLU,
                avg pool, linear), bf16, channels_last, forward + backward +
                SGD step on one fixed random batch (--conv-*)
  attention     scaled_dot_product_attention forward + backward, bf16
                (--attn-batch/heads/seq/dim)

A workload that cannot run here (fp8 on a GPU below 8.9, a torch without
float8) prints one line {"skipped": "why", ...} and exits 0 without
measuring; the orchestrator reports its rows as "not run".

Timing. Work is launched in batches sized to take about --sync-interval
(10 ms) each, and every batch ends with torch.cuda.synchronize(), so a batch's
end time is when its work had really finished on the GPU. A batch's units are
spread evenly over [launch of its first unit, end of its synchronize] and cut
into the windows it overlaps; batches straddling the start or the end of the
measured part count in proportion. Times are time.monotonic() (CLOCK_MONOTONIC
on Linux, the same clock in every process of the machine), reported relative
to the start of the measured part, T0. bench/sm_worker_jax.py uses the same
loop (measure(), below) with JAX's block_until_ready as the synchronize.

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

WORKLOADS = ("matmul", "matmul_const", "matmul_fp32", "matmul_fp8", "copy", "small", "graph", "conv",
             "attention")


class Skip(Exception):
    """This workload cannot run with this GPU or software; the message says why."""


def add_loop_args(p):
    """Flags of the measuring loop, shared with bench/sm_worker_jax.py."""
    p.add_argument("--seconds", type=float, default=10.0, help="length of the measured part")
    p.add_argument("--window", type=float, default=0.1, help="report granularity, seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of work before ready")
    p.add_argument("--sync-interval", type=float, default=0.01,
                   help="target seconds of work between two synchronizes")
    p.add_argument("--ready-file", help="touched once warmed up")
    p.add_argument("--start-file", help="wait for this file; it holds T0 (time.monotonic())")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="give up when the start file has not come this long after ready")
    p.add_argument("--label", default="", help="free text, echoed in the output")


def check_loop_args(p, args):
    if args.window <= 0 or args.seconds < args.window:
        p.error("need 0 < --window <= --seconds")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    add_loop_args(p)
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the bf16 matmul (matmul, matmul_const)")
    p.add_argument("--fp32-size", type=int, default=4096, help="n of the fp32 matmul")
    p.add_argument("--fp8-size", type=int, default=8192, help="n of the fp8 matmul (a multiple of 16)")
    p.add_argument("--copy-mib", type=int, default=1024, help="MiB per device-to-device copy (copy workload)")
    p.add_argument("--small-rows", type=int, default=8192, help="rows of the small workload's activations")
    p.add_argument("--small-width", type=int, default=512, help="width of its square weights")
    p.add_argument("--small-layers", type=int, default=8, help="matmul+relu+bias layers per step")
    p.add_argument("--conv-batch", type=int, default=128, help="images per conv step")
    p.add_argument("--conv-channels", type=int, default=128, help="channels of every conv block")
    p.add_argument("--conv-size", type=int, default=56, help="height = width of the images")
    p.add_argument("--conv-blocks", type=int, default=4, help="Conv2d+BatchNorm+ReLU blocks")
    p.add_argument("--attn-batch", type=int, default=8)
    p.add_argument("--attn-heads", type=int, default=16)
    p.add_argument("--attn-seq", type=int, default=4096)
    p.add_argument("--attn-dim", type=int, default=128, help="head dimension")
    p.add_argument("--change-at", type=float, help="seconds after T0 to call set_sm_share")
    p.add_argument("--change-to", type=int, help="the new share in percent")
    p.add_argument("--change-mode", choices=("hard", "elastic"), help="also change the mode")
    p.add_argument("--change-device", default="0", help="slice device index or GPU UUID (default 0)")
    p.add_argument("--slice", help="slice file for the change (default: $HAMI_SLICE)")
    args = p.parse_args(argv)
    check_loop_args(p, args)
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


def fp8_skip_reason(has_fp8, capability, device_name):
    """Why the fp8 matmul cannot run here, or None. Hopper (9.0) and Ada (8.9)
    have fp8 tensor cores; cuBLASLt refuses float8 matmuls below that."""
    if not has_fp8:
        return "this torch has no torch.float8_e4m3fn / torch._scaled_mm"
    if tuple(capability) < (8, 9):
        return (f"fp8 matmul needs compute capability >= 8.9; {device_name} is "
                f"{capability[0]}.{capability[1]}")
    return None


def _square(torch, dev, n, dtype, fill):
    if fill == "ones":
        return torch.ones(n, n, device=dev, dtype=dtype)
    return torch.randn(n, n, device=dev, dtype=dtype)


def build_matmul(args, torch, dev):
    wl = args.workload
    if wl == "matmul_fp8":
        reason = fp8_skip_reason(hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm"),
                                 torch.cuda.get_device_capability(dev), torch.cuda.get_device_name(dev))
        if reason:
            raise Skip(reason)
        n = args.fp8_size
        a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
        # _scaled_mm wants its second operand column-major: the transpose of a row-major tensor.
        b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
        scale_a = torch.tensor(1.0, device=dev)
        scale_b = torch.tensor(1.0, device=dev)

        def matmul_fp8():
            torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

        return matmul_fp8, 2.0 * n ** 3, {"unit": "matmul", "shape": [n, n, n], "dtype": "float8_e4m3fn",
                                          "how": "torch._scaled_mm, tensor-wise scales 1.0, bf16 out",
                                          "data": "random"}
    if wl == "matmul_fp32":
        # TF32 off: the fp32 path proper (CUDA cores' FMA), not tensor cores.
        # Newer torch has fp32_precision and warns about (later refuses) the
        # old flag; set whichever this torch has, never both.
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = False
        n, dtype, fill = args.fp32_size, torch.float32, "random"
    else:
        n, dtype, fill = args.matmul_size, torch.bfloat16, ("ones" if wl == "matmul_const" else "random")
    a = _square(torch, dev, n, dtype, fill)
    b = _square(torch, dev, n, dtype, fill)
    c = torch.empty(n, n, device=dev, dtype=dtype)

    def matmul():
        torch.matmul(a, b, out=c)

    desc = {"unit": "matmul", "shape": [n, n, n], "dtype": str(dtype).replace("torch.", ""),
            "data": "torch.ones" if fill == "ones" else "random"}
    if wl == "matmul_fp32":
        desc["tf32"] = False
    return matmul, 2.0 * n ** 3, desc


def build_copy(args, torch, dev):
    # Memory-bound: a device-to-device copy by a kernel (an elementwise
    # copy of bf16 to bf16 through the SMs), whose speed is the memory's.
    # (cudaMemcpy between device buffers is no kernel launch: see docs/sm-share.md.)
    n = (args.copy_mib << 20) // 2
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dst = torch.empty(n, device=dev, dtype=torch.bfloat16)

    def copy():
        torch.mul(src, 1, out=dst)

    return copy, 0.0, {"unit": "copy", "bytes": 2 * n, "how": "elementwise kernel dst = src * 1, bf16"}


def build_short(args, torch, dev):
    bf16 = torch.bfloat16
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


def build_conv(args, torch, dev):
    nn = torch.nn
    torch.backends.cudnn.benchmark = True  # pick the fastest kernels once, in setup
    torch.manual_seed(0)
    c, size, batch, blocks = args.conv_channels, args.conv_size, args.conv_batch, args.conv_blocks
    layers, c_in = [], 3
    for _ in range(blocks):
        layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        c_in = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)]
    model = nn.Sequential(*layers).to(device=dev, dtype=torch.bfloat16, memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=dev, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(3):  # cudnn's benchmark runs here, not in the warm-up
        step()
    # Forward 2*B*H*W*Cin*Cout*9 per conv; backward about twice that.
    conv_flops = sum(2.0 * batch * size * size * ci * c * 9 for ci in [3] + [c] * (blocks - 1))
    return step, 3 * conv_flops, {"unit": "training step", "batch": batch, "channels": c, "size": size,
                                  "blocks": blocks, "dtype": "bfloat16", "memory_format": "channels_last",
                                  "optimizer": "SGD momentum 0.9", "flops": "convolutions only"}


def build_attention(args, torch, dev):
    torch.manual_seed(0)
    shape = (args.attn_batch, args.attn_heads, args.attn_seq, args.attn_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def step():
        out = sdpa(q, k, v)
        torch.autograd.grad(out, (q, k, v), grad_out)

    b, h, s, d = shape
    fwd = 4.0 * b * h * s * s * d
    return step, 3.5 * fwd, {"unit": "forward + backward", "shape": list(shape), "dtype": "bfloat16",
                             "causal": False, "flops": "forward 4*B*H*S^2*D, backward 2.5 times that"}


BUILDERS = {"matmul": build_matmul, "matmul_const": build_matmul, "matmul_fp32": build_matmul,
            "matmul_fp8": build_matmul, "copy": build_copy, "small": build_short, "graph": build_short,
            "conv": build_conv, "attention": build_attention}


def build_workload(args, torch, dev=None):
    """(unit, flops_per_unit, description); unit() launches one unit of work.
    Raises Skip when the workload cannot run here."""
    dev = dev if dev is not None else torch.device("cuda", 0)
    return BUILDERS[args.workload](args, torch, dev)


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


def measure(args, unit, sync, change_fn=None, clock=time.monotonic):
    """Run unit() in synchronized batches through warm-up, ready, start and the
    measured part. change_fn(t0) is called once at the first batch boundary at
    or after T0 + --change-at (after the launch, before the synchronize) and
    returns what to record. Returns (batches, t0, t_ready, change)."""
    n_win = max(1, int(round(args.seconds / args.window)))
    measure_s = n_win * args.window
    change_at = getattr(args, "change_at", None)
    change = None
    change_pending = change_fn is not None and change_at is not None
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
        if change_pending and t0 is not None and tl - t0 >= change_at:
            change_pending = False
            change = change_fn(t0)
        sync()
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
    return batches, t0, t_ready, change


def report(args, batches, t0, t_ready, flops, desc):
    """The JSON fields every worker prints about its measured part."""
    n_win = max(1, int(round(args.seconds / args.window)))
    measure_s = n_win * args.window
    win = windows_from_batches(batches, t0, n_win, args.window)
    total = sum(win)
    measured = [b for b in batches if b[2] > t0 and b[0] < t0 + measure_s]
    busy = sum(te - ts for ts, _tl, te, _u in measured)
    waited = sum(te - tl for _ts, tl, te, _u in measured)
    return {
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
        "ready_to_start_s": t0 - t_ready,
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("HAMI_SLICE", "CUDA_DEVICE_SM_LIMIT", "HAMI_SM_MODE",
                                               "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")},
    }


def print_skipped(reason, args):
    """The one line a worker prints instead of a measurement."""
    print(json.dumps({"skipped": reason, "workload": args.workload, "label": args.label}), flush=True)


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
    try:
        unit, flops, desc = build_workload(args, torch)
    except Skip as e:
        print_skipped(str(e), args)
        return
    torch.cuda.synchronize()
    t_setup = clock()

    change_device = int(args.change_device) if args.change_device.isdigit() else args.change_device

    def change_fn(t0):
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
        return change

    batches, t0, t_ready, change = measure(args, unit, torch.cuda.synchronize,
                                           change_fn if set_sm_share else None, clock)
    out = report(args, batches, t0, t_ready, flops, desc)
    out.update({"import_s": t_imported - t_begin, "setup_s": t_setup - t_imported, "change": change,
                "device": torch.cuda.get_device_name(0),
                "capability": list(torch.cuda.get_device_capability(0)), "torch": torch.__version__})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
