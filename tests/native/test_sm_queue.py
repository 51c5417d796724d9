"""The SM share's launch queue: its waits never hang a legal program, and it
keeps a bounded number of events however often a thread changes context.

While a share binds, each launching thread keeps at most two launches queued
per context, recorded by events (native/src/sm_share.c). These tests run
programs that a bound with no end would hang, and count the events a process
holds on the simulated GPU (``cudrive events``).

The simulated GPU models stream memory operations (native/sim/README.md,
"Stream memory operations"): work queued on a stream after an unmet
``cuStreamWaitValue32`` does not start until a ``cuStreamWriteValue32`` (on
any stream) meets it.
"""

KERNEL_NS = 1_000_000  # 1 ms kernels
HANG_TIMEOUT = 20      # s: a launch the library blocks for good fails the test here
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801


def _sm_slice(make_slice, share, name="team"):
    return make_slice(name=name, limit=None, overhead="0", CUDA_DEVICE_SM_LIMIT=share)


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


# ---- the preload library: one launch queue per context ------------------------


def test_switching_contexts_keeps_a_constant_number_of_events(cudrive, make_slice):
    # One thread going back and forth between two contexts at a binding
    # share. The library made three events at every switch and never
    # destroyed the old ones: 3,000 events after 1,000 launches.
    p = cudrive.start(_sm_slice(make_slice, 50).env)
    p.ok("init")
    p.ok("ctxcreate 0 one")
    p.ok("ctxcreate 0 two")
    launches = 1000
    before = p.ok("events")["events"]
    rec = p.ok(f"alternate one two 100000 {launches}", timeout=120)
    assert rec["launches"] == launches, rec
    held = p.ok("events")["events"] - before
    # Three events per context (the launch queue of each), whatever the count.
    assert 0 < held <= 2 * 3, f"{held} events held after {launches} launches alternating two contexts"
    p.ok(f"alternate one two 100000 {launches}", timeout=120)
    assert p.ok("events")["events"] - before == held


def test_contexts_made_and_destroyed_in_turn_leave_only_the_live_ones_events(cudrive, make_slice):
    # More contexts than a thread keeps launch queues for, each destroyed
    # after use: its events go with it, and the live context's queue keeps
    # its three however often the thread comes back to it.
    p = cudrive.start(_sm_slice(make_slice, 50).env)
    p.ok("init")
    p.ok("ctxcreate 0 keep")
    for i in range(12):
        p.ok(f"ctxcreate 0 c{i}")
        p.ok(f"alternate keep c{i} 100000 20")
        p.ok(f"ctxdestroy c{i}")
    held = p.ok("events")["events"]
    assert 0 < held <= 3, f"{held} events held: more than the live context's launch queue"


def test_a_primary_context_made_again_gets_a_launch_queue_of_live_events(cudrive, make_slice):
    # Releasing a primary context (or resetting it) destroys its events, and
    # the next retain hands out the same handle (driver 580 does the same,
    # with a new cuCtxGetId). The library took the handle for the old context
    # and went on with the dead events: on the simulated GPU every record
    # failed and the thread's launches were never bounded again; on an H200
    # (driver 580) a query of an event of a destroyed context crashed the
    # process.
    p = cudrive.start(_sm_slice(make_slice, 50).env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok(f"burn launch {KERNEL_NS} 0.3", timeout=30)
    assert p.ok("events")["events"] == 3
    p.ok("ctxrelease 0")
    assert p.ok("events")["events"] == 0
    p.ok("ctx 0")
    p.ok("module")  # cudrive's busy kernel went with the context
    p.ok(f"burn launch {KERNEL_NS} 0.3", timeout=30)
    assert p.ok("events")["events"] == 3, "no launch queue in the context made again"


# ---- the preload library: no wait without end ---------------------------------


def _bound(cudrive, env):
    """A process whose share binds: it has just burnt its share, so its launches are held."""
    p = cudrive.start(env)
    p.ok("init")
    p.ok("ctx 0")
    _flag_and_streams(p)
    p.ok(f"burn launch {KERNEL_NS} 1", timeout=30)
    return p


def test_launches_queued_behind_a_wait_that_a_later_write_meets_do_not_hang(cudrive, make_slice):
    # A legal program: stream a waits for a flag, more kernels queue on a
    # behind the wait, then stream b writes the flag. Each launch returns at
    # once on a real GPU. The library kept waiting (cuEventSynchronize) for
    # the oldest of this thread's queued launches once two were queued, and
    # that launch waits for the write this thread never got to issue.
    p = _bound(cudrive, _sm_slice(make_slice, 25).env)
    p.ok("waitvalue a flag 1")
    rec = p.ok(f"launchon a {KERNEL_NS} 6", timeout=HANG_TIMEOUT)
    assert rec["count"] == 6, rec
    p.ok("writevalue b flag 1")
    p.ok("streamsync a", timeout=HANG_TIMEOUT)
    # Once the held launches have run, the thread launches as before.
    rec = p.ok(f"burn launch {KERNEL_NS} 1", timeout=30)
    assert rec["launches"] > 0, rec


def test_a_stuck_launch_on_another_stream_does_not_hold_the_thread(cudrive, make_slice):
    # Stream a's queued kernels wait for a flag; this thread's launches on
    # stream b (behind nothing) go on and finish while a is still held.
    p = _bound(cudrive, _sm_slice(make_slice, 25).env)
    p.ok("waitvalue a flag 1")
    p.ok(f"launchon a {KERNEL_NS} 2")
    p.ok(f"launchon b {KERNEL_NS} 4", timeout=HANG_TIMEOUT)
    p.ok("streamsync b", timeout=HANG_TIMEOUT)
    assert p.cmd("streamquery a")["rc"] == CUDA_ERROR_NOT_READY
    p.ok("writevalue b flag 1")
    p.ok("sync", timeout=HANG_TIMEOUT)
