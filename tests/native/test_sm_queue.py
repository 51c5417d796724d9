"""The simulated GPU's stream memory operations and its count of a process's events.

Work queued on a stream after an unmet ``cuStreamWaitValue32`` does not
start until a ``cuStreamWriteValue32`` (on any stream) meets it
(native/sim/README.md, "Stream memory operations"), so that tests can run
programs whose earlier work waits for later work; ``cudrive events`` counts
the events a process holds, the witness for event leaks.
"""

KERNEL_NS = 1_000_000  # 1 ms kernels
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801


def _flag_and_streams(p):
    """A zeroed 32-bit flag in device memory, and two streams that never wait for the legacy stream."""
    p.ok("alloc 4k flag")
    p.ok("write flag 0")
    p.ok("stream a nonblocking")
    p.ok("stream b nonblocking")


# ---- the simulated GPU's stream memory operations (no preload library) --------------


def test_sim_work_behind_an_unmet_wait_starts_when_a_later_write_meets_it(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    _flag_and_streams(p)
    p.ok("waitvalue a flag 1")
    p.ok(f"launchon a {KERNEL_NS} 3")
    p.ok("sleep 20")
    # Nothing of stream a ran, however long we wait; stream b is not held.
    assert p.cmd("streamquery a")["rc"] == CUDA_ERROR_NOT_READY
    p.ok("streamquery b")
    p.ok(f"launchon b {KERNEL_NS} 1")
    p.ok("writevalue b flag 1")
    # Released now: its three kernels run (3 ms on the device) and end.
    assert p.ok("streamsync a", timeout=10)["wait_ns"] >= 2 * KERNEL_NS
    p.ok("streamquery a")


def test_sim_a_write_held_back_on_one_stream_releases_another_when_it_runs(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    _flag_and_streams(p)
    p.ok("waitvalue a flag 2 geq")
    p.ok("writevalue a flag 7")        # held behind a's wait
    p.ok("waitvalue b flag 7")
    p.ok(f"launchon b {KERNEL_NS} 1")
    assert p.cmd("streamquery b")["rc"] == CUDA_ERROR_NOT_READY
    p.ok("writevalue null flag 3")     # meets a's wait: a writes 7, which meets b's
    p.ok("streamsync a", timeout=10)
    p.ok("streamsync b", timeout=10)
    p.ok("sync", timeout=10)


def test_sim_holds_back_no_default_stream(cudrive, gpu):
    # The sim holds back work on created streams only (native/sim/README.md).
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    _flag_and_streams(p)
    p.ok("waitvalue null flag 0")      # met: nothing to hold back
    assert p.cmd("waitvalue null flag 1")["rc"] == CUDA_ERROR_NOT_SUPPORTED
    p.ok("streamquery null")


def test_sim_counts_the_events_a_process_holds(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    assert p.ok("events")["events"] == 0
    p.ok(f"event {KERNEL_NS}")  # makes three events and destroys them
    assert p.ok("events")["events"] == 0
