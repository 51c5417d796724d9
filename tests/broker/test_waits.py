"""Waiters: served one at a time in the order their waits began; one that goes
away gets nothing more parked for it; an agent restart loses no wait.

A request being served keeps the others of its GPU waiting: here the first
one's park is held by a stand-in hami-park (HAMI_NATIVE_DIR) until the test
lets it go, which keeps the agent busy with that request for exactly as long
as the test needs.
"""

import os
import time
from types import SimpleNamespace

import pytest

from broker_helpers import GiB, MiB, audit_of, broker_env, held_park_tool, parked, running, slot
from native_helpers import wait_for

from hami_jupyter import audit
from hami_jupyter.slice.broker_report import waiting
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import HamiSlot, slot_offset

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60


def waits_in_slot(it, uuid, since_ns, size):
    """Write what the library writes in its slot while a thread of process *it* waits for room."""
    snap = read_snapshot(it.slice)
    [device] = [d for d in snap.devices if d.uuid == uuid]
    at = slot_offset(slot(it.slice, it.pid).index)
    fd = os.open(it.slice, os.O_RDWR)
    try:
        os.pwrite(fd, device.index.to_bytes(4, "little"), at + HamiSlot.room_wait_device.offset)
        os.pwrite(fd, size.to_bytes(8, "little"), at + HamiSlot.room_wait_bytes.offset)
        os.pwrite(fd, since_ns.to_bytes(8, "little"), at + HamiSlot.room_wait_since_unix_ns.offset)
    finally:
        os.close(fd)


def serving(broker, uuid, pid):
    """The first report where the broker serves *pid*'s request on *uuid*."""
    return broker.wait_report(lambda r: any(q["pid"] == pid and q["serving"]
                                            for q in r["gpus"].get(uuid, {}).get("queue", [])),
                              what=f"pid {pid}'s request being served")


@pytest.fixture
def gpu_of_five(slices, holder, client, tmp_path, gpu, start_broker):
    """16 GiB: two requesters (carol, dave); erin's kernel, active (never parked);
    alice's, idle for two hours, and bob's, idle for one (4 GiB each): 6.7 GiB
    free. ``start()`` starts an agent whose first park of alice's kernel waits
    for ``go`` (and says ``began``)."""
    for name, limit in (("carol", "16g"), ("dave", "16g"), ("erin", "8g"), ("alice", "8g"), ("bob", "8g")):
        slices.make(name, limit)
    g = SimpleNamespace(
        first=client(slices.env("carol", kernel="k-carol")), second=client(slices.env("dave", kernel="k-dave")),
        active=holder(slices.env("erin", kernel="k-erin"), "1g"),
        idlest=holder(slices.env("alice", kernel="k-alice"), "4g", age_s=2 * HOUR),
        idle=holder(slices.env("bob", kernel="k-bob"), "4g", age_s=HOUR))
    held = held_park_tool(tmp_path, g.idlest.pid, once=True)
    g.go, g.began = held.go, held.began
    g.start = lambda: start_broker(env=broker_env(gpu, HAMI_NATIVE_DIR=held.folder))
    yield g
    held.release()  # a held park whose agent was killed goes on, and ends, before its folder goes


