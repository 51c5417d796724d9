"""``--headroom``: the broker keeps room free on each GPU before anyone asks for it.

Real processes on the simulated GPU (16 GiB), a real broker: idle kernels
fill the GPU and nobody asks. With a headroom, the broker parks the idlest
that may be parked (the rules of a waiting request) until the GPU has the
headroom free, and no more; requests come first; each park is audited for
the headroom, not for a user. Without one, it parks nothing unasked.
"""

import os
import time

from broker_helpers import GiB, MiB, audit_of, broker_env, held_park_tool, parked, running, slot
from native_helpers import context_parked, wait_for

from hami_jupyter import audit
from hami_jupyter.agent.headroom import CHECK_S
from hami_jupyter.slice.layout import HAMI_PARK_REASON_ROOM

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60  # a bound on waits for the broker, never a speed asserted


def headroom_of(report, uuid):
    return (report["gpus"].get(uuid) or {}).get("headroom")


def looks_after(broker, uuid, when, checks=3):
    """The first report whose headroom entry of *uuid* was checked *checks*
    intervals after *when*: the keeper has had that many looks since."""
    return broker.wait_report(lambda r: (headroom_of(r, uuid) or {}).get("checked_unix", 0)
                              >= when + checks * CHECK_S, timeout=WAIT_S, what=f"{checks} more headroom looks")


def test_without_headroom_nothing_is_parked_unasked(slices, holder, client, start_broker, socket_path, gpu, root):
    uuid = gpu.uuid(0)
    for name in ("carol", "alice", "bob"):
        slices.make(name, "12g")
    asker = client(slices.env("carol", kernel="k-carol"))
    idlest = holder(slices.env("alice", kernel="k-alice"), "8g", age_s=2 * HOUR)
    idle = holder(slices.env("bob", kernel="k-bob"), "7g", age_s=HOUR)
    assert gpu.used(0) == 15 * GiB + 3 * CONTEXT  # 832 MiB free
    broker = start_broker("--headroom", "0")
    started = time.time()
    asker.ask("fits", socket_path, uuid, 512 * MiB)  # a request served: the moment a keeper would look
    assert asker.final("fits") == ([], "OK 0")
    report = broker.wait_report(lambda r: r["written_unix"] >= started + 3 * CHECK_S, timeout=WAIT_S,
                                what="reports written three looks after the start")
    # Without a headroom the keeper keeps the reserve alone (256 MiB by default): there is more free.
    assert report["headroom"] == 0 and report["reserve"] == 256 * MiB
    assert (headroom_of(report, uuid) or {"kept": True})["kept"] is True
    assert running(idlest.slice, idlest.pid) and running(idle.slice, idle.pid)
    assert not audit_of(root, "broker-park")


def test_the_idlest_are_parked_until_the_headroom_is_free_and_no_more(slices, holder, start_broker, gpu, root):
    uuid = gpu.uuid(0)
    for name in ("alice", "bob", "dave"):
        slices.make(name)
    idlest = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=3 * HOUR)
    second = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=2 * HOUR)
    third = holder(slices.env("dave", kernel="k-dave"), "6g", age_s=HOUR)  # idle too, but not needed
    free = 16 * GiB - gpu.used(0)
    assert free == 2 * GiB - 3 * CONTEXT
    broker = start_broker("--headroom", "6g")

    # alice's 4 GiB leave the GPU 64 MiB short of 6 GiB free: bob's kernel is parked too; dave's is not.
    report = broker.wait_report(lambda r: (headroom_of(r, uuid) or {}).get("kept"), timeout=WAIT_S,
                                what="the headroom kept")
    assert report["headroom"] == 6 * GiB
    assert parked(idlest.slice, idlest.pid) and parked(second.slice, second.pid)
    assert running(third.slice, third.pid)
    kept = headroom_of(report, uuid)
    assert kept["free_bytes"] == free + 8 * GiB + 2 * context_parked(CONTEXT) == 16 * GiB - gpu.used(0)
    looks_after(broker, uuid, kept["checked_unix"])
    assert running(third.slice, third.pid)  # kept: no park more

    # Each park is the broker's, for the headroom: no user asked; its user reads "to make room".
    for it in (idlest, second):
        assert slot(it.slice, it.pid).park_reason == HAMI_PARK_REASON_ROOM
    parks = audit_of(root, "broker-park")
    assert [(r["kernel"], r["requester"]["for"], r["requester"]["user"], r["requester"]["headroom_bytes"])
            for r in parks] == [("k-alice", "headroom", None, 6 * GiB), ("k-bob", "headroom", None, 6 * GiB)]
    assert [r["requester"]["free_bytes"] for r in parks] == [free, free + 4 * GiB + context_parked(CONTEXT)]
    assert all(r["who"] == "hami-jupyter broker" and r["uid"] == os.getuid() and r["uuid"] == uuid
               and r["why"].startswith(f"to make room for the 6.0 GiB headroom of GPU {uuid}") for r in parks)
    assert not audit_of(root, "broker-served", "broker-refused")  # nobody asked
    assert audit.verify(audit.default_path(root)) == ([], [])
    report = broker.wait_report(lambda r: len(r["gpus"][uuid]["decisions"]) == 2, what="both parks reported")
    assert [(d["action"], d["requester"]["for"]) for d in report["gpus"][uuid]["decisions"]] == [
        ("park", "headroom")] * 2


