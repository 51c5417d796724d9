"""A park that fails: the agent says so (log, audit) and tries the next kernel."""

from broker_helpers import GiB, MiB, audit_of, broker_env, failing_park_tool, parked, running

from hami_jupyter import audit

CONTEXT = 64 * MiB
HOUR = 3600


def test_a_park_that_fails_is_said_and_the_next_kernel_is_parked(slices, holder, client, start_broker,
                                                                 socket_path, gpu, root, tmp_path):
    uuid = gpu.uuid(0)
    for name in ("carol", "alice", "bob", "erin"):
        slices.make(name)
    asker = client(slices.env("carol", kernel="k-carol"))
    stuck = holder(slices.env("alice", kernel="k-alice"), "4g", age_s=2 * HOUR)
    after = holder(slices.env("bob", kernel="k-bob"), "4g", age_s=HOUR)
    last = holder(slices.env("erin", kernel="k-erin"), "4g", age_s=HOUR / 2)
    # The driver refuses to checkpoint the idlest kernel's process.
    broker = start_broker(env=broker_env(gpu, HAMI_NATIVE_DIR=failing_park_tool(tmp_path, stuck.pid)))

    asker.ask("w", socket_path, uuid, 6 * GiB)  # 3.75 GiB free: one kernel of 4 GiB covers it
    assert asker.final("w") == ([], f"OK {4 * GiB + CONTEXT}")
    assert running(stuck.slice, stuck.pid) and parked(after.slice, after.pid) and running(last.slice, last.pid)
    failed, park, served = audit_of(root, "broker-park-failed", "broker-park", "broker-served")
    assert failed["kernel"] == "k-alice" and f"checkpoint of process {stuck.pid} failed" in failed["error"]
    assert failed["requester"]["pid"] == asker.pid
    assert park["kernel"] == "k-bob" and [k["kernel"] for k in served["parked"]] == ["k-bob"]
    assert "park of kernel k-alice (slice alice) failed: " in broker.log()
    assert "; trying the next" in broker.log()
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_no_park_leaves_less_host_memory_than_the_reserve(slices, holder, client, start_broker, socket_path,
                                                          gpu, root):
    uuid = gpu.uuid(0)
    for name in ("carol", "alice", "bob"):
        slices.make(name)
    asker = client(slices.env("carol", kernel="k-carol"))
    first = holder(slices.env("alice", kernel="k-alice"), "6g", age_s=HOUR)
    second = holder(slices.env("bob", kernel="k-bob"), "6g", age_s=HOUR / 2)
    start_broker("--host-memory-reserve", "1024t")  # more than any host has free

    asker.ask("w", socket_path, uuid, 6 * GiB)
    _, answer = asker.final("w")
    assert answer.startswith("NO ") and "2 park(s) failed" in answer, answer
    assert running(first.slice, first.pid) and running(second.slice, second.pid)
    failed = audit_of(root, "broker-park-failed")
    assert [r["kernel"] for r in failed] == ["k-alice", "k-bob"]
    assert all("host memory too low" in r["error"] and "1.0 PiB kept free" in r["error"] for r in failed)
    [refused] = audit_of(root, "broker-refused")
    assert refused["requester"]["pid"] == asker.pid and "2 park(s) failed" in refused["why"]
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_park_that_failed_is_not_tried_again_at_every_ask(slices, holder, client, start_broker, socket_path,
                                                            gpu, root, tmp_path):
    """On an H100 every checkpoint failed once the GPU was full, and the
    waiting sessions' re-asks (each every second) had the agent try the same
    failing parks thousands of times. A kernel whose park failed waits half a
    minute before it is tried again; the NO says so."""
    uuid = gpu.uuid(0)
    slices.make("carol")
    slices.make("alice", "12g")
    asker = client(slices.env("carol", kernel="k-carol"))
    stuck = holder(slices.env("alice", kernel="k-alice"), "11g", age_s=2 * HOUR)
    start_broker(env=broker_env(gpu, HAMI_NATIVE_DIR=failing_park_tool(tmp_path, stuck.pid)))
    answers = []
    for i in range(5):  # a waiting cell asks again every second
        asker.ask(f"w{i}", socket_path, uuid, 6 * GiB)
        answers.append(asker.final(f"w{i}")[1])
    assert all(a.startswith("NO ") for a in answers), answers
    assert "not tried again yet" in answers[-1], answers[-1]
    assert len(audit_of(root, "broker-park-failed")) == 1
    assert running(stuck.slice, stuck.pid)
