"""The wait for room on a full GPU, the library's side of the memory broker.

A process asks for memory its slice has room for, but the GPU has none: other
work fills it. The library asks the node's memory broker (a Unix socket, one
``ROOM <uuid> <bytes> <since>`` line each way, docs/parking.md) and tries the
driver again when the broker says OK. The broker here is a small fake, a
thread of this test that answers per the protocol and makes room by parking a
victim with hami-park or by telling a cudrive hog to free. The simulated GPU
has 4 GiB, so a hog fills it with a few allocations.
"""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import pytest

from hami_jupyter.slice.layout import HAMI_PARK_REASON_ROOM, HAMI_PARK_RUNNING, HAMI_PARK_WAIT_GPU
from native_helpers import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GiB,
    MiB,
    SIM_CONTEXT,
    fast_park_tested,
    slice_device,
    slot_of,
    wait_for,
)

SIM = "4g"  # the simulated GPU's memory: every process of a test says the same
WAIT_S = 30  # a bound on any wait of the test, never reached when all is well
NO_BROKER = "no memory broker answered (is hami-jupyter broker running?)"


# ---- the fake broker ---------------------------------------------------------------


@dataclass
class Request:
    uuid: str
    bytes: int
    since: int
    pid: int


class FakeBroker:
    """A memory broker as small as these tests need: a Unix socket server on a
    thread. Each request goes to ``serve(request, conn)``, a generator of the
    lines to answer (written as it yields them); when it ends the connection
    is closed, answered or not."""

    def __init__(self, path, serve):
        self.path = str(path)
        self.serve = serve
        self.requests = []
        self.errors = []
        self._stop = threading.Event()
        self._threads = []
        self._sock = None

    def start(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.path)
        s.listen(8)
        s.settimeout(0.05)
        self._sock = s
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _handle(self, conn):
        try:
            with conn:
                pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                struct.calcsize("3i")))
                conn.settimeout(10)
                line = b""
                while not line.endswith(b"\n"):
                    chunk = conn.recv(256)
                    if not chunk:
                        return
                    line += chunk
                word, uuid, nbytes, since = line.decode().split()
                assert word == "ROOM", line
                request = Request(uuid, int(nbytes), int(since), pid)
                self.requests.append(request)
                for answer in self.serve(request, conn):
                    conn.sendall(answer.encode() + b"\n")
        except Exception as e:  # reported by the test, never lost in a thread
            self.errors.append(repr(e))

    def stop(self):
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        for t in self._threads:
            t.join(timeout=WAIT_S)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        assert not self.errors, self.errors


