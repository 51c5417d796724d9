"""Stream capture under the preload library: nothing a program may legally do
while capturing a graph is broken by a hook, and a graph's memory nodes are
charged to the slice when the graph really allocates them (at its upload or
launch), not at capture.

The same cudrive script runs without the library (the reference) and inside a
slice: every answer must be the same. The simulated GPU enforces the driver's
capture rules (a capture-unsafe call invalidates a capture, per interaction
mode), so a hook that made such a call of its own would show up here as a
failed capture.
"""

import pytest

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, SIM_CONTEXT, MiB, SimGpu

ACTIVE = 1  # CUstreamCaptureStatus


@pytest.fixture
def gpu(hami_build, tmp_path):
    """Kernels' code takes no device memory here: these tests count graph memory to the byte."""
    return SimGpu(hami_build, tmp_path / "sim-state", HAMI_SIM_MODULE_BYTES=0)


def _answers(p, lines):
    """Each line's answer, without what differs from run to run (pointers, pids)."""
    out = []
    for line in lines:
        rec = p.cmd(line)
        out.append({k: v for k, v in rec.items() if k not in ("ptr", "pid", "graph", "id", "ms", "wall_ms")})
    return out


def _worker(p, name, *lines):
    p.send(f"worker {name} " + " ".join(lines) + " endworker")
    out = p.until("worker")
    assert out[-1]["rc"] == 0, out
    return out[:-1]


CAPTURE = ["async 64m A", "async 32m B", "launch 1000", "free A", "async 16m C", "free B", "free C",
           "capture status"]


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_a_graph_with_memory_nodes_captures_and_runs_as_without_the_library(cudrive, gpu, make_slice, mode):
    script = [f"capture begin {mode}", *CAPTURE, "capture end G", "graph G", "graphlaunch G", "graphlaunch G 3",
              "sync", "graphmem 0"]
    reference = _answers(cudrive.with_context(gpu.env()), script)
    assert all(r["rc"] == 0 for r in reference), reference
    s = make_slice(limit="1g", overhead="64m")
    assert _answers(cudrive.with_context(s.env), script) == reference


def test_a_hook_on_another_thread_leaves_a_global_capture_alone(cudrive, gpu, make_slice):
    # The main thread captures in the global mode, where any capture-unsafe
    # call from another thread in the global mode invalidates it. A worker
    # trims the default pool (safe); the library's hook then reads the pool's
    # attributes, which must not count as the worker's unsafe call.
    def run(env):
        p = cudrive.with_context(env, "async 4m X", "free X", "sync")
        p.ok("capture begin global")
        p.ok("async 8m A")
        trimmed = _worker(p, "T", "pooltrim default 0")
        status = p.ok("capture status")["status"]
        p.ok("free A")
        end = p.cmd("capture end G")["rc"]
        return [r["rc"] for r in trimmed], status, end

    reference = run(gpu.env())
    assert reference == ([0], ACTIVE, 0)
    s = make_slice(limit="1g", overhead="64m")
    assert run(s.env) == reference


def test_a_graph_instantiated_from_a_thread_local_capture_on_a_worker_runs(cudrive, gpu, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env)
    out = _worker(p, "T", "capture begin thread", "async 24m A", "launch 1000", "free A", "capture end G",
                  "graph G", "graphlaunch G 2", "sync")
    assert [r["rc"] for r in out] == [0] * 8, out
    assert s.slot_used(p.pid) == SIM_CONTEXT + 24 * MiB


