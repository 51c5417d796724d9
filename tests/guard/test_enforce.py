"""The guard ends what passes a slice's cap, and only that: a real guard, real processes.

Each test starts ``hami-jupyter guard`` as a child process on a simulated GPU
and processes that hold device memory (cudrive), with or without the
preload library, then looks at what a user would: which processes are still
alive, the report (guard.json), the audit log and the guard's log.
"""

import time

from guard_helpers import CONTEXT, KILL_WITHIN_S, GiB, MiB, audit_records, wait_dead

from hami_jupyter import audit
from hami_jupyter.slice import layout
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.size import format_size
from hami_jupyter.slice.status import format_text, slice_status
from hami_jupyter.slice.status_html import format_html


def recorded(root, action, timeout=10.0):
    """The audit records of *action*, once there is one: the guard writes its
    record right after the act, so a test that saw the process end may read
    the log a moment before the record is in."""
    deadline = time.monotonic() + timeout
    while not audit_records(root, action) and time.monotonic() < deadline:
        time.sleep(0.02)
    return audit_records(root, action)


def gpu_entry(report, name, uuid):
    """The report's entry for slice *name* on GPU *uuid*; {} when it has none."""
    return report["slices"].get(name, {}).get("gpus", {}).get(uuid, {})


def test_a_bypass_named_by_its_environment_is_ended_within_two_seconds(
        gpu, slices, start_guard, holder, root):
    path = slices.make("alice", memory="1g")
    guard = start_guard("--action", "kill")
    # No LD_PRELOAD: the slice's accounting never sees this process.
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")

    took = wait_dead(bypass, KILL_WITHIN_S)
    assert bypass.proc.returncode == -9
    print(f"ended {took:.2f} s after its allocation returned")

    uuid = gpu.uuid(0)
    report = guard.wait_report(lambda r: r["actions"], what="the kill in the report")
    [action] = report["actions"]
    assert action["action"] == "kill" and action["pid"] == bypass.pid
    assert action["slice"] == "alice" and action["uuid"] == uuid
    assert action["real_bytes"] == 1500 * MiB + CONTEXT
    assert action["reported_bytes"] == 0 and action["limit_bytes"] == GiB

    [record] = audit_records(root, "guard-kill")
    assert record["who"] == "hami-jupyter guard"
    assert (record["slice"], record["uuid"], record["pid"], record["user"]) == ("alice", uuid, bypass.pid, "root")
    assert record["real_bytes"] == 1500 * MiB + CONTEXT
    assert record["reported_bytes"] == 0 and record["limit_bytes"] == GiB
    assert record["path"] == str(path)
    assert audit.verify(audit.default_path(root))[0] == []
    assert f"KILL pid {bypass.pid}" in guard.log()

    # The memory came back; the report no longer shows the slice on that GPU
    # (none of its processes is there, and its own processes never met it).
    guard.wait_report(lambda r: gpu_entry(r, "alice", uuid) == {}, what="the slice gone from GPU 0")
    assert gpu.used(0) == 0


def test_a_bypass_of_a_user_with_a_slice_of_their_name_is_ended(gpu, slices, start_guard, holder, root):
    import getpass

    me = getpass.getuser()
    slices.make(me, memory="1g")
    guard = start_guard("--action", "kill")
    # Neither the preload library nor HAMI_SLICE: only the user's slice can be charged.
    bypass = holder(gpu.env(), 1, "1200m")

    wait_dead(bypass, KILL_WITHIN_S)
    report = guard.wait_report(lambda r: r["actions"], what="the kill in the report")
    [action] = report["actions"]
    assert (action["pid"], action["slice"], action["uuid"]) == (bypass.pid, me, gpu.uuid(1))
    [record] = audit_records(root, "guard-kill")
    assert record["attributed_by"] == "user" and record["preload"] is False


def test_the_report_shows_real_and_reported_bytes_and_who_is_counted(gpu, slices, start_guard, holder):
    slices.make("alice", memory="4g")
    guard = start_guard()
    counted = holder(slices.env("alice"), 0, "512m")
    bypass = holder(slices.env("alice", preload=False), 0, "256m")
    stranger = holder(gpu.env(), 0, "128m")  # root has no slice here: nobody's
    uuid = gpu.uuid(0)

    report = guard.wait_report(
        lambda r: gpu_entry(r, "alice", uuid).get("real_bytes") == 768 * MiB + 2 * CONTEXT,
        what="both of alice's processes in the report")
    entry = gpu_entry(report, "alice", uuid)
    assert entry["reported_bytes"] == 512 * MiB + CONTEXT  # the bypass is not counted by the slice
    assert entry["limit_bytes"] == 4 * GiB and entry["tolerance_bytes"] == CONTEXT
    assert entry["state"] == "ok"
    by_pid = {p["pid"]: p for p in entry["processes"]}
    assert by_pid[counted.pid]["preload"] is True and by_pid[counted.pid]["attributed_by"] == "environ"
    assert by_pid[bypass.pid]["preload"] is False and by_pid[bypass.pid]["attributed_by"] == "environ"
    assert [(u["pid"], u["real_bytes"]) for u in report["unattributed"]] == [(stranger.pid, 128 * MiB + CONTEXT)]
    assert report["errors"] == [] and report["actions"] == []
    assert all(p.alive() for p in (counted, bypass, stranger))


