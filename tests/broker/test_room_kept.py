"""Room the agent makes stays its requester's, and the GPU never fills (issue 38).

On an H200 ten sessions of 16 GiB thrashed: the agent parked kernel after
kernel for one waiting cell while other sessions' resumes took each park's
room first (a cell waited 89 s); with a headroom the GPU filled to 5 MiB free
and every checkpoint failed; and a park of one session failed another's
set-up with "busy or unavailable". The simulated GPU does what that driver
did (native/sim/README.md): a checkpoint needs free device memory of its own
(``HAMI_SIM_CKPT_FREE``, 8 MiB), a move of a process's state takes time
(``HAMI_SIM_CKPT_RATE``) and meanwhile new contexts, streams, events and
module loads of other processes are refused as busy, and a restore needs the
room its process held.
"""

import subprocess
import time

import pytest

from broker_helpers import GiB, MiB, audit_of, broker_env, held_park_tool, parked, running, slot
from native_helpers import wait_for

from hami_jupyter.slice import parking
from hami_jupyter.slice.broker_report import waiting
from hami_jupyter.slice.layout import HAMI_PARK_WAIT_GPU

CONTEXT = 64 * MiB
HOUR = 3600
WAIT_S = 60
RESERVE = 256 * MiB


def park(gpu, it):
    """Park process *it* by hand, as its user's idle policy would (hami-park, without the library)."""
    done = subprocess.run([str(gpu.build.out / "hami-park"), "park", str(it.slice), str(it.pid), "10000", "asked"],
                          env=gpu.env(), capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("ok "), done.stdout + done.stderr


def filler(cudrive, gpu, leave):
    """Another tenant's process, without the library, taking all but *leave* bytes of GPU 0."""
    it = cudrive.start(gpu.env())
    it.ok("init")
    it.ok("ctx 0")
    take = 16 * GiB - gpu.used(0) - leave
    if take > 0:
        it.ok(f"alloc {take}")
    return it


def test_room_made_for_a_waiting_cell_is_not_taken_by_a_resume_around_it(slices, holder, cudrive, start_broker,
                                                                        gpu, root, tmp_path):
    """carol's cell waits for 6 GiB on a full GPU; the agent parks alice's idle
    kernel and then bob's for her (bob's park held until the test lets it go);
    meanwhile dave's parked kernel wants back, and his parking thread tries
    every second. Before, his resume took alice's room in between, and carol's
    cell was refused once bob's park was done: her 6 GiB came too late or not
    at all. Now dave's resume takes its turn behind carol's wait."""
    uuid = gpu.uuid(0)
    for name in ("carol", "dave", "alice", "bob"):
        slices.make(name, "8g", "1g")
    dave = holder(slices.env("dave", kernel="k-dave", HAMI_BROKER_SOCKET=root / "broker.sock"), "3g")
    park(gpu, dave)
    assert parked(dave.slice, dave.pid)
    alice = holder(slices.env("alice", kernel="k-alice"), "3g", age_s=2 * HOUR)
    bob = holder(slices.env("bob", kernel="k-bob"), "3g", age_s=HOUR)
    other = filler(cudrive, gpu, leave=512 * MiB)  # another tenant: the GPU is full
    folder, go, began = held_park_tool(tmp_path, bob.pid)
    broker = start_broker(env=broker_env(gpu, HAMI_NATIVE_DIR=folder))
    try:
        carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_ROOM_WAIT=40,
                                         HAMI_BROKER_SOCKET=root / "broker.sock"))
        carol.ok("init")
        carol.ok("ctx 0")
        carol.send("alloc 6g")
        wait_for(lambda: parked(alice.slice, alice.pid), WAIT_S, what="alice's kernel parked for carol")
        wait_for(began.exists, WAIT_S, what="the park of bob's kernel under way")
        # dave wants his kernel back while alice's room is free and bob's park goes on.
        parking.want_back(dave.slice, [slot(dave.slice, dave.pid).index])
        report = broker.wait_report(lambda r: [q["pid"] for q in waiting(r, uuid)] == [carol.pid, dave.pid],
                                    timeout=WAIT_S, what="dave's resume queued behind carol's wait")
        assert [q["serving"] for q in waiting(report, uuid)] == [True, False]
        time.sleep(2.5)  # more than two tries of dave's parking thread: each would take the room
        assert parked(dave.slice, dave.pid), "dave's resume took the room made for carol"
        assert slot(dave.slice, dave.pid).park_wait == HAMI_PARK_WAIT_GPU
        go.touch()
        done = carol.read(timeout=WAIT_S)
        assert done["rc"] == 0, f"{done}\n{carol.stderr()[-3000:]}"
    finally:
        go.touch()
    assert parked(alice.slice, alice.pid) and parked(bob.slice, bob.pid)
    parks = audit_of(root, "broker-park")
    assert [(p["kernel"], p["requester"]["pid"]) for p in parks] == [("k-alice", carol.pid), ("k-bob", carol.pid)]
    assert not [r for r in audit_of(root, "broker-refused") if r["requester"]["pid"] == carol.pid]
    [served] = [r for r in audit_of(root, "broker-served") if r["requester"]["pid"] == carol.pid]
    assert served["made_bytes"] == 6 * GiB + 2 * CONTEXT
    # dave's turn came after carol's: the GPU has no room for him now, and he waits for it, parked.
    assert parked(dave.slice, dave.pid)
    other.ok("freeall")  # the other tenant leaves: dave's kernel comes back
    wait_for(lambda: running(dave.slice, dave.pid), WAIT_S, what="dave's kernel back once there was room")


