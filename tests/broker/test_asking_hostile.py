"""What a hub user can make of the room protocol and the library's waits (issue 39).

Found by a hostile user on a real hub and in a code review: a 1-byte request
asked again and again grew, OK by OK, until the agent parked another user's
kernel for it; a SIGCHLD (PyTorch's DataLoader handles it) ended a wait for
room as if it were Jupyter's interrupt; a slice without a memory cap never
waited for the driver's own memory; a context refused as busy waited 120 s
whatever the cause; and a process without a slot asking in a loop made the
agent look at the whole node for each connection.
"""

import textwrap
import time

from broker_helpers import GiB, MiB, audit_of, broker_env, parked, running
from native_helpers import wait_for

from hami_jupyter.slice.create import create_slice
from hami_jupyter.slice.limits import Limits

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60


def tenant(cudrive, gpu, leave):
    """Another tenant's process, without the library, taking all but *leave* bytes of GPU 0."""
    it = cudrive.start(gpu.env())
    it.ok("init")
    it.ok("ctx 0")
    it.ok(f"alloc {16 * GiB - gpu.used(0) - leave}")
    return it


def test_asking_again_and_again_for_one_byte_parks_nobody(slices, holder, client, cudrive, start_broker,
                                                           socket_path, gpu, root):
    """alice's idle kernel asks for 1 byte every 100 ms with one since: each OK
    is room that was there. Before, every OK to the same wait made it ask 256
    MiB more, and after a few bob's idle kernel was parked "to make room" for
    her byte."""
    uuid = gpu.uuid(0)
    slices.make("alice", "8g", "1g")
    slices.make("bob", "12g", "1g")
    asker = client(slices.env("alice", kernel="k-alice"))
    bob = holder(slices.env("bob", kernel="k-bob"), "10g", age_s=HOUR)
    other = tenant(cudrive, gpu, leave=1 * GiB)
    start_broker()
    since = time.time_ns()
    for n in range(20):
        asker.ask(f"byte{n}", socket_path, uuid, 1, since=since)
        assert asker.final(f"byte{n}") == ([], "OK 0")
        time.sleep(0.1)
    assert running(bob.slice, bob.pid)
    assert not audit_of(root, "broker-park")
    assert other.pid  # held its memory all along


def test_a_handled_sigchld_does_not_end_a_wait_for_room(slices, holder, cudrive, start_broker, socket_path, gpu,
                                                        root, tmp_path):
    """A PyTorch DataLoader handles SIGCHLD; its workers exit while the main
    thread's allocation waits for room. Before, the first SIGCHLD ended the
    wait (out of memory, the cell failed); now only Jupyter's interrupt does."""
    slices.make("carol", "8g", "1g")
    other = tenant(cudrive, gpu, leave=512 * MiB)  # no library: nothing the agent may park
    start_broker("--reserve", "0")
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent("""
        import signal, subprocess, sys, threading, time
        from hami_jupyter import driver_memory
        signal.signal(signal.SIGCHLD, lambda *_: None)   # handled, as a DataLoader does
        driver_memory.init(0)
        def children():
            for _ in range(40):
                subprocess.Popen(["true"]).wait()
                time.sleep(0.1)
        threading.Thread(target=children, daemon=True).start()
        print("waiting", flush=True)
        try:
            buffer = driver_memory.DeviceBuffer(2 << 30)
        except driver_memory.CudaError as e:
            print("failed", e.name, flush=True)
            sys.exit(1)
        print("allocated", flush=True)
    """))
    env = slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path, HAMI_ROOM_WAIT=60)
    env["PYTHONPATH"] = broker_env(gpu)["PYTHONPATH"]
    import subprocess
    proc = subprocess.Popen(["python3", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(3)  # about 30 children exited meanwhile, each a SIGCHLD
        assert proc.poll() is None, proc.communicate()
        other.ok("freeall")  # the other tenant leaves: room
        out, err = proc.communicate(timeout=WAIT_S)
        assert out.strip().splitlines()[-1] == "allocated", out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_slice_without_a_cap_waits_for_the_drivers_own_memory(slices, holder, cudrive, start_broker,
                                                                socket_path, gpu, root):
    """A slice with no memory cap (a limits file with a share only): its
    kernel's first launch on a full GPU waits for room like its allocations
    would. Before, "no room in the slice ... of its 0 B cap" and out of memory."""
    gpu.config["HAMI_SIM_CKPT_FREE"] = 0  # the checkpoint's own room is test_room_kept's
    create_slice(slices.path("carol"), "carol", Limits(sm_share=50))
    slices.make("alice", "12g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice"), "10g", age_s=HOUR)
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path, HAMI_ROOM_WAIT=60))
    carol.ok("init")
    carol.ok("ctx 0")
    carol.ok("module")
    filled = carol.cmd("fill 1m")
    assert filled["last_err"] == "CUDA_ERROR_OUT_OF_MEMORY"
    start_broker("--reserve", "0")
    launched = carol.cmd("launch 1000", timeout=WAIT_S)
    assert launched["rc"] == 0, f"{launched}\n{carol.stderr()[-3000:]}"
    assert parked(alice.slice, alice.pid)
    assert not any("0 B cap" in line for line in carol.hami_lines()), carol.hami_lines()