def zero_counters(path, pid, uuid):
    """What a user can do to their own slice file: zero the slice's and their
    process's usage counters on one GPU."""
    import ctypes
    import mmap
    import struct

    snap = read_snapshot(path)
    [device] = [d for d in snap.devices if d.uuid == uuid]
    [slot] = [s for s in snap.slots if s.pid == pid]
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), layout.FILE_SIZE) as m:
        at = layout.DEVICES_OFFSET + device.index * ctypes.sizeof(layout.HamiSliceDevice)
        struct.pack_into("=Q", m, at + layout.HamiSliceDevice.memory_used.offset, 0)
        at = layout.slot_offset(slot.index) + layout.HamiSlot.memory_used.offset + 8 * device.index
        struct.pack_into("=Q", m, at, 0)


def test_tampered_usage_counters_are_seen_through_and_acted_on(gpu, slices, start_guard, holder, root):
    path = slices.make("alice", memory="1g")
    guard = start_guard("--action", "kill")
    uuid = gpu.uuid(0)
    kernel = holder(slices.env("alice"), 0, "700m")
    # The library holds it to its cap: a second 700m does not fit...
    assert kernel.cmd("alloc 700m")["rc"] == 2
    # ...until the user zeroes the counters in their own slice file.
    zero_counters(path, kernel.pid, uuid)
    assert kernel.ok("alloc 700m")["rc"] == 0
    assert read_snapshot(path).devices[0].memory_used == 700 * MiB  # the slice believes it

    wait_dead(kernel, KILL_WITHIN_S)
    report = guard.wait_report(lambda r: r["actions"], what="the kill in the report")
    [action] = report["actions"]
    assert action["pid"] == kernel.pid and action["preload"] is True
    assert action["real_bytes"] == 1400 * MiB + CONTEXT
    # What the tampered file said, unless the library's own true-up against
    # NVML (about once a second) had already put the counters right.
    assert action["reported_bytes"] in (700 * MiB, action["real_bytes"])
    [record] = audit_records(root, "guard-kill")
    assert record["attributed_by"] == "environ" and record["preload"] is True


def test_only_the_slice_over_its_cap_is_acted_on_and_its_bypass_goes_first(
        gpu, slices, start_guard, holder, root):
    slices.make("alice", memory="1g")
    slices.make("bob", memory="1g")
    guard = start_guard("--action", "kill")
    alice_kernel = holder(slices.env("alice"), 0, "256m")  # older, within the cap by itself
    bob_kernel = holder(slices.env("bob"), 0, "256m")
    bob_bypass = holder(slices.env("bob", preload=False), 0, "512m")  # bob: 896m + 2 contexts, within
    time.sleep(0.2)
    alice_bypass = holder(slices.env("alice", preload=False), 0, "900m")  # alice: over

    wait_dead(alice_bypass, KILL_WITHIN_S)
    report = guard.rounds(4)
    assert [a["pid"] for a in report["actions"]] == [alice_bypass.pid]
    assert all(p.alive() for p in (alice_kernel, bob_kernel, bob_bypass))
    uuid = gpu.uuid(0)
    assert gpu_entry(report, "bob", uuid)["real_bytes"] == 768 * MiB + 2 * CONTEXT
    assert gpu_entry(report, "bob", uuid)["state"] == "ok"
    assert gpu_entry(report, "alice", uuid)["state"] == "ok"
    assert [r["pid"] for r in audit_records(root, "guard-kill", "guard-warn")] == [alice_bypass.pid]