def test_the_library_leaves_the_reserve_free_so_a_park_can_run(slices, holder, cudrive, start_broker, gpu, root):
    """carol's process fills the GPU in 1 MiB steps while alice's idle kernel
    holds 6 GiB. Before, it filled the GPU to its last byte, and the park that
    was to make room for it failed for want of the checkpoint's own device
    memory (and was taken for the slot's refusal: alice's kernel was held).
    Now nothing through the library takes the agent's reserve: alice's kernel
    is parked for carol, and the GPU keeps the reserve free."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice", "8g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice"), "6g", age_s=HOUR)
    broker = start_broker()  # its reserve: 256 MiB
    carol = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_ROOM_WAIT=5,
                                     HAMI_BROKER_SOCKET=root / "broker.sock"))
    carol.ok("init")
    carol.ok("ctx 0")
    filled = carol.cmd("fill 1m", timeout=WAIT_S)
    assert filled["last_err"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert parked(alice.slice, alice.pid), "the park for carol failed"
    assert not broker.report()["held"]
    free = 16 * GiB - gpu.used(0)
    assert RESERVE - MiB <= free < RESERVE + 2 * MiB, free
    [park] = audit_of(root, "broker-park")
    assert park["kernel"] == "k-alice" and park["requester"]["pid"] == carol.pid
    assert not audit_of(root, "broker-park-failed")
    assert any("kept for parks" in line for line in carol.hami_lines()), carol.hami_lines()  # why it stopped


def test_a_park_the_driver_refuses_for_device_memory_is_tried_again_and_never_held(slices, holder, cudrive,
                                                                                  start_broker, gpu, root):
    """Another tenant (no library) fills the GPU to 4 MiB free: alice's
    checkpoint fails with out of memory, as on an H200. That is no refusal of
    her slot: her kernel is not held by the driver in its place (before, the
    agent held it, and only an administrator could bring it back), and once the
    tenant frees memory her park is tried again and made."""
    slices.make("carol", "16g", "1g")
    slices.make("alice", "8g", "1g")
    # Parked by the driver's checkpoint, which needs device memory (the fast park needs none).
    alice = holder(slices.env("alice", kernel="k-alice", HAMI_FAST_PARK=0), "6g", age_s=HOUR)
    other = filler(cudrive, gpu, leave=4 * MiB)
    broker = start_broker()  # the keeper wants its reserve back: alice's kernel is the one to park
    wait_for(lambda: audit_of(root, "broker-park-failed"), WAIT_S, what="alice's park failing")
    failed = audit_of(root, "broker-park-failed")[0]
    assert failed["kernel"] == "k-alice" and "out of memory on the GPU" in failed["error"], failed
    assert running(alice.slice, alice.pid)
    assert not broker.report()["held"] and not audit_of(root, "guard-park")
    other.ok("freeall")
    other.ok(f"alloc {16 * GiB - gpu.used(0) - 128 * MiB}")  # still short of the reserve, with room to park
    wait_for(lambda: parked(alice.slice, alice.pid), WAIT_S, what="alice's park made once there was room")
    assert not broker.report()["held"]


@pytest.mark.parametrize("what", ["ctx 0", "stream"])
def test_a_set_up_storm_during_a_headroom_park_waits_for_the_move(slices, holder, cudrive, start_broker, gpu,
                                                                   root, what):
    """The keeper parks alice's idle kernel for the headroom; the checkpoint
    moves 4 GiB at 1 GiB/s, and meanwhile the driver refuses other processes'
    new contexts and streams as busy. Three sessions start then: each one's
    context and first stream wait for the move and are made (on an H200 the
    stream failed: PyTorch's initGlobalStreamState)."""
    slices.make("alice", "8g", "1g")
    for name in ("s1", "s2", "s3"):
        slices.make(name, "2g", "2g")
    # The driver's checkpoint moves her state (a process that parks itself locks nobody out).
    alice = holder(slices.env("alice", kernel="k-alice", HAMI_FAST_PARK=0), "4g", age_s=HOUR)
    starters = [cudrive.start(slices.env(n, kernel=f"k-{n}", HAMI_BROKER_SOCKET=root / "broker.sock"))
                for n in ("s1", "s2", "s3")]
    for s in starters:
        s.ok("init")
        if what == "stream":
            s.ok("ctx 0")  # the context before the park: the stream meets it
    start_broker("--headroom", "14g", env=broker_env(gpu, HAMI_SIM_CKPT_RATE="1g"))
    wait_for(lambda: gpu.status()["processes"] and any(
        p["pid"] == alice.pid and p.get("checkpoint") in ("locked", "checkpointing", "locking")
        for p in gpu.status()["processes"]), WAIT_S, interval=0.02, what="alice's checkpoint under way")
    for s in starters:
        s.send(what)
    for s in starters:
        done = s.read(timeout=WAIT_S)
        assert done["rc"] == 0, f"{done}\n{s.stderr()[-3000:]}"
        assert any("is busy" in line for line in s.hami_lines()), s.hami_lines()
    wait_for(lambda: parked(alice.slice, alice.pid), WAIT_S, what="alice parked for the headroom")


def test_a_kernel_that_parked_itself_is_neither_parked_again_nor_held(slices, holder, client, cudrive,
                                                                       start_broker, socket_path, gpu, root):
    """alice's idle kernel parks itself for carol (the fast park: her memory in
    host memory, her context left on the GPU, the driver never locked it).
    Then another tenant fills the GPU, and carol asks for 32 MiB, which alice's
    context alone would cover. The agent must not take alice's slot's refusal
    (it says she is parked) for a claim against the facts and hold her with the
    driver's checkpoint, which only an administrator would undo: carol is
    answered NO, and alice comes back at her next call by herself."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice", "8g", "32m")  # what she leaves on the GPU (her context) is above her guarantee
    asker = client(slices.env("carol", kernel="k-carol"))
    alice = holder(slices.env("alice", kernel="k-alice", HAMI_FAST_PARK=1), "6g", age_s=HOUR)
    start_broker("--reserve", "0", "--min-idle-seconds", "2")
    asker.ask("first", socket_path, uuid, 16 * GiB - gpu.used(0) + 2 * GiB)
    assert asker.final("first", timeout=WAIT_S)[1].startswith("OK ")
    assert parked(alice.slice, alice.pid)
    [sim] = [p for p in gpu.status()["processes"] if p["pid"] == alice.pid]
    assert (sim["locks"], sim["checkpoint"]) == (0, "running")  # it parked itself
    other = filler(cudrive, gpu, leave=0)
    time.sleep(4)  # past the grace a slot's word on being away gets alone, and idle (the park moved bytes)
    asker.ask("second", socket_path, uuid, 32 * MiB)
    before, answer = asker.final("second", timeout=WAIT_S)
    assert answer.startswith("NO "), answer
    [sim] = [p for p in gpu.status()["processes"] if p["pid"] == alice.pid]
    assert (sim["locks"], sim["checkpoint"]) == (0, "running"), "alice was held with the checkpoint"
    assert len(audit_of(root, "broker-park")) == 1
    other.ok("freeall")
    alice.ok("sync")  # her next call brings her memory back
    assert running(alice.slice, alice.pid)
