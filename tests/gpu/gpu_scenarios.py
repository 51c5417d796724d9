"""GPU scenarios, each run as its own process (under the preload library) by tests/gpu.

    python3 gpu_scenarios.py NAME [ARGS...]

Each prints its figures and, last, ``RESULT {json}``. A scenario that fails
raises (exit code != 0); the test reads the result line and the exit code.
"""

import json
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
CHUNK = 256 * MiB


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def _fill(alloc, oom_errors, limit_bytes):
    """Allocate CHUNK-sized buffers until OOM (or twice the limit: a safety stop)."""
    held, reached, oom = [], 0, False
    try:
        while reached < 2 * limit_bytes:
            held.append(alloc(CHUNK))
            reached += CHUNK
    except oom_errors as e:
        oom = True
        print(f"out of memory after {reached / GiB:.2f} GiB: {str(e).splitlines()[0][:200]}", flush=True)
    return held, reached, oom


def torch_cap(limit_bytes):
    import torch

    free, total = torch.cuda.mem_get_info()
    print(f"torch {torch.__version__}: mem_get_info free={free} total={total}", flush=True)
    held, reached, oom = _fill(lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
                               (torch.cuda.OutOfMemoryError,), limit_bytes)
    props = torch.cuda.get_device_properties(0)
    result(total=total, free=free, reached=reached, oom=oom, chunks=len(held),
           reserved=torch.cuda.memory_reserved(), physical_total=props.total_memory,
           backend=torch.cuda.get_allocator_backend())


def torch_hold(nbytes):
    """Hold NBYTES in CHUNK tensors, say READY, wait for EOF on stdin."""
    import torch

    held = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(nbytes // CHUNK)]
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"READY holding {len(held) * CHUNK} free={free} total={total}", flush=True)
    sys.stdin.read()
    result(held=len(held) * CHUNK, free=free, total=total)


def cupy_cap(limit_bytes):
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    print(f"cupy {cupy.__version__}: memGetInfo free={free} total={total}", flush=True)
    held, reached, oom = _fill(lambda n: cupy.empty(n, dtype=cupy.uint8),
                               (cupy.cuda.memory.OutOfMemoryError,), limit_bytes)
    result(total=total, free=free, reached=reached, oom=oom, chunks=len(held))


