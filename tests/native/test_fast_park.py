"""The fast park, on the simulated GPU: a process parks itself (docs/parking.md).

With HAMI_FAST_PARK=1 the preload library makes the allocations it serves out
of a reserved address range with physical memory mapped in. hami-park then
asks the process, through its slot, to park itself: its library holds its
other threads at the parking gate, copies that memory to host memory and
releases it; its next call brings it back at the same addresses. The proof
that this path was taken and not the driver's checkpoint: hami-park says
"fast", and the simulated driver counts no checkpoint lock of the process.
"""

import os
import signal
import subprocess
import threading

import pytest

from hami_jupyter.slice.layout import (
    HAMI_FAST_DONE,
    HAMI_FAST_NONE,
    HAMI_PARK_PARKED,
    HAMI_PARK_RUNNING,
)
from hami_jupyter.slice.status import slice_status
from native_helpers import CUDA_ERROR_INVALID_VALUE, MiB, SIM_CONTEXT, slice_device, slot_of, wait_for

WAIT_S = 30
CUDA_ERROR_ILLEGAL_ADDRESS = 700


def run_park(build, env, *args, extra_env=None):
    """``hami-park ARGS`` without the preload library: ``(exit status, answer line)``."""
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    env.update(extra_env or {})
    done = subprocess.run([str(build.out / "hami-park"), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout.strip()


def slot(s, pid):
    found = slot_of(s.snapshot(), pid)
    assert found is not None, f"process {pid} has no live slot"
    return found


def sim_process(gpu, pid):
    return next(x for x in gpu.status()["processes"] if x["pid"] == pid)


def parked(s, pid):
    return wait_for(lambda: slot(s, pid).park_state == HAMI_PARK_PARKED, WAIT_S, what="parked")


@pytest.fixture
def fast_slice(make_slice):
    def make(limit="2g", **extra):
        return make_slice(limit=limit, overhead="64m", HAMI_FAST_PARK="1", **extra)

    return make


HELD = 96 * MiB  # what the holder's allocations take (small: a sanitizer build copies slowly)


@pytest.fixture
def holder(cudrive, fast_slice):
    """A process holding 64 MiB of 0x5a and 32 MiB of 0xa5, made for the fast park."""
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 90", "alloc 32m b", "write b 165")
    return s, p


def test_a_process_parks_itself_and_leaves_its_context_on_the_gpu(holder, gpu, hami_build):
    s, p = holder
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid, 10000, "room")
    assert rc == 0 and answer.startswith(f"ok {HELD} ") and answer.endswith(" fast"), answer
    me = slot(s, p.pid)
    dev = slice_device(s.snapshot(), gpu.uuid(0)).index
    # Published parked with its charge moved: what went is in parked[], what
    # stays on the GPU (the context) in memory_used.
    assert (me.park_state, me.park_fast) == (HAMI_PARK_PARKED, HAMI_FAST_DONE)
    assert me.parked[dev] == HELD and me.memory_used[dev] == SIM_CONTEXT
    assert s.used(0) == SIM_CONTEXT and gpu.used(0) == SIM_CONTEXT
    status = slice_status(s.path)
    [proc] = status["other_processes"]
    assert proc["park_state"] == "parked" and proc["park_reason"] == "room"
    # The driver never held it: no checkpoint lock, and it runs as far as the driver knows.
    sim = sim_process(gpu, p.pid)
    assert (sim["locks"], sim["checkpoint"]) == (0, "running")
    # Its next call brings it back at the same addresses, bytes intact.
    assert p.ok("check a 90", timeout=WAIT_S)["equal"] and p.ok("check b 165")["equal"]
    me = slot(s, p.pid)
    assert (me.park_state, me.park_fast, sum(me.parked.values())) == (HAMI_PARK_RUNNING, HAMI_FAST_NONE, 0)
    assert s.used(0) == SIM_CONTEXT + HELD == gpu.used(0)
    assert sim_process(gpu, p.pid)["locks"] == 0


def test_a_process_parked_and_resumed_mid_loop_keeps_its_data(cudrive, fast_slice, gpu, hami_build):
    """A loop of kernels that add 1 to every byte: parked while it runs (its
    next launch waits at the gate and brings the memory back), each byte ends
    as many times incremented as kernels ran, none lost or doubled."""
    s = fast_slice(HAMI_LOG_LEVEL="2")  # its info lines: which park it made
    p = cudrive.with_context(s.env, "alloc 2m a", "write a 0", "touch a 1")
    p.send("touch a 150 20")  # 150 kernels, 20 ms apart: about 3 s
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" fast"), answer
    # Back on the GPU with no call of ours: the loop's next kernel brought it.
    wait_for(lambda: slot(s, p.pid).park_state == HAMI_PARK_RUNNING, WAIT_S, what="the loop resuming it")
    done = p.read(timeout=4 * WAIT_S)
    assert (done["op"], done["rc"], done["count"]) == ("touch", 0, 150), done
    assert p.ok("check a 151")["equal"]
    assert sim_process(gpu, p.pid)["locks"] == 0
    assert "parked: this process moved its GPU memory to host memory itself" in "\n".join(p.hami_lines())


