"""The room ledger, the library's side: a take on a tight GPU looks there first (issue 38).

The node agent publishes per GPU what it keeps free (the reserve), the room
it granted to each requester it answered OK, who waits, and whether a
process's state moves (docs/broker.md, "Room kept for its requester"). Here
the ledger is written by the agent's own writer (:class:`Ledger`) into the
folder of a fake broker's socket, so that the library's reading of it runs
under every build (release, ASan+UBSan, TSan) without the agent itself.
"""

import os
import threading
import time

import pytest

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GiB, MiB, wait_for
from test_room_wait import broker_dir, brokers  # noqa: F401 (fixtures: the fake broker)

from hami_jupyter.agent.ledger import Ledger, ledger_path
from hami_jupyter.slice.create import create_slice
from hami_jupyter.slice.limits import Limits

WAIT_S = 30
CUDA_ERROR_DEVICE_UNAVAILABLE = 46


@pytest.fixture
def ledger(broker_dir, gpu):
    """``ledger()``: the room ledger beside the fake broker's socket. Made before
    the processes start, as the agent's is: a library that found none looks for
    one again a second later."""
    gpu.config["HAMI_SIM_MEMORY"] = "4g"  # every process of the test, simctl too
    made, stop = [], threading.Event()

    def beat():  # the agent's heartbeat: a ledger not written for 5 s is not believed
        while not stop.wait(0.5):
            for led in made:
                if led.beating:
                    led.heartbeat()

    def make(beating=True):
        led = Ledger(ledger_path(os.path.join(broker_dir, "broker.sock")))
        led.beating = beating
        made.append(led)
        return led

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    yield make
    stop.set()
    beater.join()
    for led in made:
        led.close()


@pytest.fixture
def beyond(gpu, tmp_path, broker_dir):
    """A process of a slice whose 2 GiB limit lends all but 128 MiB (its guarantee),
    with its context on GPU 0: whatever it takes is beyond its guarantee."""
    from native_helpers import slice_env

    def start(cudrive, guarantee="128m", **extra):
        path = tmp_path / "team.slice"
        if not path.exists():
            create_slice(path, "team", Limits(memory_limit=2 * GiB, memory_guarantee=_size(guarantee)))
        env = slice_env(gpu, path, limit=None, overhead="64m",
                        HAMI_BROKER_SOCKET=os.path.join(broker_dir, "broker.sock"), **extra)
        p = cudrive.start(env)
        p.ok("init")
        p.ok("ctx 0")
        return p

    return start


def _size(text):
    from hami_jupyter.slice.size import parse_size
    return parse_size(text)