def train():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4096, 256, device="cuda")
    y = (x[:, :10].argmax(dim=1)).cuda()  # a learnable target
    losses = []
    start = time.monotonic()
    for step in range(300):
        idx = torch.randint(0, x.shape[0], (256,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == 299:
            losses.append(round(loss.item(), 4))
    torch.cuda.synchronize()
    elapsed = time.monotonic() - start
    print(f"losses {losses} in {elapsed:.2f} s", flush=True)
    result(first_loss=losses[0], last_loss=losses[-1], seconds=elapsed,
           max_allocated=torch.cuda.max_memory_allocated())


def kernels():
    import torch

    torch.manual_seed(0)
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    mm_err = (torch.matmul(a.cuda(), b.cuda()).cpu() - a @ b).abs().max().item()
    bf = torch.matmul(a.cuda().bfloat16(), b.cuda().bfloat16()).float().cpu()
    bf_rel = ((bf - a @ b).norm() / (a @ b).norm()).item()
    torch.backends.cudnn.enabled = True
    conv = torch.nn.Conv2d(16, 32, kernel_size=3, padding=1)
    img = torch.randn(8, 16, 64, 64)
    ref = conv(img)
    out = conv.cuda()(img.cuda()).cpu()
    conv_err = (out - ref).abs().max().item()
    print(f"matmul fp32 max err {mm_err:.2e}, bf16 rel err {bf_rel:.2e}, conv max err {conv_err:.2e}, "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    result(matmul_err=mm_err, bf16_rel_err=bf_rel, conv_err=conv_err, cudnn=torch.backends.cudnn.version())


def grow(step_bytes, max_bytes):
    """Allocate STEP_BYTES at a time (PyTorch) every 0.25 s up to MAX_BYTES, printing
    after each one the wall time and the bytes held: a process past its cap."""
    import torch

    held = []
    while len(held) * step_bytes < max_bytes:
        held.append(torch.empty(step_bytes, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        print(f"HELD {len(held) * step_bytes} {time.time():.3f}", flush=True)
        time.sleep(0.25)
    result(held=len(held) * step_bytes)


def hold_hash(data_bytes, extra_bytes):
    """Fill DATA_BYTES with random bytes and print their hash (HASH), then take
    EXTRA_BYTES more (OVER: past a cap, without the library), wait for a line
    on stdin and print the data's hash again (AFTER): whatever happened to the
    process meanwhile, its data must be the same."""
    import hashlib

    import torch

    gen = torch.Generator(device="cuda").manual_seed(7)
    data = torch.randint(0, 256, (data_bytes,), dtype=torch.uint8, device="cuda", generator=gen)
    print(f"HASH {hashlib.sha256(data.cpu().numpy().tobytes()).hexdigest()}", flush=True)
    extra = torch.empty(extra_bytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print(f"OVER {time.time():.3f}", flush=True)
    sys.stdin.readline()
    print(f"AFTER {hashlib.sha256(data.cpu().numpy().tobytes()).hexdigest()}", flush=True)
    del extra


def _torch_workload():
    """Convolutions (cuDNN autotuned, three dtypes), FFT, QR, SVD and sort: the
    kinds of work that make the driver and the libraries take memory of their own."""
    import torch

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    kept = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        conv = torch.nn.Conv2d(32, 64, kernel_size=3, padding=1).cuda().to(dtype)
        kept.append(conv(torch.randn(16, 32, 128, 128, device="cuda", dtype=dtype)))
    x = torch.randn(4096, 4096, device="cuda")
    kept.append(torch.fft.fft2(x))
    kept.extend(torch.linalg.qr(x[:2048, :2048]))
    kept.append(torch.linalg.svdvals(x[:1024, :1024]))
    kept.append(torch.sort(x.flatten()).values)
    torch.cuda.synchronize()
    return f"torch {torch.__version__}", kept


def _cupy_workload():
    import cupy

    x = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
    kept = [x @ x, cupy.fft.fft2(x), *cupy.linalg.qr(x[:2048, :2048]),
            cupy.linalg.svd(x[:1024, :1024], compute_uv=False), cupy.sort(x.ravel())]
    cupy.cuda.Device().synchronize()
    return f"cupy {cupy.__version__}", kept


def _jax_workload():
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.PRNGKey(0), (4096, 4096), dtype=jnp.float32)
    kept = [x @ x, jnp.fft.fft2(x), *jnp.linalg.qr(x[:2048, :2048]),
            jnp.linalg.svd(x[:1024, :1024], compute_uv=False), jnp.sort(x.ravel())]
    for k in kept:
        k.block_until_ready()
    return f"jax {jax.__version__}", kept


def workload(framework):
    """Run a mixed workload, keep its results, say READY, wait for EOF on stdin:
    the test compares the slice's charge with NVML's figure meanwhile."""
    version, kept = {"torch": _torch_workload, "cupy": _cupy_workload, "jax": _jax_workload}[framework]()
    print(f"READY {version}, {len(kept)} results kept", flush=True)
    sys.stdin.read()
    result(framework=framework, version=version)


def main():
    name, args = sys.argv[1], sys.argv[2:]
    if name == "torch_cap":
        torch_cap(int(args[0]))
    elif name == "torch_hold":
        torch_hold(int(args[0]))
    elif name == "cupy_cap":
        cupy_cap(int(args[0]))
    elif name == "train":
        train()
    elif name == "kernels":
        kernels()
    elif name == "workload":
        workload(args[0])
    elif name == "grow":
        grow(int(args[0]), int(args[1]))
    elif name == "hold_hash":
        hold_hash(int(args[0]), int(args[1]))
    else:
        raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    main()