def test_copying_threads_park_and_resume_again_and_again(cudrive, fast_slice, hami_build):
    """With CPU threads helping to copy (a host of more than 2 CPUs has them),
    every park and resume starts them afresh; none may take an earlier park's
    finished copy for new work. (On a 16-CPU H200 host the first resume after
    a park died of SIGSEGV in such a thread, reading the park's freed buffers.)"""
    s = fast_slice(HAMI_FAST_PARK_COPIERS="3")
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 90", "alloc 32m b", "write b 165")
    for _ in range(3):
        rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
        assert rc == 0 and answer.startswith(f"ok {HELD} ") and answer.endswith(" fast"), answer
        assert p.ok("check a 90", timeout=WAIT_S)["equal"] and p.ok("check b 165")["equal"]
        assert slot(s, p.pid).park_state == HAMI_PARK_RUNNING


def test_a_bad_number_of_copying_threads_is_refused_plainly(cudrive, fast_slice):
    s = fast_slice(HAMI_FAST_PARK_COPIERS="9")
    p = cudrive.start(s.env)
    assert p.cmd("init")["rc"] != 0
    assert 'HAMI_FAST_PARK_COPIERS="9" is not a number of copying threads' in p.stderr()


def test_a_thread_that_touches_memory_while_parked_waits_and_brings_it_back(holder, gpu, hami_build):
    s, p = holder
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" fast"), answer
    parked(s, p.pid)
    # Another thread's kernel on the released memory: it waits at the gate,
    # the memory comes back, then it runs (no fault, which would stick).
    rec = p.cmd("worker w touch b 1 endworker", timeout=WAIT_S)
    assert rec["op"] == "touch" and rec["rc"] == 0, rec
    assert p.read(timeout=WAIT_S)["op"] == "worker"
    assert p.ok("check a 90")["equal"] and p.ok("check b 166")["equal"]
    assert slot(s, p.pid).park_state == HAMI_PARK_RUNNING


def test_a_process_that_does_not_answer_is_checkpointed(holder, gpu, hami_build):
    s, p = holder
    os.kill(p.pid, signal.SIGSTOP)  # its parking thread cannot answer
    try:
        rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid,
                              extra_env={"HAMI_FAST_PARK_ANSWER_MS": "300"})
    finally:
        os.kill(p.pid, signal.SIGCONT)
    assert rc == 0 and answer.endswith(" checkpoint"), answer
    sim = sim_process(gpu, p.pid)
    assert (sim["locks"], sim["checkpoint"]) == (1, "checkpointed")
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="the charge moved")
    assert slot(s, p.pid).park_fast == HAMI_FAST_NONE  # the withdrawn request is over
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]
    # Answering again, it parks itself the next time.
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" fast"), answer
    assert p.ok("check b 165", timeout=WAIT_S)["equal"]


def test_a_failure_half_way_loses_nothing_and_the_process_runs_on(cudrive, fast_slice, gpu, hami_build):
    """The second of three blocks cannot be unmapped: the first, released
    already, is made again and its bytes copied back; the park fails, the
    process runs on unparked with every byte and its whole charge."""
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 1", "alloc 64m b", "write b 2", "alloc 64m c",
                             "write c 3", "simfail cuMemUnmap 2")
    before = (s.used(0), gpu.used(0))
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 1 and "failed half-way" in answer and "it runs on, unparked" in answer, answer
    me = slot(s, p.pid)
    assert me.park_state == HAMI_PARK_RUNNING and sum(me.parked.values()) == 0
    assert (s.used(0), gpu.used(0)) == before
    assert all(p.ok(f"check {n} {v}")["equal"] for n, v in (("a", 1), ("b", 2), ("c", 3)))
    assert sim_process(gpu, p.pid)["locks"] == 0
    # Nothing broken: the next park works.
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" fast"), answer
    assert p.ok("check b 2", timeout=WAIT_S)["equal"]


