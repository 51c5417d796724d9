#!/usr/bin/env python3
"""The JAX workload of bench/sm_share.py: issue 29's loop.

A bf16 n x n x n jnp matmul (--matmul-size, 8192) on jnp.ones inputs,
jitted, in a loop on JAX's first GPU. The same protocol and timing as
bench/sm_worker.py (it imports that file's measure() and report()): batches
sized to about --sync-interval, each ending with block_until_ready() on its
last result (the calls run in order on one stream, so the last one done means
all are), one JSON line at the end.

    python3 bench/sm_worker_jax.py [--workload jax] [--seconds 10] [--window 0.1]
        [--warmup 1.0] [--ready-file F --start-file G] [--matmul-size 8192]

Without an importable jax, or with a jax that has no GPU backend, it prints
{"skipped": "why", ...} and exits 0; the orchestrator then reports the
jax rows as "not run". JAX would take 75 % of the GPU's memory up front by
default; XLA_PYTHON_CLIENT_PREALLOCATE=false (unless the caller set it)
keeps it to what the loop needs, which does not change its speed.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sm_worker  # noqa: E402 (the shared loop; it imports no torch at module level)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("jax",), default="jax")
    sm_worker.add_loop_args(p)
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the bf16 matmul")
    args = p.parse_args(argv)
    sm_worker.check_loop_args(p, args)
    return args


def main():
    args = parse_args()
    clock = time.monotonic
    t_begin = clock()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:  # ImportError, or a broken install failing inside its import
        sm_worker.print_skipped(f"jax is not importable ({type(e).__name__}: {e})", args)
        return
    t_imported = clock()
    try:
        dev = jax.devices("gpu")[0]
    except Exception as e:  # RuntimeError: no GPU backend in this jax
        sm_worker.print_skipped(f"jax {jax.__version__} has no GPU backend ({type(e).__name__}: {e})", args)
        return

    n = args.matmul_size
    a = jax.device_put(jnp.ones((n, n), dtype=jnp.bfloat16), dev)
    b = jax.device_put(jnp.ones((n, n), dtype=jnp.bfloat16), dev)
    matmul = jax.jit(jnp.matmul)
    last = [matmul(a, b)]  # compiles here, not in the warm-up
    last[0].block_until_ready()
    t_setup = clock()

    def unit():
        last[0] = matmul(a, b)

    def sync():
        last[0].block_until_ready()

    batches, t0, t_ready, _change = sm_worker.measure(args, unit, sync, None, clock)
    desc = {"unit": "matmul", "shape": [n, n, n], "dtype": "bfloat16", "data": "jnp.ones",
            "how": "jax.jit(jnp.matmul), block_until_ready per batch"}
    out = sm_worker.report(args, batches, t0, t_ready, 2.0 * n ** 3, desc)
    out.update({"import_s": t_imported - t_begin, "setup_s": t_setup - t_imported, "change": None,
                "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__, "torch": None})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
