"""The agent as one program: both policies, one actor, one socket, one audit log.

A real ``hami-jupyter agent`` on the simulated GPU: the guard parks a bypass
over its cap and the room policy parks an idle kernel for a waiting request,
in one process, in one hash chain; and the parts that bound what one user can
ask of it (the queue, the records) in this process.
"""

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from broker_helpers import GiB, MiB, parked, running

from hami_jupyter import audit
from hami_jupyter.agent import records as records_module
from hami_jupyter.agent.actor import Actor, Busy
from hami_jupyter.agent.room import queue as queue_module
from hami_jupyter.agent.room.queue import EXPIRED, QueueFull, Queues
from hami_jupyter.agent.room.request import Request
from hami_jupyter.processes import start_ticks
from hami_jupyter.slice.guard_report import read_report
from native_helpers import wait_for

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60


def test_one_agent_guards_the_caps_and_makes_room(slices, holder, client, start_agent, socket_path, gpu, root):
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice", "8g", "1g")
    slices.make("bob", "1g", "1g")
    asker = client(slices.env("carol", kernel="k-carol"))
    idle = holder(slices.env("alice", kernel="k-alice"), "6g", age_s=HOUR)
    agent = start_agent()
    # bob's process without the library passes his 1 GiB cap: the guard's policy parks it.
    bypass = holder(gpu.env(HAMI_SLICE=str(slices.path("bob"))), "1500m")
    guard = wait_for(lambda: (lambda r: r if r and any(p["pid"] == bypass.pid for p in r.get("parked") or [])
                              else None)(read_report(root)), WAIT_S, what="the bypass parked by the guard")
    assert guard["guard_pid"] == agent.pid  # the same process writes both reports
    # carol waits for room: the room policy parks alice's idle kernel.
    asker.ask("w", socket_path, uuid, 16 * GiB - gpu.used(0) + 4 * GiB)
    assert asker.final("w", timeout=WAIT_S) == ([], f"OK {6 * GiB + CONTEXT}")
    assert parked(idle.slice, idle.pid) and bypass.alive()
    actions = [r["action"] for r in audit.read_records(audit.default_path(root))]
    assert actions.count("guard-park") == 1 and actions.count("broker-park") == 1
    assert audit.verify(audit.default_path(root)) == ([], [])  # one writer, one chain