def test_a_failure_before_anything_is_released_loses_nothing(cudrive, fast_slice, gpu, hami_build):
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 1", "simfail cuMemcpyDtoHAsync_v2 1")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 1 and "failed half-way" in answer, answer
    assert p.ok("check a 1")["equal"] and slot(s, p.pid).park_state == HAMI_PARK_RUNNING


def test_memory_that_cannot_come_back_half_way_stays_parked_safely(cudrive, fast_slice, gpu, hami_build):
    """The unmap of the second block fails and the first cannot be made again
    (its cuMemCreate fails too): then the park completes instead, every byte in
    host memory, and the next call brings all of it back."""
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 1", "alloc 64m b", "write b 2",
                             "simfail cuMemUnmap 2", "simfail cuMemCreate 1")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" fast"), answer
    assert slot(s, p.pid).park_state == HAMI_PARK_PARKED
    assert p.ok("check a 1", timeout=WAIT_S)["equal"] and p.ok("check b 2")["equal"]


def test_a_resume_that_fails_keeps_the_memory_parked_and_tries_again(holder, gpu, hami_build):
    s, p = holder
    p.ok("simfail cuMemMap 1")  # the first mapping after this: the resume's
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]  # a second later, the second try
    lines = "\n".join(p.hami_lines())
    assert "bringing the parked memory back failed" in lines and "it stays in host memory" in lines


def test_memory_the_program_maps_itself_is_checkpointed_when_large(cudrive, fast_slice, gpu, hami_build):
    """PyTorch's expandable segments map memory themselves (cuMemCreate,
    cuMemMap): the library cannot move that. Past HAMI_FAST_PARK_KEEP (256 MiB
    by default, 32 MiB here) the process refuses, and hami-park checkpoints it
    at once."""
    s = fast_slice(HAMI_LOG_LEVEL="2", HAMI_FAST_PARK_KEEP="32m")  # info lines: why it did not park itself
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 4", "vmalloc 64m 0 v", "write v 8")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" checkpoint"), answer
    assert sim_process(gpu, p.pid)["locks"] == 1
    assert ("it cannot (it holds 64.0 MiB it cannot move (more than HAMI_FAST_PARK_KEEP, 32.0 MiB)"
            in "\n".join(p.hami_lines()))
    assert p.ok("check v 8", timeout=WAIT_S)["equal"] and p.ok("check a 4")["equal"]


def test_a_little_memory_the_program_maps_itself_stays_on_the_gpu(cudrive, fast_slice, gpu, hami_build):
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 128m a", "write a 4", "vmalloc 64m 0 v", "write v 8")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.startswith(f"ok {128 * MiB} ") and answer.endswith(" fast"), answer
    assert gpu.used(0) == SIM_CONTEXT + 64 * MiB  # the context and the program's own mapping
    assert p.ok("check v 8", timeout=WAIT_S)["equal"] and p.ok("check a 4")["equal"]


def test_ranges_and_pointer_attributes_are_the_drivers_own(cudrive, fast_slice, gpu):
    """A backed allocation of 3 MiB takes a 4 MiB range; the program is told
    what the driver tells of its own allocation: 3 MiB from its start, in its
    context (the one thing that differs: it cannot be exported by IPC)."""
    plain = cudrive.with_context(gpu.env(), "alloc 3m a")
    backed = cudrive.with_context(fast_slice().env, "alloc 3m a")
    for p in (plain, backed):
        got = p.ok("range a 2m")
        assert (got["base_offset"], got["size"]) == (0, 3 * MiB)
    want, got = plain.ok("ptrattr a 1m"), backed.ok("ptrattr a 1m")
    for key in ("type", "ordinal", "start_offset", "size", "mapped", "managed"):
        assert got[key] == want[key], key
    assert got["context"] == backed.ok("ctx 0")["ctx"]
    assert (want["ipc"], got["ipc"]) == (1, 0)  # the witness that it is backed for the fast park