def test_newest_first_when_every_process_has_the_preload(gpu, slices, start_guard, holder, root):
    path = slices.make("alice", memory="1g")
    older = holder(slices.env("alice"), 0, "400m")
    newer = holder(slices.env("alice"), 0, "400m")
    # 800m + two contexts fit; then the counters go and both grow past the cap.
    zero_counters(path, older.pid, gpu.uuid(0))
    zero_counters(path, newer.pid, gpu.uuid(0))
    older.ok("alloc 300m")
    newer.ok("alloc 300m")  # 1400m + 2 contexts: ending the newer one is enough
    start_guard("--action", "kill", wait=False)

    wait_dead(newer, 10)
    time.sleep(1.5)
    assert older.alive()
    assert [r["pid"] for r in audit_records(root, "guard-kill")] == [newer.pid]


def test_warn_ends_nothing_and_warns_once_per_time_over(gpu, slices, start_guard, holder, root):
    slices.make("alice", memory="1g")
    guard = start_guard("--action", "warn")
    uuid = gpu.uuid(0)
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")

    report = guard.wait_report(lambda r: r["actions"], what="the warning in the report")
    assert gpu_entry(report, "alice", uuid)["state"] == "over"
    [action] = report["actions"]
    assert action["action"] == "warn" and action["pids"] == [bypass.pid]
    report = guard.rounds(4)  # still over: not warned again
    assert gpu_entry(report, "alice", uuid)["state"] == "over"
    assert len(report["actions"]) == 1
    assert bypass.alive()
    [record] = audit_records(root, "guard-warn")
    assert (record["slice"], record["uuid"], record["pids"]) == ("alice", uuid, [bypass.pid])
    assert record["real_bytes"] == 1500 * MiB + CONTEXT and record["limit_bytes"] == GiB
    log = guard.log()
    assert log.count("WARN slice alice") == 1 and "nothing ended" in log
    # What the real guard wrote is what the slice's status shows (%hami status,
    # the REST API and hami-jupyter status all render this).
    status = slice_status(slices.path("alice"))
    assert status["guard"]["action"] == "warn"
    assert status["gpus"] == []  # the bypass never met the library: the file has no entry
    [seen] = status["guard"]["elsewhere"]
    assert (seen["uuid"], seen["memory_real"], seen["guard_state"]) == (uuid, 1500 * MiB + CONTEXT, "over")
    assert f"OVER CAP: the guard sees {format_size(1500 * MiB + CONTEXT)}" in format_text(status)
    assert "hami-guard-over" in format_html(status)

    bypass.ok("free a0")  # back within the cap: recovered
    guard.wait_report(lambda r: gpu_entry(r, "alice", uuid).get("state") == "ok", what="recovery")
    bypass.ok("alloc 1500m")  # over again: a new warning
    report = guard.wait_report(lambda r: len(r["actions"]) == 2, what="the second warning")
    assert len(audit_records(root, "guard-warn")) == 2
    assert audit_records(root, "guard-kill") == []
    assert bypass.alive()


def test_a_slice_without_a_memory_cap_is_never_acted_on(gpu, slices, start_guard, holder, root):
    slices.make("free", memory=None)
    guard = start_guard()
    bypass = holder(slices.env("free", preload=False), 0, "3g")
    report = guard.rounds(4)
    entry = gpu_entry(report, "free", gpu.uuid(0))
    assert entry["limit_bytes"] == 0 and entry["state"] == "ok"
    assert entry["real_bytes"] == 3 * GiB + CONTEXT
    assert bypass.alive() and report["actions"] == []


# ---- enforcement keeps work (issue 27) ------------------------------------------

def test_a_kernel_over_a_cap_lowered_below_its_use_is_left_alone(gpu, slices, start_guard, holder, root):
    from hami_jupyter.slice.change import set_memory_limit

    path = slices.make("alice", memory="1g")
    guard = start_guard("--action", "kill")  # even the harshest action keeps it
    kernel = holder(slices.env("alice"), 0, "700m")
    guard.rounds(2)
    # An administrator shrinks the slice below what the kernel holds.
    set_memory_limit(path, None, 512 * MiB)
    set_memory_limit(path, 0, 512 * MiB)
    report = guard.rounds(6)
    uuid = gpu.uuid(0)
    entry = gpu_entry(report, "alice", uuid)
    assert kernel.alive(), guard.log()[-3000:]
    assert entry["state"] == "held" and entry["held_bytes"] == 700 * MiB + CONTEXT, entry
    assert report["actions"] == [] and audit_records(root, "guard-kill", "guard-park") == []
    # The library refuses it more, and it keeps its data and works on.
    assert kernel.cmd("alloc 16m")["rc"] == 2
    # Something beside it that no cap allowed is still acted on, and only that.
    bypass = holder(slices.env("alice", preload=False), 0, "300m")
    wait_dead(bypass, KILL_WITHIN_S)
    assert kernel.alive()
    assert [r["pid"] for r in recorded(root, "guard-kill")] == [bypass.pid]