def test_a_slice_over_its_cap_is_taken_back_before_anyone_within_a_cap_is_parked(slices, holder, client, cudrive,
                                                                                  start_agent, socket_path, gpu,
                                                                                  root):
    """Issue 39, row 1: alice's bypass (no library) holds 3 GiB more than her
    1 GiB cap, and carol asks for room at once, before the guard has seen it
    over twice. Before, the room policy parked bob's idle kernel, within his
    cap, for carol; now it waits for the guard, whose park of alice's bypass
    makes the room, and bob's kernel stays on the GPU."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice", "1g", "1g")
    slices.make("bob", "8g", "1g")
    asker = client(slices.env("carol", kernel="k-carol"))
    bob = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=HOUR)
    bypass = holder(gpu.env(HAMI_SLICE=str(slices.path("alice"))), "4g")
    other = cudrive.start(gpu.env())  # another tenant: 1 GiB stays free
    for line in ("init", "ctx 0", f"alloc {16 * GiB - gpu.used(0) - 1 * GiB - CONTEXT}"):
        other.ok(line)
    start_agent()
    asker.ask("w", socket_path, uuid, 3 * GiB)
    before, answer = asker.final("w", timeout=WAIT_S)
    assert answer.startswith("OK "), answer
    assert running(bob.slice, bob.pid), "bob's kernel, within its cap, was parked for carol"
    parked_by_guard = [r for r in audit.read_records(audit.default_path(root)) if r["action"] == "guard-park"]
    assert [r["pid"] for r in parked_by_guard] == [bypass.pid]
    assert not [r for r in audit.read_records(audit.default_path(root)) if r["action"] == "broker-park"]
    assert other.alive()


def request(uid, uuid="GPU-x", since=0, expires=None):
    """A request of user *uid* on an open connection (a socket pair's end)."""
    here, there = socket.socketpair()
    r = Request(conn=here, pid=1000 + uid, uid=uid, user=f"u{uid}", slice=f"s{uid}", path=Path("/r"),
                kernel_id="", uuid=uuid, bytes=GiB, since_ns=since)
    r._peer = there  # kept open: the requester waits
    if expires is not None:
        r.expires = expires
    return r


def test_a_user_has_only_so_many_requests_in_the_queues():
    queues = Queues()
    mine = [request(7, uuid=f"GPU-{i % 2}") for i in range(queue_module.MAX_QUEUED_PER_USER)]
    for r in mine:
        queues.add(r)
    with pytest.raises(QueueFull, match="has 8 requests for room waiting already"):
        queues.add(request(7))
    queues.add(request(8))  # another user is not held back


def test_a_request_that_waits_past_its_time_is_answered_and_leaves_the_queue():
    class Stop:
        def is_set(self):
            return False

    queues = Queues()
    ahead, late = request(1, since=1), request(2, since=2, expires=time.monotonic() + 0.3)
    queues.add(ahead)
    queues.add(late)
    assert queues.wait_turn(ahead, Stop()) == queue_module.ENDED  # served now, and holds the GPU
    began = time.monotonic()
    assert queues.wait_turn(late, Stop()) == EXPIRED
    assert time.monotonic() - began < 10
    assert [r.uid for line in queues.view().values() for r in line] == [1]


def test_ok_answers_that_parked_nothing_are_recorded_once_a_minute_per_user(tmp_path):
    log = tmp_path / "audit.log"
    records = records_module.Records(log)
    for _ in range(30):
        records.served(request(7, uuid="GPU-0"), 0, 8 * GiB, [])
    records.served(request(8, uuid="GPU-0"), 0, 8 * GiB, [])
    served = [r for r in audit.read_records(log) if r["action"] == "broker-served"]
    assert [r["requester"]["user"] for r in served] == ["u7", "u8"]


def test_the_actor_takes_one_action_on_a_process_at_a_time():
    """Issue 33, finding 6: the guard's and the room policy's acts on one process
    cannot overlap: while one runs, the other is refused, not run beside it."""
    began, release = [], []
    gate = threading.Event()

    def slow_hold(pid):
        began.append(pid)
        gate.wait(10)
        return 0.0

    actor = Actor(hold=slow_hold)
    me = os.getpid()
    ticks = start_ticks(me)
    t = threading.Thread(target=lambda: release.append(actor.hold(me, ticks, {"why": "the guard's park"})))
    t.start()
    while not began:
        time.sleep(0.01)
    with pytest.raises(Busy, match="the guard's park"):
        actor.kill(me, ticks)  # the other policy's act on the same process waits its turn: refused now
    assert actor.busy(me) and me in actor.acting()
    gate.set()
    t.join(10)
    assert release == [0.0] and not actor.busy(me) and me in actor.held



def test_the_guards_hold_checks_host_memory_as_a_kernels_park_does(monkeypatch):
    """Issue 39, item 13: Actor.hold moved a process's GPU state to host memory
    without asking whether the host had room for it (park_kernel asked). A
    hold that would leave less than the reserve is refused before the driver
    is called, with how much was needed and available."""
    from hami_jupyter.slice import parking

    holds = []
    actor = Actor(host_reserve=2 * GiB, hold=lambda pid: holds.append(pid) or 0.0)
    monkeypatch.setattr(parking, "host_available", lambda: 10 * GiB)
    me = os.getpid()
    ticks = start_ticks(me)
    with pytest.raises(parking.ParkError, match="host memory too low .* needs 9.0 GiB plus 2.0 GiB kept free"):
        actor.hold(me, ticks, {"why": "over its cap", "process_bytes": 9 * GiB})
    assert holds == [] and me not in actor.held
    assert actor.hold(me, ticks, {"why": "over its cap", "process_bytes": 7 * GiB}) == 0.0
    assert holds == [me] and me in actor.held


def test_the_guards_reason_says_what_is_true_of_a_process_under_the_library():
    """Issue 39, row 6: a process under the library whose slice's counters its
    user zeroed was parked, and its user read that it held memory "outside the
    library". The reason says what it charged of what the driver lists."""
    from hami_jupyter.agent.guard.policy import Kill, ProcessUse, SliceGpu
    from hami_jupyter.slice.status import guard_parked_text

    under = ProcessUse(42, 1, 10 * GiB, True, "slot", 1000, "alice", charged_bytes=0, allowed_bytes=5 * GiB)
    gpu = SliceGpu("alice", "/r/alice.slice", "GPU-0", 0, 10 * GiB, 0, 8 * GiB, 64 * MiB, [under])
    why = records_module.Records(None).guard_why(Kill(gpu, under, 10 * GiB))
    assert "under the preload library, which charged it 0 B of the 10.0 GiB the driver lists" in why
    record = {"pid": 42, "command": "python", "process_bytes": 10 * GiB, "unix": 0, "preload": True}
    text = guard_parked_text(record, now=60)
    assert "outside" not in text and "under the preload library, more than the library had charged it" in text
    assert "outside the preload library" in guard_parked_text(dict(record, preload=False), now=60)
