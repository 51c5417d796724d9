"""The workers' shared measuring loop (bench/sm_worker.py's measure() and
report(), which bench/sm_worker_jax.py uses too), on a made-up clock: a unit
of work takes 1 ms of GPU time, so a 1-s measured part counts 1000 units
however the batches fall. No torch, no GPU, nothing timed."""
import argparse
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
spec = importlib.util.spec_from_file_location("sm_worker", BENCH / "sm_worker.py")
sm_worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm_worker)


class FakeGPU:
    """Launches queue 1 ms of work each; a synchronize waits for all of it."""

    def __init__(self):
        self.now = 100.0
        self.queued = 0

    def clock(self):
        return self.now

    def unit(self):
        self.queued += 1

    def sync(self):
        self.now += 0.001 * self.queued
        self.queued = 0


def loop_args(tmp_path, **over):
    p = argparse.ArgumentParser()
    sm_worker.add_loop_args(p)
    a = p.parse_args(["--seconds", "1", "--warmup", "0.2", "--ready-file", str(tmp_path / "ready")])
    a.workload = "matmul"
    for k, v in over.items():
        setattr(a, k, v)
    return a


def test_a_measured_second_counts_the_units_done_in_it(tmp_path):
    gpu = FakeGPU()
    a = loop_args(tmp_path)
    batches, t0, t_ready, change = sm_worker.measure(a, gpu.unit, gpu.sync, None, gpu.clock)
    out = sm_worker.report(a, batches, t0, t_ready, 2.0, {"unit": "matmul"})
    assert (tmp_path / "ready").exists() and change is None
    assert out["units_per_s"] == pytest.approx(1000, rel=1e-6)
    assert len(out["window_units"]) == 10
    assert all(w == pytest.approx(100, rel=1e-6) for w in out["window_units"])
    # batches grew to about --sync-interval (10 ms) of work each
    assert max(u for _s, _l, _e, u in batches) == 10


def test_the_change_is_made_once_at_its_time_after_the_start(tmp_path):
    gpu = FakeGPU()
    a = loop_args(tmp_path, change_at=0.5)
    calls = []

    def change(t0):
        calls.append(gpu.clock() - t0)
        return {"at": calls[-1]}

    _b, _t0, _r, done = sm_worker.measure(a, gpu.unit, gpu.sync, change, gpu.clock)
    assert len(calls) == 1 and 0.5 <= calls[0] < 0.52
    assert done == {"at": calls[0]}
