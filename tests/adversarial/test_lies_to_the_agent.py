"""Lies, forged slots and floods against the node agent's room policy (issue 33).

A user writes her own slice file (her processes keep their slots in it) and
may connect to the agent's socket as often as she likes. Here she does what a
hostile user of a hub would: a slot naming another process, claims of
activity, of a park under way and of a wait in her own slot, a lower charge
than she holds, a past she never had, hundreds of idle connections, and the
same request again and again. The agent's answer and what it parks must rest
on facts only: no other kernel parked or frozen, no other request slowed
beyond its bounds, her own kernel no less parkable.

Real agents (``hami-jupyter broker`` or ``agent``) and real processes on the
simulated GPU (16 GiB), as in tests/broker.
"""

import ctypes
import fcntl
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker_helpers import GiB, MiB, audit_of, broker_env, held_park_tool, parked, running, slot
from native_helpers import wait_for

from hami_jupyter.agent.protocol import parse_answer
from hami_jupyter.slice import registry
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import (DEVICES_OFFSET, HAMI_PARK_PARKING, HAMI_SLOT_LIVE, HamiSliceDevice,
                                       HamiSlot, slot_offset)
from hami_jupyter.slice.locks import F_OFD_SETLK, flock_bytes

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60


@pytest.fixture(autouse=True)
def release_build(gpu):
    """The agent is Python, and runs the release build's tools: under a sanitizer
    pass (HAMI_TEST_BUILD) it would load instrumented simulated libraries into
    them. Its lies are told once, in the release pass."""
    if gpu.build.sanitized:
        pytest.skip("the agent's tests run in the release pass (the agent is Python, its tools release builds)")


def _put(path, at, value, size=8):
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, int(value).to_bytes(size, "little"), at)
    finally:
        os.close(fd)


def _field(index, name):
    return slot_offset(index) + getattr(HamiSlot, name).offset


def charge_of(device):
    """Where the slice's own charge on slice device *device* lies in its file."""
    return DEVICES_OFFSET + device * ctypes.sizeof(HamiSliceDevice) + HamiSliceDevice.memory_used.offset


@contextmanager
def claiming(path, index, every_s=0.05, **fields):
    """Write *fields* (name -> value, or a callable of nothing) into slot *index*
    of *path* every *every_s*, as a user's own process could, until the end."""
    stop = threading.Event()

    def write():
        while not stop.is_set():
            for name, value in fields.items():
                size = getattr(HamiSlot, name).size
                _put(path, _field(index, name), value() if callable(value) else value, size)
            stop.wait(every_s)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join(5)


def forge_slot(path, pid, pid_ns, used_bytes, kernel_id="k-forged"):
    """A LIVE slot naming *pid*, idle for an hour by its word, its lock held by
    this process (the descriptor is returned: closing it lets the slot go)."""
    taken = {s.index for s in read_snapshot(path).slots}
    index = next(i for i in range(200, 256) if i not in taken)
    forged = HamiSlot()
    forged.state = HAMI_SLOT_LIVE
    forged.pid = pid
    forged.pid_ns = pid_ns
    forged.memory_used[0] = used_bytes
    now = time.time_ns()
    forged.started_unix_ns = now - 2 * HOUR * 10**9
    forged.gpu_active_unix_ns = now - HOUR * 10**9
    forged.active_unix_ns = now
    forged.kernel_id = kernel_id.encode()
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, bytes(forged), slot_offset(index))
    fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, slot_offset(index)))
    return fd, index


