"""The broker makes room by parking the idlest kernel that may be parked, and no more.

Real processes on the simulated GPU (16 GiB): kernels of several users hold
memory; a process of another slice asks for room through the socket, as the
preload library does when the driver refuses an allocation within the
slice's limit. Which kernel the broker parks, or why none, is what a user
sees: her kernel parked (or not), the requester's answer, the audit log.
"""

import re
import time

from broker_helpers import GiB, MiB, audit_of, parked, running, slot
from native_helpers import context_parked

from hami_jupyter import audit
from hami_jupyter.agent.protocol import parse_answer
from hami_jupyter.slice import registry
from hami_jupyter.slice.layout import HAMI_PARK_REASON_ROOM

CONTEXT = 64 * MiB
HOUR = 3600


def published(path, kernel_id, pid, busy, ago):
    """What the kernel's Jupyter server publishes in its registry entry (hami_jupyter.server.activity)."""
    registry.register(path, registry.new_entry(path, kernel_id, "someone", "hami-python3", pid))
    assert registry.record_activity(path, kernel_id, time.time() - ago, busy)


def test_the_idlest_kernel_that_may_be_parked_makes_the_room(slices, holder, client, start_broker,
                                                              socket_path, gpu, root):
    uuid = gpu.uuid(0)
    for name, limit, guarantee in (("carol", "8g", "1g"), ("bob", "8g", "6g"), ("dave", "8g", "1g"),
                                   ("alice", "8g", "1g"), ("erin", "8g", "256m"), ("gina", "8g", "256m")):
        slices.make(name, limit, guarantee)
    asker = client(slices.env("carol", kernel="k-carol"))
    # The requester's own kernel has another process, idle for long: never parked for it.
    own = holder(slices.env("carol", kernel="k-carol"), "1g", age_s=2 * HOUR)
    # Idle for longer than alice's, but bob's slice holds no more than its 6 GiB guarantee.
    guaranteed = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=1.5 * HOUR)
    active = holder(slices.env("dave", kernel="k-dave"), "4g")  # a GPU call just now
    idlest = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=HOUR)
    second = holder(slices.env("erin", kernel="k-erin"), "512m", age_s=HOUR / 2)
    # No GPU call for hours by its slot, but its Jupyter server says it got a
    # message just now: the agent began watching it a moment ago, and saw
    # nothing since, so it is idle since then (seconds), whatever either says.
    messaged = holder(slices.env("gina", kernel="k-gina"), "512m", age_s=3 * HOUR)
    published(slices.path("gina"), "k-gina", messaged.pid, busy=False, ago=0)
    others = (own, guaranteed, active, second, messaged)
    free = 16 * GiB - (14 * GiB + 7 * CONTEXT)
    assert gpu.status()["devices"][0]["used"] == 16 * GiB - free
    broker = start_broker()

    # 7 GiB: alice's and erin's kernels together cannot cover it: nothing is parked.
    asker.ask("big", socket_path, uuid, 7 * GiB)
    before, answer = asker.final("big")
    word, why = parse_answer(answer)
    assert (before, word) == ([], "NO"), answer
    assert "none was parked" in why
    assert all(running(p.slice, p.pid) for p in (idlest,) + others)

    # 3 GiB: alice's kernel, the idlest that may be parked, covers it alone.
    asker.ask("fits", socket_path, uuid, 3 * GiB)
    assert asker.final("fits") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(slices.path("alice"), idlest.pid)
    assert slot(idlest.slice, idlest.pid).park_reason == HAMI_PARK_REASON_ROOM  # what alice is told
    assert all(running(p.slice, p.pid) for p in others)
    assert gpu.used(0) == 16 * GiB - free - 4 * GiB - context_parked(CONTEXT)

    refused, park, served = audit_of(root, "broker-refused", "broker-park", "broker-served")
    assert refused["requester"]["slice"] == "carol" and refused["requester"]["pid"] == asker.pid
    assert "none was parked" in refused["why"]
    for text in ("kernel k-carol of carol: the requester's own kernel",
                 "kernel k-bob of bob: slice bob holds 4.1 GiB, within its 6.0 GiB guarantee"):
        assert text in refused["why"], refused["why"]
    for name in ("dave", "gina"):  # watched for seconds only: active then, as far as the agent knows
        assert re.search(f"kernel k-{name} of {name}: active [0-9]+ s ago \\(parked only after 60 s idle\\)",
                         refused["why"]), refused["why"]
    assert (park["slice"], park["kernel"], park["pids"], park["user"]) == (
        "alice", "k-alice", [idlest.pid], refused["requester"]["user"])
    assert park["requester"]["slice"] == "carol" and park["requester"]["bytes"] == 3 * GiB
    assert park["who"] == "hami-jupyter broker" and park["uuid"] == uuid
    assert served["made_bytes"] == 4 * GiB + CONTEXT and [k["kernel"] for k in served["parked"]] == ["k-alice"]
    assert audit.verify(audit.default_path(root)) == ([], [])
    decisions = broker.wait_report(lambda r: len(r["gpus"].get(uuid, {}).get("decisions", [])) == 3)
    assert [d["action"] for d in decisions["gpus"][uuid]["decisions"]] == ["refused", "park", "served"]


def test_a_wait_that_comes_back_after_an_ok_gets_more_room(slices, holder, client, start_broker, socket_path,
                                                           gpu, root):
    """NVML's free figure is not all a driver call can take: a process whose
    allocation still fails after an OK asks again, with the same since, and
    must not be told OK for the same figure forever."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("alice")
    asker = client(slices.env("carol", kernel="k-carol"))
    idle = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=HOUR)
    start_broker()
    # There is room for it beyond the agent's reserve (256 MiB kept free for parks), with 100 MiB to spare.
    size = 16 * GiB - gpu.used(0) - 256 * MiB - 100 * MiB
    since = asker.ask("first", socket_path, uuid, size)
    assert asker.final("first") == ([], "OK 0")
    assert running(idle.slice, idle.pid)
    asker.ask("again", socket_path, uuid, size, since=since)  # the driver still said no: the same wait
    assert asker.final("again") == ([], f"OK {4 * GiB + CONTEXT}")  # more room than 100 MiB: alice parked
    assert parked(idle.slice, idle.pid)
    served = audit_of(root, "broker-served")
    assert [r["made_bytes"] for r in served] == [0, 4 * GiB + CONTEXT]


def test_a_process_of_no_kernel_is_a_kernel_of_its_own(slices, holder, client, start_broker, socket_path,
                                                       gpu, root):
    """A process started with HAMI_SLICE outside Jupyter has no kernel id: it
    is parked alone, never with the slice's other processes of no kernel."""
    uuid = gpu.uuid(0)
    slices.make("carol", "16g", "1g")
    slices.make("erin")
    asker = client(slices.env("carol", kernel="k-carol"))
    script = holder(slices.env("erin"), "4g", age_s=HOUR)
    other = holder(slices.env("erin"), "2g")  # active: stays
    start_broker()
    asker.ask("w", socket_path, uuid, 16 * GiB - gpu.used(0) + GiB)
    assert asker.final("w") == ([], f"OK {4 * GiB + CONTEXT}")
    assert parked(script.slice, script.pid) and running(other.slice, other.pid)
    [park] = audit_of(root, "broker-park")
    assert (park["kernel"], park["pids"]) == (None, [script.pid])
