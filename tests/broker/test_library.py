"""The preload library and the broker together: an allocation the GPU had no room for waits, and goes through.

A cudrive process of carol's slice asks for 6 GiB, within her 8 GiB limit,
while alice's idle kernel fills the GPU: the driver says out of memory, the
library keeps the reservation and asks the broker (native/src/room.c), the
broker parks alice's kernel, and the driver call, tried again, succeeds. The
program sees one successful allocation. A broker that takes the request
and never answers (stopped) holds it no longer than HAMI_ROOM_WAIT.
"""

import os
import signal
import time

from broker_helpers import GiB, MiB, age, audit_of, parked, slot
from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, wait_for

from hami_jupyter import audit
from hami_jupyter.slice.layout import HAMI_PARK_REASON_ROOM

HOUR = 3600


def test_an_allocation_waits_for_the_room_the_broker_makes(slices, holder, cudrive, start_broker, socket_path,
                                                           gpu, root):
    slices.make("carol", "8g", "1g")
    slices.make("alice", "12g", "1g")
    idle = holder(slices.env("alice", kernel="k-alice"), "10g", age_s=HOUR)
    start_broker()
    worker = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path,
                                      HAMI_ROOM_WAIT=60))
    worker.ok("init")
    worker.ok("ctx 0")
    assert gpu.used(0) + 6 * GiB > 16 * GiB  # the GPU has no room for it, the slice has
    answer = worker.cmd("alloc 6g", timeout=60)
    assert answer["rc"] == 0, f"{answer}\n{worker.stderr()[-3000:]}"
    assert parked(idle.slice, idle.pid) and slot(idle.slice, idle.pid).park_reason == HAMI_PARK_REASON_ROOM
    said = [line for line in worker.stderr().splitlines() if line.startswith("hami:")]
    assert len(said) == 1 and "no room for 6.0 GiB now" in said[0] and "waiting up to 60 s" in said[0], said
    [park] = audit_of(root, "broker-park")
    assert park["kernel"] == "k-alice" and park["requester"]["pid"] == worker.pid
    assert park["requester"]["bytes"] == 6 * GiB
    [served] = audit_of(root, "broker-served")
    assert served["made_bytes"] == 10 * GiB + 64 * MiB
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_parked_kernels_resume_waits_for_room_the_same_way(slices, holder, cudrive, start_broker, socket_path,
                                                             gpu, root):
    """alice's kernel was parked to make room for carol's; alice's next call
    wants it back, the GPU has no room for it, and her parking thread asks
    the broker too: bob's idle kernel is parked for her (carol's, active, is not)."""
    room = {"HAMI_BROKER_SOCKET": socket_path, "HAMI_ROOM_WAIT": 60}
    slices.make("carol", "8g", "1g")
    slices.make("alice", "12g", "1g")
    slices.make("bob", "8g", "1g")
    alice = holder(slices.env("alice", kernel="k-alice", **room), "8g")
    alice.ok("alloc 1m data")
    sent = time.time_ns()
    alice.ok("write data 7")  # her data, to find again (1 MiB: the simulated park copies what was written)
    age(alice.slice, alice.pid, 2 * HOUR, sent)
    bob = holder(slices.env("bob", kernel="k-bob", **room), "2g", age_s=HOUR)
    start_broker()
    carol = cudrive.start(slices.env("carol", kernel="k-carol", **room))
    carol.ok("init")
    carol.ok("ctx 0")
    assert carol.cmd("alloc 6g", timeout=60)["rc"] == 0
    assert parked(alice.slice, alice.pid) and not parked(bob.slice, bob.pid)
    assert gpu.used(0) + 8 * GiB + 65 * MiB > 16 * GiB  # no room for alice's state to come back

    assert alice.cmd("check data 7", timeout=60)["equal"]  # her call waits for her state, intact
    assert not parked(alice.slice, alice.pid) and parked(bob.slice, bob.pid)
    assert slot(bob.slice, bob.pid).park_reason == HAMI_PARK_REASON_ROOM
    parks = audit_of(root, "broker-park")
    assert [(r["kernel"], r["requester"]["kernel"]) for r in parks] == [("k-alice", "k-carol"),
                                                                         ("k-bob", "k-alice")]
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_stopped_broker_never_holds_an_allocation_past_its_wait(slices, holder, cudrive, start_broker,
                                                                  socket_path, gpu, root):
    """A broker stopped (SIGSTOP, a hung host, a debugger): its socket still
    takes connections, nobody answers. The allocation waits its HAMI_ROOM_WAIT
    and fails as without a broker, saying the broker never answered; the
    reservation goes back. Once the broker runs again, the request it finds
    is from a process that went away: nothing is parked for it."""
    slices.make("carol", "8g", "1g")
    slices.make("alice", "12g", "1g")
    idle = holder(slices.env("alice", kernel="k-alice"), "10g", age_s=HOUR)
    broker = start_broker()
    worker = cudrive.start(slices.env("carol", kernel="k-carol", HAMI_BROKER_SOCKET=socket_path,
                                      HAMI_ROOM_WAIT=2))
    worker.ok("init")
    worker.ok("ctx 0")
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        answer = worker.cmd("alloc 6g", timeout=30)  # a hang would end here, the test failed
        waited = time.monotonic() - began
        assert answer["rc"] == CUDA_ERROR_OUT_OF_MEMORY, answer
        assert waited >= 2.0, waited  # it did wait for the broker, its whole bound
        start, end = [line for line in worker.stderr().splitlines() if line.startswith("hami:")]
        assert "no room for 6.0 GiB now" in start and "waiting up to 2 s" in start, start
        assert "the memory broker took the request but never answered; out of memory" in end, end
        mine = slot(slices.path("carol"), worker.pid)
        assert mine.room_wait_since_unix_ns == 0 and mine.memory_used[0] == 64 * MiB  # its context alone
        worker.ok("alloc 1g")  # what fits goes on as before
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    wait_for(lambda: audit_of(root, "broker-dropped"), 30, what="the request of the process that gave up dropped")
    [dropped] = audit_of(root, "broker-dropped")
    assert dropped["requester"]["pid"] == worker.pid and dropped["parked"] == []
    assert not parked(idle.slice, idle.pid) and not audit_of(root, "broker-park", "broker-served")
    assert audit.verify(audit.default_path(root)) == ([], [])
