"""The driver's own memory on a full GPU: every call that takes some waits for room, and goes on.

The driver takes device memory that no allocation asked for: a module's
code, loaded at the first launch of one of its kernels (lazy loading), the
local memory a kernel needs, a process's first context. The simulated GPU
takes it the same way (native/sim/README.md), so on a full GPU such a call
is refused with out of memory although the slice is within its limit. On a
real H100 that refusal ended PyTorch sessions in set-up (issue 32). Here
carol's process meets it on a GPU that alice's idle kernel fills: the library
asks the broker, which parks alice's kernel, and the call goes through.
"""

import json
import signal
import subprocess
import sys
import textwrap
import time

from broker_helpers import GiB, MiB, audit_of, parked, running, slot
from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, DEFAULT_TIMEOUT, wait_for

from hami_jupyter.slice.file import read_snapshot

HOUR = 3600
ROOM = {"HAMI_ROOM_WAIT": 60}



def full_gpu(slices, holder, cudrive, gpu, socket_path, **carol_env):
    """alice's idle kernel holds 10 GiB; carol's process fills the rest of the
    16 GiB GPU (no broker yet, so nothing waits). Returns (alice, carol).

    A GPU filled to its last MiB leaves a checkpoint no room of its own
    (tests/broker/test_full_gpu.py shows what the agent's reserve does about
    it); here the checkpoint needs none, so that what is tested is the wait."""
    gpu.config["HAMI_SIM_CKPT_FREE"] = 0
    slices.make("carol", "8g", "1g")
    slices.make("alice", "12g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice"), "10g", age_s=HOUR)
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path, **ROOM,
                                     **carol_env))
    carol.ok("init")
    carol.ok("ctx 0")
    carol.ok("module")  # loaded; its code comes at the first launch
    filled = carol.cmd("fill 1m")
    assert filled["last_err"] == "CUDA_ERROR_OUT_OF_MEMORY" and gpu.used(0) > 16 * GiB - MiB
    return alice, carol


def test_a_kernels_first_launch_on_a_full_gpu_waits_for_room_and_runs(slices, holder, cudrive, start_broker,
                                                                      socket_path, gpu, root):
    alice, carol = full_gpu(slices, holder, cudrive, gpu, socket_path)
    start_broker("--reserve", "0")
    launched = carol.cmd("launch 1000", timeout=60)  # its code needs 2 MiB the GPU does not have
    assert launched["rc"] == 0, f"{launched}\n{carol.stderr()[-3000:]}"
    assert parked(alice.slice, alice.pid)
    [park] = audit_of(root, "broker-park")
    assert park["kernel"] == "k-alice" and park["requester"]["pid"] == carol.pid
    waited = [line for line in carol.hami_lines() if "waiting up to 60 s" in line]
    assert len(waited) == 1 and "a kernel launch" in waited[0], carol.hami_lines()


def test_a_launch_that_needs_more_local_memory_than_one_ask_waits_until_it_fits(slices, holder, cudrive,
                                                                               start_broker, socket_path, gpu):
    alice, carol = full_gpu(slices, holder, cudrive, gpu, socket_path)
    carol.ok("module hami_sim_local_768m")  # more than the library's first ask (256 MiB)
    start_broker("--reserve", "0")
    launched = carol.cmd("launch 1000", timeout=60)
    assert launched["rc"] == 0, f"{launched}\n{carol.stderr()[-3000:]}"
    assert parked(alice.slice, alice.pid)


def test_a_first_context_of_unknown_cost_waits_for_room(slices, holder, cudrive, start_broker, socket_path, gpu,
                                                        root):
    """No HAMI_CONTEXT_OVERHEAD: the process's first context is measured after
    it is made, so nothing was reserved; a full GPU refused it, and that went
    to the program (PyTorch: "CUDA error: out of memory" in cudaSetDevice)."""
    gpu.config["HAMI_SIM_CKPT_FREE"] = 0  # as in full_gpu()
    slices.make("carol", "8g", "1g")
    slices.make("alice", "16g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice"), "15g", age_s=HOUR)
    filler = cudrive.start(gpu.env())  # no library: takes what is left, as another tenant's work would
    filler.ok("init")
    filler.ok("ctx 0")
    filler.cmd("fill 16m")
    start_broker("--reserve", "0")
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path,
                                     HAMI_CONTEXT_OVERHEAD=None, **ROOM))
    carol.ok("init")
    made = carol.cmd("ctx 0", timeout=60)
    assert made["rc"] == 0, f"{made}\n{carol.stderr()[-3000:]}"
    assert parked(alice.slice, alice.pid)
    assert any("a CUDA context" in line and "waiting up to 60 s" in line for line in carol.hami_lines())