def test_two_waiters_are_served_in_the_order_their_waits_began(gpu_of_five, socket_path, gpu, root):
    g, uuid = gpu_of_five, gpu.uuid(0)
    broker = g.start()
    g.first.ask("w1", socket_path, uuid, 8 * GiB)  # alice's kernel covers it
    serving(broker, uuid, g.first.pid)
    wait_for(g.began.exists, WAIT_S, what="the park for the first request under way")
    g.second.ask("w2", socket_path, uuid, 11 * GiB)  # then bob's covers this one
    assert g.second.line("w2") == "BUSY 1"  # at once, behind the first
    # Who waits, as every view reads it (broker.json): the one served first.
    report = broker.wait_report(lambda r: len(r["gpus"].get(uuid, {}).get("queue", [])) == 2)
    assert [(q["pid"], q["slice"], q["bytes"], q["serving"]) for q in waiting(report, uuid)] == [
        (g.first.pid, "carol", 8 * GiB, True), (g.second.pid, "dave", 11 * GiB, False)]
    g.go.touch()
    assert g.first.final("w1") == ([], f"OK {4 * GiB + CONTEXT}")
    assert g.second.final("w2") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(g.idlest.slice, g.idlest.pid) and parked(g.idle.slice, g.idle.pid)
    records = audit_of(root, "broker-park", "broker-served")
    assert [(r["action"], r["requester"]["pid"], r.get("kernel")) for r in records] == [
        ("broker-park", g.first.pid, "k-alice"), ("broker-served", g.first.pid, None),
        ("broker-park", g.second.pid, "k-bob"), ("broker-served", g.second.pid, None)]
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_nothing_more_is_parked_for_a_requester_that_went_away(gpu_of_five, socket_path, gpu, root):
    g, uuid = gpu_of_five, gpu.uuid(0)
    broker = g.start()
    g.first.ask("w1", socket_path, uuid, 11 * GiB)  # alice's and bob's kernels would cover it
    serving(broker, uuid, g.first.pid)
    wait_for(g.began.exists, WAIT_S, what="the park of alice's kernel under way")
    g.second.ask("w2", socket_path, uuid, 8 * GiB)
    assert g.second.line("w2") == "BUSY 1"
    g.second.close("w2")  # gives up (or is killed) while it waits in the queue
    g.first.close("w1")  # and this one while alice's kernel is being parked for it
    wait_for(lambda: len(audit_of(root, "broker-dropped")) == 1, 30, what="the queued request dropped")
    g.go.touch()
    wait_for(lambda: len(audit_of(root, "broker-dropped")) == 2, 30, what="both requests dropped")
    broker.wait_report(lambda r: not r["gpus"].get(uuid, {}).get("queue"), what="an empty queue")
    # The park under way finished; nothing more was parked: bob's kernel runs on.
    assert parked(g.idlest.slice, g.idlest.pid) and running(g.idle.slice, g.idle.pid)
    dropped = {r["requester"]["pid"]: r for r in audit_of(root, "broker-dropped")}
    assert sorted(dropped) == sorted([g.first.pid, g.second.pid])
    assert [k["kernel"] for k in dropped[g.first.pid]["parked"]] == ["k-alice"]
    assert dropped[g.second.pid]["parked"] == []
    assert [r["kernel"] for r in audit_of(root, "broker-park")] == ["k-alice"]
    assert not audit_of(root, "broker-served", "broker-refused")
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_restarted_agent_serves_the_wait_asked_again(gpu_of_five, socket_path, gpu, root):
    g, uuid = gpu_of_five, gpu.uuid(0)
    broker = g.start()
    since = g.first.ask("w", socket_path, uuid, 8 * GiB)
    serving(broker, uuid, g.first.pid)
    wait_for(g.began.exists, WAIT_S, what="the park of alice's kernel under way")
    broker.kill()  # dies with the request in hand, its park not begun with the driver yet
    assert g.first.line("w") == "closed"
    again = g.start()  # its park of alice's kernel goes at once (only the first was held)
    g.first.ask("again", socket_path, uuid, 8 * GiB, since=since)  # as the library asks again
    assert g.first.final("again") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(g.idlest.slice, g.idlest.pid) and running(g.idle.slice, g.idle.pid)
    [park] = audit_of(root, "broker-park")
    [served] = audit_of(root, "broker-served")
    assert park["requester"]["since_unix_ns"] == served["requester"]["since_unix_ns"] == since
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_after_a_restart_an_older_wait_that_asks_later_is_still_served_first(gpu_of_five, socket_path, gpu,
                                                                            root):
    """A restarted broker knows the waits from the slots (room_wait_*, which the
    library sets while a thread waits): the one that began first is served
    first, even when its process asks the new broker a moment after another
    (which cannot jump the queue by claiming an older since)."""
    g, uuid = gpu_of_five, gpu.uuid(0)
    older = time.time_ns() - 10 * 10**9
    waits_in_slot(g.first, uuid, older, 8 * GiB)  # carol's process waits since 10 s ago, as the library shows it
    g.go.touch()  # no park held here
    broker = g.start()
    # dave's wait began later, but he asks first, and claims it began in 1970:
    # a wait cannot begin before its process, so his counts from its start.
    g.second.ask("newer", socket_path, uuid, 11 * GiB, since=1)
    broker.wait_report(lambda r: [(q["pid"], q["serving"]) for q in r["gpus"].get(uuid, {}).get("queue", [])]
                       == [(g.second.pid, False)], what="dave's request held for the older wait")
    g.first.ask("older", socket_path, uuid, 8 * GiB, since=older)
    assert g.first.final("older") == ([], f"OK {4 * GiB + CONTEXT}")
    assert g.second.final("newer") == ([], f"OK {4 * GiB + CONTEXT}")
    records = audit_of(root, "broker-park")
    assert [(r["requester"]["pid"], r["kernel"]) for r in records] == [(g.first.pid, "k-alice"),
                                                                        (g.second.pid, "k-bob")]