def test_a_slot_naming_another_users_process_parks_nothing_of_it(slices, holder, client, start_broker,
                                                                  socket_path, gpu, root):
    """Finding 1 without the hub: alice writes into her own slice file a slot
    naming bob's kernel (PID namespace 0, idle for an hour, a fresh heartbeat,
    its lock held) and asks for room. bob's slice keeps all it holds (its
    guarantee is its limit): nothing of bob's may be parked, frozen or slowed."""
    uuid = gpu.uuid(0)
    slices.make("alice", "16g", "1g")
    slices.make("bob", "8g", "8g")
    asker = client(slices.env("alice", kernel="k-alice"))
    bob = holder(slices.env("bob", kernel="k-bob"), "6g", age_s=HOUR)
    path = slices.path("alice")
    fd, index = forge_slot(path, bob.pid, 0, 6 * GiB + CONTEXT)
    _put(path, charge_of(read_snapshot(path).devices[0].index), 8 * GiB)  # alice's slice "holds" 8 GiB
    try:
        with claiming(path, index, active_unix_ns=time.time_ns):  # a heartbeat, as a parking thread's
            start_broker()
            asker.ask("w", socket_path, uuid, 12 * GiB)  # bob's 6 GiB would make the room
            word, why = parse_answer(asker.final("w")[1])
        assert word == "NO", why
    finally:
        os.close(fd)
    assert running(bob.slice, bob.pid)
    assert gpu.process_used(bob.pid, 0) == 6 * GiB + CONTEXT  # on the GPU, not checkpointed
    assert bob.ok("alloc 1m")["rc"] == 0  # not frozen: it allocates at once
    assert not audit_of(root, "broker-park")


