"""The broker makes room by parking the idlest kernel that may be parked, and no more.

Real processes on the simulated GPU (16 GiB): kernels of several users hold
memory; a process of another slice asks for room through the socket, as the
preload library does when the driver refuses an allocation within the
slice's limit. Which kernel the broker parks, or why none, is what a user
sees: her kernel parked (or not), the requester's answer, the audit log.
"""

from broker_helpers import GiB, MiB, audit_of, parked, running, slot

from hami_jupyter import audit
from hami_jupyter.broker.protocol import parse_answer
from hami_jupyter.slice.layout import HAMI_PARK_REASON_ROOM

CONTEXT = 64 * MiB
HOUR = 3600


def test_the_idlest_kernel_that_may_be_parked_makes_the_room(slices, holder, client, start_broker,
                                                              socket_path, gpu, root):
    uuid = gpu.uuid(0)
    for name, limit, guarantee in (("carol", "8g", "1g"), ("bob", "8g", "6g"), ("dave", "8g", "1g"),
                                   ("alice", "8g", "1g"), ("erin", "8g", "256m")):
        slices.make(name, limit, guarantee)
    asker = client(slices.env("carol", kernel="k-carol"))
    # The requester's own kernel has another process, the idlest of all: never parked for it.
    own = holder(slices.env("carol", kernel="k-carol"), "2g", age_s=2 * HOUR)
    # Idle for longer than alice's, but bob's slice holds no more than its 6 GiB guarantee.
    guaranteed = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=1.5 * HOUR)
    active = holder(slices.env("dave", kernel="k-dave"), "4g")  # a GPU call just now
    idlest = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=HOUR)
    second = holder(slices.env("erin", kernel="k-erin"), "512m", age_s=HOUR / 2)
    free = 16 * GiB - (14 * GiB + 512 * MiB + 6 * CONTEXT)
    assert gpu.status()["devices"][0]["used"] == 16 * GiB - free
    broker = start_broker()

    # 6 GiB: alice's and erin's kernels together cannot cover it: nothing is parked.
    asker.ask("big", socket_path, uuid, 6 * GiB)
    before, answer = asker.final("big")
    word, why = parse_answer(answer)
    assert (before, word) == ([], "NO"), answer
    assert "none was parked" in why and "the requester's own kernel" in why
    assert all(running(p.slice, p.pid) for p in (own, guaranteed, active, idlest, second))

    # 3 GiB: alice's kernel, the idlest that may be parked, covers it alone.
    asker.ask("fits", socket_path, uuid, 3 * GiB)
    assert asker.final("fits") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(slices.path("alice"), idlest.pid)
    assert slot(idlest.slice, idlest.pid).park_reason == HAMI_PARK_REASON_ROOM  # what alice is told
    assert all(running(p.slice, p.pid) for p in (own, guaranteed, active, second))
    assert gpu.used(0) == 16 * GiB - free - 4 * GiB - CONTEXT

    refused, park, served = audit_of(root, "broker-refused", "broker-park", "broker-served")
    assert refused["requester"]["slice"] == "carol" and refused["requester"]["pid"] == asker.pid
    assert "none was parked" in refused["why"]
    assert (park["slice"], park["kernel"], park["pids"], park["user"]) == (
        "alice", "k-alice", [idlest.pid], refused["requester"]["user"])
    assert park["requester"]["slice"] == "carol" and park["requester"]["bytes"] == 3 * GiB
    assert park["who"] == "hami-jupyter broker" and park["uuid"] == uuid
    assert served["made_bytes"] == 4 * GiB + CONTEXT and [k["kernel"] for k in served["parked"]] == ["k-alice"]
    assert audit.verify(audit.default_path(root)) == ([], [])
    decisions = broker.wait_report(lambda r: len(r["gpus"].get(uuid, {}).get("decisions", [])) == 3)
    assert [d["action"] for d in decisions["gpus"][uuid]["decisions"]] == ["refused", "park", "served"]