def test_ipc_of_backed_memory_is_refused_and_later_memory_is_made_the_old_way(cudrive, fast_slice, gpu,
                                                                                hami_build):
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 3")
    assert p.cmd("ipc a")["rc"] == CUDA_ERROR_INVALID_VALUE  # the driver's answer for such memory
    assert "HAMI_FAST_PARK=0" in "\n".join(p.hami_lines())
    p.ok("alloc 64m b")
    p.ok("write b 6")
    p.ok("ipc b")  # made the old way: exported
    # It still parks itself: what it cannot move (b) is below HAMI_FAST_PARK_KEEP and stays.
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.startswith(f"ok {64 * MiB} ") and answer.endswith(" fast"), answer
    assert p.ok("check a 3", timeout=WAIT_S)["equal"] and p.ok("check b 6")["equal"]


def test_peer_access_reaches_backed_memory_before_and_after_a_park(cudrive, fast_slice, gpu, hami_build):
    s = fast_slice()
    p = cudrive.with_context(s.env, "ctx 1", "alloc 64m x", "write x 10", "ctx 0", "peer 1")
    p.ok("touch x")  # device 0's kernel on device 1's memory
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[1].endswith(" fast")
    p.ok("touch x", timeout=WAIT_S)  # mapped again with the peer's access too
    assert p.ok("check x 12")["equal"]


def test_a_graph_with_memory_nodes_runs_again_after_a_park(cudrive, fast_slice, gpu, hami_build):
    """The graph's memory is the driver's (its graph pool stays on the GPU);
    the graph's kernels work on addresses that are the same after a resume."""
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 7", "capture begin", "async 32m g", "launch 1000",
                             "freeasync g", "capture end G", "graph G", "graphlaunch G")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.startswith(f"ok {64 * MiB} ") and answer.endswith(" fast"), answer
    p.ok("graphlaunch G", timeout=WAIT_S)
    assert p.ok("check a 7")["equal"]


def test_memory_of_a_context_that_went_is_left_to_the_checkpoint(cudrive, fast_slice, gpu, hami_build):
    """The program destroyed a context its backed memory was made in (without
    freeing it): that context's work cannot be waited for, so the process
    refuses to park itself and the checkpoint parks it, data intact."""
    s = fast_slice()
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 5", "ctxcreate 0 c1", "alloc 64m b",
                             "ctxdestroy c1", "ctx 0")
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" checkpoint"), answer
    assert p.ok("check a 5", timeout=WAIT_S)["equal"]


def test_without_the_fast_park_nothing_is_backed_and_the_checkpoint_parks(cudrive, make_slice, gpu,
                                                                          hami_build):
    s = make_slice(limit="2g", overhead="64m", HAMI_FAST_PARK="0")
    p = cudrive.with_context(s.env, "alloc 64m a", "write a 9")
    assert p.ok("ptrattr a")["ipc"] == 1  # the driver's own allocation
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.endswith(" checkpoint"), answer
    assert p.ok("check a 9", timeout=WAIT_S)["equal"]


def test_parks_of_threads_racing_allocations_lose_nothing(cudrive, fast_slice, gpu, hami_build):
    """Threads allocating, writing and freeing while parks come and go: every
    park happens (the threads' next calls wait at the gate and bring the
    memory back) or fails cleanly, and the cap and the data hold."""
    s = fast_slice(limit="4g")
    p = cudrive.with_context(s.env, "alloc 32m keep", "write keep 77")
    p.send("threads 4 400 16m 7")
    answers, stop = [], threading.Event()

    def parker():
        while not stop.is_set() and len(answers) < 3:
            if slot(s, p.pid).park_state == HAMI_PARK_RUNNING:
                answers.append(run_park(hami_build, s.env, "park", s.path, p.pid))
            stop.wait(0.05)

    t = threading.Thread(target=parker)
    t.start()
    try:
        rec = p.read(timeout=120)
    finally:
        stop.set()
        t.join(timeout=120)
    assert rec["op"] == "threads" and rec["rc"] == 0, rec
    print(answers)
    for rc, answer in answers:
        assert (rc == 0 and answer.endswith(" fast")) or "not running on the GPU" in answer \
            or "runs on, unparked" in answer, answer
    assert any(rc == 0 for rc, _ in answers), answers
    assert p.ok("check keep 77", timeout=WAIT_S)["equal"]
    assert gpu.peak(0) <= 4 * 1024 * MiB + SIM_CONTEXT