def test_a_context_refused_by_the_compute_mode_does_not_wait(slices, cudrive, gpu):
    """An exclusive-process GPU with another process on it refuses a context as
    busy for good: said at once, no wait (before: 120 s whatever the cause,
    HAMI_ROOM_WAIT not asked)."""
    slices.make("carol", "8g", "1g")
    first = cudrive.start(gpu.env(HAMI_SIM_COMPUTE_MODE="exclusive-process"))
    first.ok("init")
    first.ok("ctx 0")
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_SIM_COMPUTE_MODE="exclusive-process"))
    carol.ok("init")
    began = time.monotonic()
    made = carol.cmd("ctx 0", timeout=WAIT_S)
    assert made["err"] == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    assert time.monotonic() - began < 10, "it waited for a busy GPU that its compute mode explains"
    assert any("exclusive-process" in line for line in carol.hami_lines()), carol.hami_lines()


def test_no_wait_for_a_busy_gpu_with_room_wait_zero(slices, holder, cudrive, start_broker, gpu, root):
    """HAMI_ROOM_WAIT=0 means never wait: a stream refused as busy during
    another process's park is the program's at once."""
    slices.make("alice", "8g", "1g")
    slices.make("carol", "8g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice", HAMI_FAST_PARK=0), "4g", age_s=HOUR)  # the checkpoint's
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_ROOM_WAIT=0))
    carol.ok("init")
    carol.ok("ctx 0")
    start_broker("--headroom", "14g", env=broker_env(gpu, HAMI_SIM_CKPT_RATE="1g"))
    wait_for(lambda: any(p["pid"] == alice.pid and p.get("checkpoint") in ("locked", "checkpointing")
                         for p in gpu.status()["processes"]), WAIT_S, interval=0.02,
             what="alice's checkpoint under way")
    made = carol.cmd("stream", timeout=WAIT_S)
    assert made["err"] == "CUDA_ERROR_DEVICE_UNAVAILABLE", made
    assert not any("is busy" in line for line in carol.hami_lines()), carol.hami_lines()


def test_a_process_without_a_slot_asking_in_a_loop_costs_one_look_a_second(start_broker, socket_path, gpu):
    """A process with no slot (no library) connects and asks, 200 times as fast
    as it can. Each is refused; before, each made the agent take a full look of
    the node (NVML, /proc, every slice file) under the node's lock, which the
    watch and every user's requests wait for. Here a look of NVML's process
    lists takes 100 ms per GPU (HAMI_SIM_PROCESS_LIST_NS), so 200 looks take 40 s:
    the flood is refused in a fraction of that."""
    import socket as sockets
    broker = start_broker("--log-level", "debug", env=broker_env(gpu, HAMI_SIM_PROCESS_LIST_NS=100_000_000))
    uuid = gpu.uuid(0)
    began = time.monotonic()
    for n in range(200):
        s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        s.connect(str(socket_path))
        s.sendall(f"ROOM {uuid} 1048576 {time.time_ns() + n}\n".encode())
        assert s.recv(512).startswith(b"NO ")
        s.close()
    spent = time.monotonic() - began
    assert spent < 10, f"200 refusals took {spent:.1f} s: a look of the node for each"
    looks = broker.log().count("a fresh look for the admission of pid")
    assert looks <= spent + 2, f"{looks} fresh looks of the node in {spent:.1f} s"