def test_a_take_beyond_the_guarantee_waits_its_turn_and_is_served_with_its_grant(cudrive, gpu, beyond, ledger,
                                                                                  brokers):
    """Someone waits for room on the GPU: the allocation (room there or not) asks
    the broker first, and goes through with the room granted to it, its
    connection held until the allocation is done."""
    uuid = gpu.uuid(0)
    led = ledger()
    led.publish(uuid, reserve=0, free=4 * GiB, waiting=1, turns=True, moving_until_ns=0)
    p = beyond(cudrive)
    closed = []

    def serve(req, conn):
        ticket = led.grant(uuid, req.pid, req.bytes, 60)
        yield f"OK 0 {ticket}"
        conn.settimeout(WAIT_S)
        assert conn.recv(16) == b""  # the library closes once its allocation is made
        closed.append(gpu.process_used(req.pid, 0))
        led.revoke(uuid, ticket)

    b = brokers(serve)
    rec = p.cmd("alloc 512m x", timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS
    [req] = b.requests
    assert (req.uuid, req.bytes, req.pid) == (uuid, 512 * MiB, p.pid)
    wait_for(lambda: closed, WAIT_S, what="the library's end of the grant's connection closed")
    assert closed[0] >= 512 * MiB  # closed after the allocation, not before
    assert any("is tight (others wait for room on it first)" in line and "waits its turn" in line
               for line in p.hami_lines()), p.hami_lines()


def test_within_its_guarantee_a_take_needs_no_turn_but_leaves_the_reserve(cudrive, gpu, beyond, ledger, brokers):
    b = brokers(lambda req, conn: iter(["NO nothing to park here"]))
    uuid = gpu.uuid(0)
    ledger().publish(uuid, reserve=3 * GiB + 512 * MiB, free=4 * GiB, waiting=1, turns=True,
                     moving_until_ns=0)
    p = beyond(cudrive, guarantee="2g", HAMI_ROOM_WAIT=2)
    rec = p.cmd("alloc 512m x", timeout=WAIT_S)  # about 430 MiB free beyond the reserve
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert all(r.bytes == 512 * MiB for r in b.requests) and b.requests
    assert any("has no room for 512.0 MiB now (cuMemAlloc)" in line for line in p.hami_lines()), p.hami_lines()
    asked = len(b.requests)
    assert p.cmd("alloc 256m y", timeout=WAIT_S)["rc"] == CUDA_SUCCESS  # within the guarantee, beside the reserve
    assert len(b.requests) == asked


def test_a_ledger_its_agent_stopped_writing_is_not_believed(cudrive, gpu, beyond, ledger, brokers):
    b = brokers(lambda req, conn: iter(["NO never asked"]))
    led = ledger(beating=False)
    led.publish(gpu.uuid(0), reserve=0, free=4 * GiB, waiting=1, turns=True, moving_until_ns=0,
                now_ns=time.time_ns() - 10 * 10**9)
    p = beyond(cudrive)
    assert p.cmd("alloc 512m x", timeout=WAIT_S)["rc"] == CUDA_SUCCESS
    assert b.requests == []


def test_a_ledger_someone_else_wrote_is_not_believed(cudrive, gpu, beyond, ledger, brokers):
    b = brokers(lambda req, conn: iter(["NO never asked"]))
    led = ledger()
    led.publish(gpu.uuid(0), reserve=0, free=4 * GiB, waiting=1, turns=True, moving_until_ns=0)
    os.chown(led.path, 65534, 65534)  # a user's file, not root's
    p = beyond(cudrive)
    assert p.cmd("alloc 512m x", timeout=WAIT_S)["rc"] == CUDA_SUCCESS
    assert b.requests == []
    assert any("room ledger" in line and "not believed" in line for line in p.hami_lines()), p.hami_lines()


@pytest.mark.parametrize("moving", [True, False])
def test_a_stream_refused_as_busy_waits_while_the_ledger_says_a_state_moves(cudrive, gpu, beyond, ledger, moving):
    """Another process is locked for a checkpoint: the driver refuses new streams
    on the GPU as busy. While the ledger says a state moves there the stream
    waits and is made once the other process is unlocked; when it says none
    does, the refusal stands after a short grace."""
    led = ledger()
    until = time.time_ns() + (60 * 10**9 if moving else 0)
    led.publish(gpu.uuid(0), reserve=0, free=4 * GiB, waiting=0, turns=False, moving_until_ns=until)
    other = cudrive.start(gpu.env())
    for line in ("init", "ctx 0", "alloc 64m z"):
        other.ok(line)
    p = beyond(cudrive, HAMI_ROOM_WAIT=20)
    lock = cudrive.run(["init", "ckpt", "lock", other.pid], gpu.env())
    assert lock.one("ckpt")["rc"] == CUDA_SUCCESS
    p.send("stream")
    if moving:
        time.sleep(3)  # past the grace: still waiting, the ledger says the move goes on
        unlock = cudrive.run(["init", "ckpt", "unlock", other.pid], gpu.env())
        assert unlock.one("ckpt")["rc"] == CUDA_SUCCESS
    rec = p.read(timeout=WAIT_S)
    if moving:
        assert rec["rc"] == CUDA_SUCCESS, rec
    else:
        assert rec["rc"] == CUDA_ERROR_DEVICE_UNAVAILABLE, rec
        unlock = cudrive.run(["init", "ckpt", "unlock", other.pid], gpu.env())
        assert unlock.one("ckpt")["rc"] == CUDA_SUCCESS
    assert any("is busy" in line for line in p.hami_lines()), p.hami_lines()


def test_a_handled_signal_other_than_sigint_does_not_end_a_wait(cudrive, gpu, beyond, ledger, brokers):
    """A handled SIGUSR1 stands for a DataLoader's SIGCHLD: sent during the wait
    (while the broker says NO), the wait goes on, and the broker's later OK
    lets the allocation through. Before, the first one ended it: out of memory."""
    answered = []
    uuid = gpu.uuid(0)
    led = ledger()
    led.publish(uuid, reserve=0, free=4 * GiB, waiting=1, turns=True, moving_until_ns=0)

    def serve(req, conn):
        if len(answered) < 3:
            answered.append(req)
            yield "NO not yet"
            return
        yield f"OK 0 {led.grant(uuid, req.pid, req.bytes, 60)}"

    brokers(serve)
    p = beyond(cudrive, HAMI_ROOM_WAIT=20)
    p.ok("handle USR1")
    p.send("alloc 512m x")
    for _ in range(6):
        time.sleep(0.3)
        os.kill(p.pid, 10)  # SIGUSR1
    rec = p.read(timeout=WAIT_S)
    assert rec["rc"] == CUDA_SUCCESS, f"{rec}\n{p.stderr()[-2000:]}"
    assert not any("interrupted" in line for line in p.hami_lines()), p.hami_lines()