def test_claims_of_activity_keep_no_kernel_from_a_park(slices, holder, client, start_broker, socket_path, gpu,
                                                        root):
    """Finding 3: alice's kernel is idle, but her own files say otherwise: her
    slot claims a GPU call every 50 ms, a park under way (PARKING written 20
    times a second), a wait for room, and her slice's counter a charge below
    its guarantee; her server's registry says a cell runs. The agent watched
    it do nothing: carol's request has it parked, her claims notwithstanding
    (held by the driver, since her slot refuses a park), and carol's own
    kernel, the only other one, is within its guarantee and stays."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "4g")
    slices.make("alice", "8g", "1g")
    asker = client(slices.env("carol", kernel="k-carol"))
    stays = holder(slices.env("carol", kernel="k-other"), "2g", age_s=HOUR)
    liar = holder(slices.env("alice", kernel="k-alice"), "6g", age_s=HOUR)
    path, index = slices.path("alice"), slot(slices.path("alice"), liar.pid).index
    registry.register(path, registry.new_entry(path, "k-alice", "alice", "hami-python3", liar.pid))
    registry.record_activity(path, "k-alice", time.time(), True)
    device = read_snapshot(path).devices[0]
    _put(path, charge_of(device.index), 0)  # "my slice holds nothing here": below its guarantee
    # "A parker is at work on me": the park state's lock held, as hami-park holds it.
    parker = os.open(path, os.O_RDWR)
    fcntl.fcntl(parker, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, _field(index, "park_state")))
    with claiming(path, index, gpu_active_unix_ns=time.time_ns, park_state=HAMI_PARK_PARKING,
                  room_wait_since_unix_ns=time.time_ns, room_wait_device=device.index, room_wait_bytes=GiB):
        broker = start_broker("--min-idle-seconds", "1")
        time.sleep(4)  # the agent watches for longer than a park's first steps and its min-idle
        asker.ask("w", socket_path, uuid, 16 * GiB - gpu.used(0) + 4 * GiB)  # alice's 6 GiB make it
        assert asker.final("w", timeout=WAIT_S) == ([], f"OK {6 * GiB + CONTEXT}"), broker.log()[-3000:]
    os.close(parker)
    assert gpu.process_used(liar.pid, 0) == 0  # off the GPU: held by the driver
    assert running(stays.slice, stays.pid) and gpu.process_used(stays.pid, 0) == 2 * GiB + CONTEXT
    [park] = audit_of(root, "broker-park")
    assert park["kernel"] == "k-alice" and park["held"] == [liar.pid], park
    report = broker.wait_report(lambda r: r.get("held"), what="the held process in broker.json")
    assert [h["pid"] for h in report["held"]] == [liar.pid]


def test_a_wait_claimed_in_a_slot_does_not_stop_the_headroom(slices, holder, start_broker, gpu, root):
    """Finding 3: a slot of alice's says it waits for room on the GPU (nobody
    asked the agent): the headroom keeper goes on keeping the headroom."""
    uuid = gpu.uuid(0)
    for name in ("alice", "bob"):
        slices.make(name, "12g")
    idle = holder(slices.env("bob", kernel="k-bob"), "8g", age_s=HOUR)
    claims = holder(slices.env("alice", kernel="k-alice"), "7g")
    path = slices.path("alice")
    index, device = slot(path, claims.pid).index, read_snapshot(path).devices[0].index
    _put(path, _field(index, "room_wait_device"), device, 4)
    _put(path, _field(index, "room_wait_bytes"), GiB)
    _put(path, _field(index, "room_wait_since_unix_ns"), time.time_ns())
    broker = start_broker("--headroom", "4g", "--min-idle-seconds", "1")
    report = broker.wait_report(lambda r: ((r["gpus"].get(uuid) or {}).get("headroom") or {}).get("kept"),
                                timeout=WAIT_S, what="the headroom kept")
    assert parked(idle.slice, idle.pid)
    assert [r["kernel"] for r in audit_of(root, "broker-park")] == ["k-bob"]
    assert report["gpus"][uuid]["headroom"]["kept"] is True


def test_a_claimed_past_moves_no_request_ahead(slices, holder, client, start_broker, socket_path, gpu, root,
                                               tmp_path):
    """Finding 3: dave asks first; carol asks after him, saying her wait began
    in 1970 and her slot saying her process started then too. A wait cannot
    begin before its process did (/proc says when), nor long before the agent
    first heard of it: dave stays ahead."""
    uuid = gpu.uuid(0)
    for name, limit in (("erin", "16g"), ("dave", "16g"), ("carol", "16g"), ("alice", "8g"), ("bob", "8g"),
                        ("frank", "8g")):
        slices.make(name, limit)
    first = client(slices.env("erin", kernel="k-erin"))
    idlest = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=3 * HOUR)
    holder(slices.env("bob", kernel="k-bob"), "4g", age_s=2 * HOUR)
    holder(slices.env("frank", kernel="k-frank"), "4g", age_s=HOUR)
    honest = client(slices.env("dave", kernel="k-dave"))
    liar = client(slices.env("carol", kernel="k-carol"))
    _put(liar.slice, _field(slot(liar.slice, liar.pid).index, "started_unix_ns"), 1)
    held = held_park_tool(tmp_path, idlest.pid)
    folder, go, began = held
    broker = start_broker("--min-idle-seconds", "1", env=broker_env(gpu, HAMI_NATIVE_DIR=folder))
    try:
        time.sleep(11)  # the agent has run a while: a wait it never heard of cannot be old
        first.ask("first", socket_path, uuid, 8 * GiB)
        wait_for(began.exists, WAIT_S, what="the first request's park under way")
        honest.ask("honest", socket_path, uuid, 8 * GiB)
        assert honest.line("honest") == "BUSY 1"
        time.sleep(2.5)  # carol asks a little later, and claims her wait began in 1970
        liar.ask("liar", socket_path, uuid, 8 * GiB, since=1)
        liar.line("liar")  # BUSY n
        report = broker.wait_report(lambda r: len(r["gpus"].get(uuid, {}).get("queue", [])) == 3)
        queue = report["gpus"][uuid]["queue"]
        assert [q["pid"] for q in queue] == [first.pid, honest.pid, liar.pid], queue
        assert queue[2]["since_unix_ns"] > queue[1]["since_unix_ns"]  # not 1970, not before dave's
    finally:
        held.release()  # the held park goes on: no stand-in hami-park left waiting


def _socket_folder():
    """A root-owned folder of mode 0755 under /tmp, for a socket other users can reach."""
    folder = Path(tempfile.mkdtemp(prefix="hami-agent-sock-"))
    folder.chmod(0o755)
    return folder


FLOOD = textwrap.dedent("""
    import os, socket, sys, time
    os.setgid(65534)
    os.setuid(65534)
    held = []
    for _ in range(int(sys.argv[2])):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sys.argv[1])
        except OSError:
            break
        held.append(s)
    print(len(held), flush=True)
    time.sleep(120)