def test_a_guaranteed_slice_and_an_active_kernel_are_not_parked(slices, holder, start_broker, gpu):
    uuid = gpu.uuid(0)
    slices.make("bob", "8g", "6g")
    slices.make("dave", "8g", "1g")
    guaranteed = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=3 * HOUR)  # within its 6 GiB guarantee
    active = holder(slices.env("dave", kernel="k-dave"), "4g")  # a GPU call just now
    broker = start_broker("--headroom", "10g")  # 7.9 GiB free
    started = time.time()

    short = headroom_of(looks_after(broker, uuid, started), uuid)
    assert running(guaranteed.slice, guaranteed.pid) and running(active.slice, active.pid)
    assert short["kept"] is False and short["why"].startswith("7.9 GiB free, 2.1 GiB short; no kernel may be parked")
    assert "kernel k-bob of bob: slice bob holds 4.1 GiB, within its 6.0 GiB guarantee" in short["why"]
    assert "kernel k-dave of dave: active" in short["why"] and "(parked only after 60 s idle)" in short["why"]
    said = [line for line in broker.log().splitlines() if "headroom" in line]
    assert len(said) == 2 and "a headroom of 10.0 GiB kept free on each GPU" in said[0], said  # the start line
    assert f"GPU {uuid}: the 10.0 GiB headroom cannot be kept: 7.9 GiB free" in said[1]

    active.ok("freeall")  # dave's memory goes back: the GPU has the headroom free without a park
    broker.wait_report(lambda r: (headroom_of(r, uuid) or {}).get("kept"), timeout=WAIT_S, what="the headroom kept")
    said = [line for line in broker.log().splitlines() if "headroom" in line]
    assert len(said) == 3 and f"GPU {uuid}: the 10.0 GiB headroom is kept again" in said[2], said
    assert running(guaranteed.slice, guaranteed.pid)


def test_a_request_is_served_before_any_further_headroom_park(slices, holder, client, start_broker, socket_path,
                                                               gpu, root, tmp_path):
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    for name in ("alice", "bob", "dave"):
        slices.make(name)
    asker = client(slices.env("carol", kernel="k-carol"))
    idlest = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=3 * HOUR)
    second = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=2 * HOUR)
    third = holder(slices.env("dave", kernel="k-dave"), "4g", age_s=HOUR)
    free = 16 * GiB - gpu.used(0)
    assert free == 4 * GiB - 4 * CONTEXT
    held = held_park_tool(tmp_path, idlest.pid)
    folder, go, began = held
    # 8 GiB: alice's kernel is not enough, so the keeper would park bob's next.
    broker = start_broker("--headroom", "8g", env=broker_env(gpu, HAMI_NATIVE_DIR=folder))
    wait_for(began.exists, WAIT_S, what="the headroom's park of alice's kernel under way")

    asker.ask("w", socket_path, uuid, 10 * GiB)  # arrives while that park is under way
    broker.wait_report(lambda r: any(q["pid"] == asker.pid and q["serving"]
                                     for q in r["gpus"].get(uuid, {}).get("queue", [])),
                       timeout=WAIT_S, what="carol's request being served")
    held.release()
    # alice's park finishes; the room carol still misses is hers to make: bob's kernel is parked for her.
    assert asker.final("w") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(idlest.slice, idlest.pid) and parked(second.slice, second.pid)
    report = broker.wait_report(lambda r: (headroom_of(r, uuid) or {}).get("kept"), timeout=WAIT_S,
                                what="the headroom kept")
    looks_after(broker, uuid, headroom_of(report, uuid)["checked_unix"])
    assert running(third.slice, third.pid)
    records = audit_of(root, "broker-park", "broker-served")
    assert [(r["action"], r.get("kernel"), r["requester"].get("for") or r["requester"]["pid"]) for r in records] == [
        ("broker-park", "k-alice", "headroom"),
        ("broker-park", "k-bob", asker.pid),
        ("broker-served", None, asker.pid)]
    assert audit.verify(audit.default_path(root)) == ([], [])