def test_graph_memory_is_charged_when_the_graph_runs_and_given_back_at_a_trim(cudrive, gpu, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", *CAPTURE, "capture end G")
    # Captured: nothing is allocated yet, nothing is charged.
    assert s.slot_used(p.pid) == SIM_CONTEXT
    p.ok("graph G")
    assert s.slot_used(p.pid) == SIM_CONTEXT
    p.ok("graphlaunch G")
    need = 96 * MiB  # A and B live at once
    assert s.slot_used(p.pid) == SIM_CONTEXT + need == gpu.process_used(p.pid, 0)
    p.ok("graphlaunch G 3")  # relaunches reuse the same memory
    p.ok("sync")
    assert s.slot_used(p.pid) == SIM_CONTEXT + need
    p.ok("graphtrim 0")
    assert s.slot_used(p.pid) == SIM_CONTEXT == gpu.process_used(p.pid, 0)
    p.ok("graphlaunch G")  # maps it again
    assert s.slot_used(p.pid) == SIM_CONTEXT + need


def test_an_upload_charges_the_graph_memory(cudrive, gpu, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", "async 20m A", "free A", "capture end G", "graph G")
    p.ok("graphupload G")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 20 * MiB


def test_graph_memory_counts_against_the_cap(cudrive, gpu, make_slice):
    s = make_slice(limit="512m", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", "async 300m A", "free A", "capture end G", "graph G",
                 "graphlaunch G", "sync")
    assert s.used() == SIM_CONTEXT + 300 * MiB
    # 64 + 300 + 200 MiB would pass the 512 MiB cap.
    rec = p.cmd("alloc 200m")
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY, rec
    p.ok("graphtrim 0")
    p.ok("alloc 200m")
    assert s.used() == SIM_CONTEXT + 200 * MiB


def test_memory_from_a_pool_of_ones_own_in_a_graph_is_charged_when_it_runs(cudrive, gpu, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env, "pool 0 P", "capture begin relaxed")
    assert p.ok("poolalloc P 10m G1")["stream"] == "capture"
    p.ok("free G1")
    p.ok("capture end G")
    p.ok("graph G")
    assert s.slot_used(p.pid) == SIM_CONTEXT
    p.ok("graphlaunch G")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 10 * MiB == gpu.process_used(p.pid, 0)


def test_an_allocation_a_graph_leaves_allocated_is_charged_until_trimmed(cudrive, gpu, make_slice):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", "async 8m keep", "capture end G", "graph G",
                 "graphlaunch G", "sync")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 8 * MiB == gpu.process_used(p.pid, 0)
    p.ok("freeasync keep")  # outside a capture: back to the graph pool, still reserved
    p.ok("sync")
    p.ok("graphtrim 0")
    p.ok("ungraph G")
    p.ok("graphtrim 0")
    assert s.slot_used(p.pid) == SIM_CONTEXT == gpu.process_used(p.pid, 0)


# ---- a graph's memory is held against the slice before the driver maps it ----

def test_a_graph_whose_memory_passes_the_cap_is_refused_before_it_runs(cudrive, gpu, make_slice):
    # The case: 1.5 GiB allocated by a memory node and kept across
    # launches, in a 1 GiB slice. The driver would map it at the launch.
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", "async 1536m kept", "launch 1000", "capture end G", "graph G")
    rec = p.cmd("graphlaunch G")
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY, rec
    p.ok("sync")
    # Nothing was mapped: neither the slice nor the GPU holds more than the context.
    assert s.slot_used(p.pid) == SIM_CONTEXT == gpu.process_used(p.pid, 0)
    assert "out of memory on GPU 0: a CUDA graph's memory asked for 1.5 GiB" in p.stderr()
    # An upload maps the same memory: refused the same way.
    assert p.cmd("graphupload G")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert gpu.process_used(p.pid, 0) == SIM_CONTEXT


def test_a_graph_that_fits_its_peak_runs_though_its_allocations_add_up_to_more(cudrive, gpu, make_slice):
    # A (64) and B (32) live at once, then C (16) after A is gone: the peak is
    # 96 MiB, the sum 112. A slice with room for exactly the peak runs it, and
    # every relaunch, as the driver would.
    s = make_slice(limit=f"{(SIM_CONTEXT + 96 * MiB) // MiB}m", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", *CAPTURE, "capture end G", "graph G")
    p.ok("graphlaunch G")
    p.ok("graphlaunch G 3")
    p.ok("sync")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 96 * MiB == gpu.process_used(p.pid, 0)
    # Mapped memory of a trimmed graph comes back at its next launch, held again first.
    p.ok("graphtrim 0")
    assert s.slot_used(p.pid) == SIM_CONTEXT
    p.ok("alloc 16m X")
    rec = p.cmd("graphlaunch G")
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY, rec
    assert gpu.process_used(p.pid, 0) == SIM_CONTEXT + 16 * MiB
    p.ok("free X")
    p.ok("graphlaunch G")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 96 * MiB


def test_a_graph_served_from_the_pools_spare_memory_needs_no_room(cudrive, gpu, make_slice):
    # A destroyed executable leaves its mapping reserved as spare; the next
    # graph's launch is served from it, so the slice being full of that very
    # memory must not refuse it.
    s = make_slice(limit=f"{(SIM_CONTEXT + 64 * MiB) // MiB}m", overhead="64m")
    p = cudrive.with_context(s.env, "capture begin", "async 64m A", "free A", "capture end G", "graph G")
    p.ok("graphlaunch G")
    p.ok("sync")
    p.ok("ungraph G")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 64 * MiB  # still reserved by the pool
    p.ok("capture begin")
    p.ok("async 48m B")
    p.ok("free B")
    p.ok("capture end H")
    p.ok("graph H")
    p.ok("graphlaunch H")
    p.ok("sync")
    assert s.slot_used(p.pid) == SIM_CONTEXT + 64 * MiB == gpu.process_used(p.pid, 0)