@pytest.fixture
def broker_dir():
    # A short folder: a Unix socket path holds 107 bytes at most.
    path = tempfile.mkdtemp(prefix="hami-broker-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def brokers(broker_dir):
    started = []

    def start(serve, name="broker.sock"):
        b = FakeBroker(os.path.join(broker_dir, name), serve).start()
        started.append(b)
        return b

    yield start
    for b in started:
        if not b._stop.is_set():
            b.stop()


# ---- the processes ------------------------------------------------------------------


@pytest.fixture
def room_env(make_slice, broker_dir):
    """``room_env(name, limit, **env)``: a slice on the 4 GiB GPU whose
    processes ask the broker at broker_dir/broker.sock."""

    def make(name="team", limit="2g", **extra):
        extra.setdefault("HAMI_BROKER_SOCKET", os.path.join(broker_dir, "broker.sock"))
        return make_slice(name=name, limit=limit, overhead="64m", HAMI_SIM_MEMORY=SIM, **extra)

    return make


def hog(cudrive, gpu, size):
    """A process outside any slice holding *size* (and its context) on GPU 0."""
    p = cudrive.start(gpu.env(HAMI_SIM_MEMORY=SIM))
    for line in ("init", "ctx 0", f"alloc {size} big"):
        p.ok(line)
    return p


def waiter(cudrive, s, ctx=True):
    p = cudrive.start(s.env)
    p.ok("init")
    if ctx:
        p.ok("ctx 0")
    return p


def slot(s, pid):
    found = slot_of(s.snapshot(), pid)
    assert found is not None, f"process {pid} has no live slot"
    return found



def park(hami_build, s, pid, reason="room"):
    env = {k: v for k, v in s.env.items() if k != "LD_PRELOAD"}
    done = subprocess.run([str(hami_build.out / "hami-park"), "park", str(s.path), str(pid), "10000", reason],
                          env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stdout + done.stderr
    return int(done.stdout.split()[1])


# ---- no broker, no wait -----------------------------------------------------------------


@pytest.mark.parametrize("broker", ["missing", "not listening"])
def test_without_a_broker_an_allocation_fails_at_once_saying_so(broker, cudrive, gpu, room_env, broker_dir):
    s = room_env(HAMI_ROOM_WAIT="600")  # were it waited for, the answer would not come in time
    if broker == "not listening":  # a socket file nobody serves: connection refused
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(os.path.join(broker_dir, "broker.sock"))
        dead.close()
    hog(cudrive, gpu, "3g")
    p = waiter(cudrive, s)
    rec = p.cmd("alloc 1g x", timeout=WAIT_S)
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    [line] = p.hami_lines()
    assert NO_BROKER in line and "GPU 0" in line, line
    me = slot(s, p.pid)
    assert me.room_wait_since_unix_ns == 0
    assert s.used(0) == SIM_CONTEXT  # the reservation was given back
    p.ok("alloc 512m y")  # and what fits goes on as before


def test_room_wait_0_never_asks(cudrive, gpu, room_env, brokers):
    b = brokers(lambda req, conn: iter(["OK 0"]))
    s = room_env(HAMI_ROOM_WAIT="0")
    hog(cudrive, gpu, "3g")
    p = waiter(cudrive, s)
    assert p.cmd("alloc 1g x", timeout=WAIT_S)["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert b.requests == [] and p.hami_lines() == []  # today's behaviour, word for word


def test_past_the_slices_own_limit_the_broker_is_never_asked(cudrive, gpu, room_env, brokers):
    b = brokers(lambda req, conn: iter(["OK 0"]))
    s = room_env(limit="2g")
    hog(cudrive, gpu, "3g")  # the GPU is full too: the slice's refusal comes first
    p = waiter(cudrive, s)
    assert p.cmd("alloc 3g x", timeout=WAIT_S)["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert b.requests == []
    lines = p.hami_lines()  # one refusal: its plain words, then the technical line
    assert any("cap in use" in line for line in lines), lines
    assert not any("broker" in line or "waiting" in line for line in lines), lines


# ---- the broker makes room ------------------------------------------------------------------


def test_a_broker_that_parks_a_victim_makes_the_allocation_go_through(cudrive, gpu, room_env, brokers,
                                                                        hami_build):
    victim_slice = room_env(name="victim", limit="4g")
    victim = cudrive.start(victim_slice.env)
    # 3 GiB on the GPU; 1 MiB of it written (the simulated driver keeps contents only of what
    # was written, so parking it is quick) to prove it comes back intact.
    for line in ("init", "ctx 0", "alloc 3g v", "alloc 1m w", "write w 7"):
        victim.ok(line)
    s = room_env(limit="2g")
    seen = {}

    def serve(req, conn):
        yield "BUSY 1"
        me = slot(s, req.pid)  # the waiter's slot says it waits, and for what
        seen["slot"] = (me.room_wait_since_unix_ns, me.room_wait_bytes, me.room_wait_device)
        freed = park(hami_build, victim_slice, victim.pid, "room")
        yield f"OK {freed}"

    b = brokers(serve)
    p = waiter(cudrive, s)
    rec = p.cmd("alloc 1g x", timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, (rec, p.stderr())
    [req] = b.requests
    dev = slice_device(s.snapshot(), gpu.uuid(0))
    assert (req.uuid, req.bytes, req.pid) == (gpu.uuid(0), GiB, p.pid)
    assert seen["slot"] == (req.since, GiB, dev.index)  # the since the request carried
    assert req.since > 0
    assert slot(s, p.pid).room_wait_since_unix_ns == 0  # no longer waiting
    assert s.used(0) == SIM_CONTEXT + GiB
    [line] = p.hami_lines()  # one line, when the wait began
    assert "has no room for 1.0 GiB now" in line and "waiting up to 120 s" in line, line
    assert slot(victim_slice, victim.pid).park_reason == HAMI_PARK_REASON_ROOM
    p.ok("write x 9")
    p.ok("free x")  # room for the victim again: its next call brings it back, intact
    assert victim.ok("check w 7", timeout=WAIT_S)["equal"]


PATHS = {  # what waits, the call, the bytes the slice reserved for it, the hog's size
    "cuMemAlloc": ("alloc 1g x", GiB, "3g"),
    "cuMemAllocPitch": ("pitch 1m 1024 4 x", GiB, "3g"),
    "cuMemAllocManaged": ("managed 1g x", GiB, "3g"),
    "cuMemAllocAsync": ("async 1g x", GiB, "3g"),
    "cuMemAllocFromPoolAsync": ("poolalloc p 1g x", GiB, "3g"),
    "cuMemCreate": ("memcreate 1g 0 x", GiB, "3g"),
    "cuArrayCreate": ("array 65536 4096 f32 1 x", GiB, "3g"),
    "cuCtxCreate": ("ctxcreate 0 c", SIM_CONTEXT, "3936m"),
    "cuDevicePrimaryCtxRetain": ("ctx 0", SIM_CONTEXT, "4000m"),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_charged_path_waits_for_room(path, cudrive, gpu, room_env, brokers):
    command, reserved, hog_size = PATHS[path]
    h = hog(cudrive, gpu, hog_size)

    def serve(req, conn):
        h.ok("free big")  # room made
        yield f"OK {reserved}"

    b = brokers(serve)
    s = room_env(limit="2g")
    p = waiter(cudrive, s, ctx=path != "cuDevicePrimaryCtxRetain")
    if path == "cuMemAllocFromPoolAsync":
        p.ok("pool 0 p")
    rec = p.cmd(command, timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, (rec, p.stderr())
    [req] = b.requests
    assert (req.uuid, req.pid) == (gpu.uuid(0), p.pid)
    assert req.bytes == reserved or (path == "cuMemAllocPitch" and req.bytes >= GiB), req
    assert slot(s, p.pid).room_wait_since_unix_ns == 0


# ---- the broker finds nothing -----------------------------------------------------------------


def test_a_broker_that_finds_nothing_ends_the_wait_at_the_bound(cudrive, gpu, room_env, brokers):
    b = brokers(lambda req, conn: iter(["NO every kernel on GPU 0 ran in the last 60 s"]))
    s = room_env(HAMI_ROOM_WAIT="2")
    hog(cudrive, gpu, "3g")
    p = waiter(cudrive, s)
    started = time.monotonic()
    rec = p.cmd("alloc 1g x", timeout=WAIT_S)
    waited = time.monotonic() - started
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert waited >= 2.0, waited  # it waited out its bound (the broker said no at once)
    assert len(b.requests) >= 2, b.requests  # and asked again meanwhile
    assert len({r.since for r in b.requests}) == 1  # always for the same wait
    start, again, end = p.hami_lines()  # the re-asks are said once
    assert "waiting up to 2 s" in start, start
    assert ("can make no room yet (every kernel on GPU 0 ran in the last 60 s); asking again every second"
            in again), again
    assert "found nothing to park: every kernel on GPU 0 ran in the last 60 s" in end, end
    assert slot(s, p.pid).room_wait_since_unix_ns == 0 and s.used(0) == SIM_CONTEXT


def test_a_broker_restart_is_asked_again_with_the_same_since(cudrive, gpu, room_env, brokers):
    h = hog(cudrive, gpu, "3g")
    first = brokers(lambda req, conn: iter(()))  # takes the request, then goes away unanswered
    s = room_env()
    p = waiter(cudrive, s)
    p.send("alloc 1g x")
    wait_for(lambda: first.requests, WAIT_S, what="the first request")
    first.stop()  # the socket is gone for a while: the library keeps trying

    def serve(req, conn):
        h.ok("free big")
        yield "OK 1073741824"

    time.sleep(0.5)
    second = brokers(serve)
    rec = p.read(timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, (rec, p.stderr())
    assert second.requests and {r.since for r in first.requests + second.requests} == \
        {first.requests[0].since}
    assert len(p.hami_lines()) == 1  # the wait's one line; no refusal


def test_a_process_killed_while_waiting_leaves_the_slice_as_it_was(cudrive, gpu, room_env, brokers):
    gone = threading.Event()

    def serve(req, conn):
        yield "BUSY 1"
        conn.settimeout(WAIT_S)
        if conn.recv(1) == b"":  # the requester's end closed: a broker drops the request
            gone.set()

    brokers(serve)
    s = room_env()
    hog(cudrive, gpu, "3g")
    p = waiter(cudrive, s)
    p.send("alloc 1g x")
    wait_for(lambda: slot(s, p.pid).room_wait_since_unix_ns, WAIT_S, what="the wait in the slot")
    assert s.used(0) == SIM_CONTEXT + GiB  # the reservation is kept while it waits
    p.kill9()
    assert gone.wait(WAIT_S), "the broker never saw the requester go"
    sweeper = cudrive.start(s.env)  # any process of the slice reclaims the dead slot
    sweeper.ok("init")
    sweeper.ok("ctx 0")
    wait_for(lambda: slot_of(s.snapshot(), p.pid) is None, WAIT_S, what="the dead slot reclaimed")
    assert s.used(0) == SIM_CONTEXT  # the sweeper's context alone


# ---- a resume that finds no room ------------------------------------------------------------------


def test_a_parked_process_whose_resume_finds_no_room_asks_the_broker(cudrive, gpu, room_env, brokers,
                                                                      hami_build):
    s = room_env(limit="2g")
    p = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 1g a", "alloc 1m b", "write b 90"):
        p.ok(line)
    parked = park(hami_build, s, p.pid, "idle")
    held = SIM_CONTEXT + GiB + MiB
    # The fast park moves the 1 GiB and leaves the context and the 1 MiB (too small to move).
    assert parked == (GiB if fast_park_tested() else held)
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="the charge moved to parked")
    h = hog(cudrive, gpu, "3500m")  # the GPU fills meanwhile: 532 MiB free
    seen = {}

    def serve(req, conn):
        me = slot(s, req.pid)
        seen["slot"] = (me.room_wait_since_unix_ns, me.room_wait_bytes, me.park_wait, me.park_state)
        h.ok("free big")
        yield f"OK {3500 * MiB}"

    b = brokers(serve)
    assert p.ok("check b 90", timeout=WAIT_S)["equal"]  # its call asks for the state back
    [req] = b.requests
    assert (req.uuid, req.bytes, req.pid) == (gpu.uuid(0), parked, p.pid)
    assert seen["slot"][0] == req.since and seen["slot"][1:] == (parked, HAMI_PARK_WAIT_GPU, 2)
    me = slot(s, p.pid)
    assert me.park_state == HAMI_PARK_RUNNING and me.room_wait_since_unix_ns == 0
    assert s.used(0) == held and gpu.process_used(p.pid, 0) == held


# ---- the driver's own memory and the interrupt -------------------------------------------


def test_a_launch_the_driver_refused_for_its_own_memory_waits_and_runs(cudrive, gpu, room_env, brokers):
    """A kernel's first launch needs its code on the device (lazy loading) and,
    here, 256 MiB of local memory: on a full GPU the driver refuses it and it
    does not start. It waits for the broker, which makes room, and runs."""
    h = hog(cudrive, gpu, "3g")

    def serve(req, conn):
        h.ok("free big")
        yield "OK 3221225472"

    s = room_env()
    p = waiter(cudrive, s)
    p.ok("module hami_sim_local_256m")
    p.cmd("fill 64m")  # the rest of the GPU (no broker yet: refused at once)
    b = brokers(serve)
    rec = p.cmd("launch 1000", timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, f"{rec}\n{p.stderr()[-2000:]}"
    [req] = b.requests
    assert req.bytes == 256 * MiB and req.pid == p.pid  # the library's first ask for the driver's own needs
    assert slot(s, p.pid).room_wait_since_unix_ns == 0
    _, start = [line for line in p.hami_lines() if "broker" in line]  # the fill's, then the launch's
    assert "(a kernel launch" in start and "waiting up to" in start, start


INTERRUPTED = """
import ctypes, json, signal, sys, time
signals = []
signal.signal(signal.SIGINT, lambda *a: signals.append(1))  # handled, as IPython's kernel does
cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
print("ready", flush=True)
for attempt in range(2):  # the second: a framework's retry right after the refusal
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 30))
    print(json.dumps({"rc": rc, "at": time.monotonic(), "signals": len(signals)}), flush=True)
sys.stdin.read()
"""


def test_a_handled_signal_ends_the_wait_at_once_and_leaves_nothing_behind(cudrive, gpu, room_env, brokers,
                                                                           tmp_path):
    """Jupyter's "Interrupt kernel" is SIGINT, which Python handles: a cell
    waiting for room ends within a second with out of memory, its framework's
    retry too, and the wait leaves nothing reserved and nothing in the slot."""
    b = brokers(lambda req, conn: iter(["NO every kernel on GPU 0 ran in the last 60 s"]))
    s = room_env(HAMI_ROOM_WAIT="120")
    hog(cudrive, gpu, "3g")
    err = open(tmp_path / "interrupted.stderr", "w+")
    p = None
    try:
        p = subprocess.Popen([sys.executable, "-c", INTERRUPTED], env=s.env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, text=True)
        assert p.stdout.readline().strip() == "ready"
        wait_for(lambda: len(b.requests) >= 2, WAIT_S, what="a NO, and the question asked again")
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        first, retry = json.loads(p.stdout.readline()), json.loads(p.stdout.readline())
        assert first["rc"] == CUDA_ERROR_OUT_OF_MEMORY and first["signals"] == 1
        assert first["at"] - sent < 1.0 and retry["rc"] == CUDA_ERROR_OUT_OF_MEMORY and retry["at"] - sent < 1.0
        assert s.used(0) == SIM_CONTEXT  # no reservation left
        assert slot(s, p.pid).room_wait_since_unix_ns == 0  # no wait in the slot
        err.seek(0)
        said = [line for line in err.read().splitlines() if line.startswith("hami:")]
        assert sum("asking again every second" in line for line in said) == 1, said
        assert sum("was interrupted: out of memory" in line for line in said) == 1, said
    finally:
        if p is not None:
            p.kill()
            p.wait(10)
        err.close()


def test_a_context_refused_while_another_process_is_parked_waits_for_the_park(cudrive, gpu, room_env):
    """While a parker holds another process of the GPU locked (its state on
    the way to host memory), the driver refuses new contexts there: "busy or
    unavailable" (an H100 did this to a PyTorch session's set-up while the
    broker parked another). The library waits for the park, then goes on."""
    other = hog(cudrive, gpu, "64m")
    parker = cudrive.start(gpu.env(HAMI_SIM_MEMORY=SIM))
    parker.ok("init")
    parker.ok(f"ckpt lock {other.pid}")
    plain = cudrive.start(gpu.env(HAMI_SIM_MEMORY=SIM))  # without the library: the driver's own answer
    plain.ok("init")
    assert plain.cmd("ctx 0")["err"] == "CUDA_ERROR_DEVICE_UNAVAILABLE"
    p = waiter(cudrive, room_env(), ctx=False)
    p.send("ctx 0")
    wait_for(lambda: any("is busy" in line for line in p.hami_lines()), WAIT_S, what="the wait said")
    parker.ok(f"ckpt unlock {other.pid}")
    rec = p.read(WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, f"{rec}\n{p.stderr()[-2000:]}"
    [said] = p.hami_lines()
    assert "GPU 0 is busy (another process's GPU state is being moved to or from host memory)" in said, said