""")


def test_a_flood_of_connections_from_one_user_keeps_no_one_else_waiting(slices, holder, client, start_broker,
                                                                        gpu, root):
    """Finding 4: user nobody opens 300 connections to the socket and writes
    nothing. Each user has only so many connections; carol's request is
    answered as if nobody flooded."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the flood comes from another user")
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice")
    asker = client(slices.env("carol", kernel="k-carol"))
    idle = holder(slices.env("alice", kernel="k-alice"), "6g", age_s=HOUR)
    folder = _socket_folder()
    sock = folder / "broker.sock"
    flood = None
    try:
        start_broker("--socket", sock)
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(sock), "300"], stdout=subprocess.PIPE,
                                 text=True, cwd="/")
        assert int(flood.stdout.readline()) == 300  # the kernel's backlog took them all
        asker.ask("w", sock, uuid, 16 * GiB - gpu.used(0) + 4 * GiB)
        assert asker.final("w", timeout=WAIT_S) == ([], f"OK {6 * GiB + CONTEXT}")
        assert parked(idle.slice, idle.pid)
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
    refused = [r for r in audit_of(root, "broker-refused") if r["uid"] == 65534]
    assert len(refused) <= 2, refused  # once a minute per reason: the flood fills no log


def test_asking_again_and_again_makes_no_more_room_than_the_slice_may_hold(slices, holder, client, start_broker,
                                                                           socket_path, gpu, root):
    """Finding 4: carol, 1 GiB short of her 2 GiB limit, asks for 512 MiB with
    the same since thirty times, allocating nothing. Each OK may add a step
    for the driver's rounding, but never past what her slice may still take:
    alice's idle kernel is never parked for her, and the thirty OKs are not
    thirty audit records."""
    uuid = gpu.uuid(0)
    slices.make("carol", "2g", "1g")
    slices.make("alice", "16g", "1g")
    asker = client(slices.env("carol", kernel="k-carol"))
    holder(slices.env("carol", kernel="k-carol"), "1g")
    idle = holder(slices.env("alice", kernel="k-alice"), "12g", age_s=HOUR)
    start_broker()
    since = time.time_ns()
    for n in range(30):
        asker.ask(f"w{n}", socket_path, uuid, 512 * MiB, since=since)
        assert asker.final(f"w{n}") == ([], "OK 0")
    assert running(idle.slice, idle.pid)
    assert not audit_of(root, "broker-park")
    assert len(audit_of(root, "broker-served")) <= 2


def test_requests_that_go_away_at_once_fill_no_log(slices, client, start_broker, socket_path, gpu, root):
    """Issue 39, row 4: alice connects, sends a request and closes, in a loop.
    Each left a ``broker-dropped`` record and a warning in the agent's log
    (6,543 in 15 s on a hub). One record a minute now, counting the rest."""
    uuid = gpu.uuid(0)
    slices.make("alice", "16g", "1g")
    alice = client(slices.env("alice", kernel="k-alice"))
    broker = start_broker()
    sent = alice.churn(socket_path, uuid, 1 << 20, 4)
    assert sent > 20, sent
    wait_for(lambda: audit_of(root, "broker-dropped"), 30, what="a record of the requests that went away")
    time.sleep(2)  # what the agent had still to read of the loop
    dropped = audit_of(root, "broker-dropped")
    assert len(dropped) == 1, f"{len(dropped)} records for {sent} requests"
    # It counts itself, and the others that went away before it was written (requests are served side by side).
    assert dropped[0]["requester"]["pid"] == alice.pid and 1 <= dropped[0]["times"] <= sent
    warnings = [line for line in broker.log().splitlines() if "went away" in line]
    assert len(warnings) == 1, warnings[:5]