def test_a_bypass_is_parked_by_default_and_resumed_by_an_administrator_with_its_data(
        gpu, slices, start_guard, holder, root, tmp_path):
    import subprocess
    import sys

    from hami_jupyter.slice.change import set_memory_limit

    path = slices.make("alice", memory="1g")
    guard = start_guard()  # the default: park
    bypass = holder(slices.env("alice", preload=False), 0, None)
    bypass.ok("alloc 500m A")  # within the cap: nothing happens yet
    bypass.ok("write A 90")
    bypass.ok("alloc 1000m B")  # past it, without the library
    uuid = gpu.uuid(0)
    report = guard.wait_report(lambda r: r.get("parked"), what="the park in the report")
    [parked] = report["parked"]
    assert parked["pid"] == bypass.pid and parked["action"] == "park" and parked["slice"] == "alice"
    assert bypass.alive()
    assert gpu.process_used(bypass.pid, 0) == 0  # the GPU is free at once
    [record] = audit_records(root, "guard-park")
    assert record["pid"] == bypass.pid and record["preload"] is False
    assert f"PARK pid {bypass.pid}" in guard.log()
    # The user sees why where she looks.
    text = format_text(slice_status(path))
    assert "parked by the guard" in text and str(bypass.pid) in text, text
    # Not parked twice, nobody else touched, nothing ended.
    report = guard.rounds(4)
    assert len(audit_records(root, "guard-park")) == 1 and audit_records(root, "guard-kill") == []

    # An administrator raises the cap, then resumes it: its data is intact.
    set_memory_limit(path, None, 4 << 30)
    env = dict(guard.env)
    done = subprocess.run([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root), "--resume",
                           str(bypass.pid)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "runs again" in done.stdout
    assert bypass.ok("check A 90")["equal"]
    assert gpu.process_used(bypass.pid, 0) == 1500 * MiB + CONTEXT
    guard.wait_report(lambda r: not r.get("parked"), what="the park gone from the report")
    assert [r["action"] for r in audit_records(root, "guard-park", "guard-resume")] == ["guard-park",
                                                                                         "guard-resume"]


def test_a_command_that_keeps_coming_back_is_ended_each_time_once_and_audited_once(
        gpu, slices, start_guard, holder, root):
    slices.make("alice", memory="1g")
    start_guard("--action", "kill")
    pids = []
    for _ in range(3):  # a restarter starting the same command line again
        it = holder(slices.env("alice", preload=False), 0, "1500m")
        wait_dead(it, KILL_WITHIN_S * 2)
        pids.append(it.pid)
    assert [r["pid"] for r in recorded(root, "guard-kill")] == pids[:1]
    [again] = recorded(root, "guard-return")
    assert again["pid"] == pids[1] and again["first_pid"] == pids[0]


# ---- facts, not claims (issue 33) -------------------------------------------------

def zero_slice_counter(path, uuid):
    """What a user can do to her own slice file: zero the slice's counter on one
    GPU, leaving her process's slot charged with all it holds."""
    import ctypes
    import struct

    [device] = [d for d in read_snapshot(path).devices if d.uuid == uuid]
    at = layout.DEVICES_OFFSET + device.index * ctypes.sizeof(layout.HamiSliceDevice)
    with open(path, "r+b") as f:
        f.seek(at + layout.HamiSliceDevice.memory_used.offset)
        f.write(struct.pack("=Q", 0))


def test_a_zeroed_slice_counter_does_not_make_the_guard_look_away(gpu, slices, start_guard, holder, root):
    """Finding 2: alice zeroes her slice's counter (her slot still charges all
    her process holds) and allocates past her cap through the library. What
    the process holds beyond what the agent saw it hold within the cap is no
    cap's: it is acted on."""
    path = slices.make("alice", memory="1g")
    guard = start_guard("--action", "kill")
    uuid = gpu.uuid(0)
    kernel = holder(slices.env("alice"), 0, "700m")
    guard.wait_report(lambda r: gpu_entry(r, "alice", uuid).get("real_bytes") == 700 * MiB + CONTEXT,
                      what="the kernel seen within the cap")
    zero_slice_counter(path, uuid)
    assert kernel.ok("alloc 700m")["rc"] == 0  # the library believes the counter
    wait_dead(kernel, KILL_WITHIN_S * 2)
    [record] = recorded(root, "guard-kill")
    assert record["pid"] == kernel.pid and record["preload"] is True
    assert record["process_bytes"] == 1400 * MiB + CONTEXT


def test_a_slice_over_its_cap_when_the_agent_starts_is_over_not_held(gpu, slices, start_guard, holder, root):
    """Finding 2: the agent sees the slice for the first time past its cap, its
    counter zeroed: nothing it holds past the cap was seen allowed."""
    path = slices.make("alice", memory="1g")
    uuid = gpu.uuid(0)
    kernel = holder(slices.env("alice"), 0, "700m")
    zero_slice_counter(path, uuid)
    assert kernel.ok("alloc 700m")["rc"] == 0
    start_guard("--action", "kill", wait=False)
    wait_dead(kernel, 20)
    assert [r["pid"] for r in recorded(root, "guard-kill")] == [kernel.pid]


def test_a_bypass_resumed_without_room_under_its_cap_is_parked_again(gpu, slices, start_guard, holder, root):
    """Finding 5: an administrator resumes a parked bypass without raising the
    cap: still over, it is parked again (not left running past the cap), and
    `guard --end` then ends it."""
    import subprocess
    import sys

    slices.make("alice", memory="1g")
    guard = start_guard()  # park
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")
    guard.wait_report(lambda r: any(p["pid"] == bypass.pid for p in r.get("parked") or []), what="the park")

    def admin(*args):
        return subprocess.run([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root), *args],
                              env=dict(guard.env), capture_output=True, text=True, timeout=60)

    done = admin("--resume", str(bypass.pid))
    assert done.returncode == 0 and "runs again" in done.stdout, done.stderr
    guard.wait_report(lambda r: len([a for a in r["actions"] if a["action"] == "park"]) == 2
                      and any(p["pid"] == bypass.pid for p in r.get("parked") or []), what="parked again")
    assert bypass.alive() and gpu.process_used(bypass.pid, 0) == 0
    assert [r["action"] for r in audit_records(root, "guard-park", "guard-resume")] == [
        "guard-park", "guard-resume", "guard-park"]
    done = admin("--end", str(bypass.pid))
    assert done.returncode == 0 and "ended" in done.stdout, done.stderr
    wait_dead(bypass, 10)