def test_a_slice_at_its_cap_gets_no_wait_for_the_drivers_memory(slices, holder, cudrive, start_broker,
                                                                socket_path, gpu):
    """The driver's own memory counts against the cap too: a slice whose cap
    leaves nothing is refused at once, and told why."""
    slices.make("carol", "1g", "1g")
    slices.make("alice", "16g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice"), "14g", age_s=HOUR)
    start_broker()
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path, **ROOM))
    carol.ok("init")
    carol.ok("ctx 0")
    carol.ok("module")
    filled = carol.cmd("fill 1m")  # to her cap (the slice refuses first, before the GPU would)
    assert filled["last_err"] == "CUDA_ERROR_OUT_OF_MEMORY"
    filler = cudrive.start(gpu.env())
    filler.ok("init")
    filler.ok("ctx 0")
    filler.cmd("fill 1m")  # and the GPU full
    started = time.monotonic()
    launched = carol.cmd("launch 1000")
    assert launched["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert time.monotonic() - started < 10  # no wait for room (HAMI_ROOM_WAIT is 60)
    assert running(alice.slice, alice.pid)
    said = [line for line in carol.hami_lines() if "no room in the slice for what the driver needs" in line]
    assert len(said) == 1 and "a kernel launch" in said[0] and "cap in use" in said[0], carol.hami_lines()


WAITER = textwrap.dedent("""
    import ctypes, json, signal, sys, time
    signals = []
    signal.signal(signal.SIGINT, lambda *a: signals.append(time.monotonic()))  # as IPython's kernel handles it
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    print(json.dumps({"ready": True}), flush=True)
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1])))
    print(json.dumps({"rc": rc, "ended": time.monotonic(), "signals": signals}), flush=True)
    again = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1])))  # a framework's retry
    print(json.dumps({"rc": again, "ended": time.monotonic()}), flush=True)
    sys.stdin.read()
""")


def test_interrupt_ends_a_wait_for_room_within_a_second(slices, holder, start_broker, socket_path, gpu, tmp_path):
    """Jupyter's "Interrupt kernel" is SIGINT: a cell waiting for room ends
    with out of memory, its framework's immediate retry too, and nothing of
    the wait stays: no bytes reserved in the slice, no wait in the slot."""
    slices.make("carol", "8g", "1g")
    slices.make("alice", "12g", "1g")
    holder(slices.env("alice", kernel="k-alice"), "10g")  # active: nothing can be parked
    start_broker()
    env = slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path, HAMI_ROOM_WAIT=120)
    stderr = open(tmp_path / "waiter.stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-c", WAITER, str(6 * GiB)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert '"ready"' in proc.stdout.readline()
        path = slices.path("carol")
        wait_for(lambda: slot(path, proc.pid).room_wait_since_unix_ns, DEFAULT_TIMEOUT, what="carol waiting")
        wait_for(lambda: "can make no room yet" in (tmp_path / "waiter.stderr").read_text(), DEFAULT_TIMEOUT,
                 what="a NO for carol (alice is active)")
        time.sleep(1.5)  # asked again at least once
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        first = json.loads(proc.stdout.readline())
        retry = json.loads(proc.stdout.readline())
        assert first["rc"] == CUDA_ERROR_OUT_OF_MEMORY and first["signals"]
        assert first["ended"] - sent < 1.0, first["ended"] - sent
        assert retry["rc"] == CUDA_ERROR_OUT_OF_MEMORY and retry["ended"] - sent < 1.0
        now = read_snapshot(path)
        assert now.devices[0].memory_used == 64 * MiB  # its context alone: nothing of the 6 GiB reserved
        assert slot(path, proc.pid).room_wait_since_unix_ns == 0
        stderr.seek(0)
        said = [line for line in stderr.read().splitlines() if line.startswith("hami:")]
        assert sum("can make no room yet" in line and "asking again every second" in line for line in said) == 1
        assert sum("was interrupted: out of memory" in line for line in said) == 1, said
    finally:
        proc.kill()
        proc.wait(10)
        stderr.close()


def test_a_set_up_storm_waits_its_turn_and_nobody_fails(slices, cudrive, start_broker, socket_path, gpu, root):
    """Six sessions start at once on a 16 GiB GPU that holds five of them:
    each makes its context (cost unknown, as PyTorch's), takes 2.5 GiB of data,
    and runs its first kernel, whose code and 512 MiB of local memory the
    driver takes at that launch; then it goes idle. The data fits for all six,
    the launches do not: those that meet a full GPU wait, the broker parks
    the sessions that finished and went idle, and every one gets through,
    none out of memory."""
    start_broker("--min-idle-seconds", "1")
    sessions = []
    for i in range(6):
        slices.make(f"user{i}", "8g", "1g")
        it = cudrive.start(slices.env(f"user{i}", kernel=f"k-{i}", HAMI_BROKER_SOCKET=socket_path,
                                      HAMI_CONTEXT_OVERHEAD=None, HAMI_ROOM_WAIT=120))
        it.slice = slices.path(f"user{i}")
        sessions.append(it)
    # Each session's set-up at once, all sessions together: first their data
    # (all of it fits), then their first kernels (not all of them fit).
    for set_up in (("init", "ctx 0", "alloc 2560m"), ("module hami_sim_local_512m", "launch 1000", "sync")):
        for it in sessions:
            for line in set_up:
                it.send(line)
        for it in sessions:
            for line in set_up:
                answer = it.read(timeout=150)
                assert answer["rc"] == 0, f"session {it.pid}: {line}: {answer}\n{it.stderr()[-3000:]}"
    assert gpu.peak(0) <= 16 * GiB
    parks = audit_of(root, "broker-park")
    assert len(parks) >= 1  # 6 x (2.5 GiB + 512 MiB + a context) do not fit together
    for it in sessions:
        assert not any("out of memory" in line for line in it.hami_lines()), it.hami_lines()