def test_a_process_someone_else_is_parking_is_not_ended(gpu, slices, start_guard, holder, root, cudrive):
    """Finding 6: a process over its cap is being parked by someone else (the
    driver holds it locked, as for a Jupyter server's idle park): the guard's
    own park fails, and the process is not ended for it. Once the other park
    is given up, the guard parks it."""
    slices.make("alice", memory="1g")
    bypass = holder(slices.env("alice", preload=False), 0, "1500m")
    assert cudrive.run(f"init ckpt lock {bypass.pid}", gpu.env()).one("ckpt")["rc"] == 0
    guard = start_guard()  # park
    report = guard.rounds(6)
    assert bypass.alive(), guard.log()[-3000:]
    assert audit_records(root, "guard-kill") == [] and report.get("parked") == []
    assert any(f"pid {bypass.pid}" in e and "locked" in e for e in report["errors"]), report["errors"]
    assert cudrive.run(f"init ckpt unlock {bypass.pid}", gpu.env()).one("ckpt")["rc"] == 0
    guard.wait_report(lambda r: any(p["pid"] == bypass.pid for p in r.get("parked") or []), what="its park")
    assert bypass.alive() and audit_records(root, "guard-kill") == []


# ---- what a user sets changes nothing the guard decides (issue 39) ----------------------


def test_a_context_overhead_in_a_users_own_process_moves_no_tolerance(gpu, slices, start_guard, holder, root):
    """Row 5: alice runs one process under the library with HAMI_CONTEXT_OVERHEAD=1g
    and a bypass beside it. The tolerance stayed the guard's own: real use
    past the cap by more than 64 MiB is over, and the bypass is ended."""
    slices.make("alice", memory="4g")
    guard = start_guard("--action", "kill")
    uuid = gpu.uuid(0)
    claims = holder(slices.env("alice", HAMI_CONTEXT_OVERHEAD="1g"), 0, "1g")
    guard.wait_report(lambda r: gpu_entry(r, "alice", uuid).get("real_bytes") == GiB + CONTEXT,
                      what="alice's kernel seen")
    bypass = holder(slices.env("alice", preload=False), 0, "3100m")  # 4.15 GiB with the two contexts
    wait_dead(bypass, KILL_WITHIN_S * 2)
    report = guard.wait_report(lambda r: r["actions"], what="the end of the bypass")
    assert [a["pid"] for a in report["actions"]] == [bypass.pid]
    assert report["actions"][0]["tolerance_bytes"] == 64 * MiB
    assert claims.alive()
