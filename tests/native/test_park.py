"""Parking, at the level of the preload library and hami-park, on the simulated GPU.

A process under the preload library holds memory with known contents;
hami-park parks it (the simulated driver moves its memory to host memory for
real); the slice then shows the bytes as parked, not used, and the GPU has
them free. The process's own next call brings its state back (its hook asks,
its housekeeper finds room and restores), contents intact. docs/parking.md.
"""

import fcntl
import json
import os
import shutil
import subprocess

import pytest

from hami_jupyter.slice import parking
from hami_jupyter.slice.layout import (
    HAMI_PARK_PARKED,
    HAMI_PARK_PARKING,
    HAMI_PARK_REASON_IDLE,
    HAMI_PARK_REASON_NONE,
    HAMI_PARK_REASON_ROOM,
    HAMI_PARK_RUNNING,
    HAMI_PARK_WAIT_GPU,
    HAMI_PARK_WAIT_SLICE,
    HamiSlot,
    slot_offset,
)
from hami_jupyter.slice.locks import F_OFD_SETLK, flock_bytes
from hami_jupyter.slice.status import format_text, slice_status
import native_helpers
from native_helpers import (
    CUDA_ERROR_OUT_OF_MEMORY,
    GiB,
    MiB,
    SIM_CONTEXT,
    slice_device,
    slot_of,
    wait_for,
)

WAIT_S = 20


def park_tool(build):
    return str(build.out / "hami-park")


def run_park(build, env, *args):
    """``hami-park ARGS`` without the preload library: ``(exit status, answer line)``."""
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    done = subprocess.run([park_tool(build), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout.strip()


def slot(s, pid):
    found = slot_of(s.snapshot(), pid)
    assert found is not None, f"process {pid} has no live slot"
    return found


def set_park_state(path, index, state):
    """What a parker does first, written here by hand (a parker that then dies)."""
    with open(path, "r+b") as f:
        f.seek(slot_offset(index) + HamiSlot.park_state.offset)
        f.write(state.to_bytes(4, "little"))


@pytest.fixture
def holder(cudrive, make_slice):
    """A process of a 2 GiB slice holding 512 MiB filled with 0x5a and 256 MiB with 0xa5."""
    s = make_slice(limit="2g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 512m a")
    p.ok("write a 90")
    p.ok("alloc 256m b")
    p.ok("write b 165")
    return s, p


def test_park_moves_the_charge_and_the_gpu_memory_to_host_memory(cudrive, make_slice, gpu, hami_build):
    """The driver's checkpoint (HAMI_FAST_PARK=0) moves everything, the context
    too; test_fast_park.py has what a process that parks itself leaves."""
    s = make_slice(limit="2g", overhead="64m", HAMI_FAST_PARK="0")
    p = cudrive.with_context(s.env, "alloc 512m a", "write a 90", "alloc 256m b", "write b 165")
    held = SIM_CONTEXT + 768 * MiB
    assert s.used(0) == held and gpu.used(0) == held
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 0 and answer.startswith(f"ok {held} ") and answer.endswith(" checkpoint"), answer
    me = wait_for(lambda: (lambda x: x if sum(x.parked.values()) else None)(slot(s, p.pid)),
                  WAIT_S, what="the charge moved to parked[]")
    dev = slice_device(s.snapshot(), gpu.uuid(0))
    assert me.park_state == HAMI_PARK_PARKED
    assert me.parked[dev.index] == held and me.memory_used[dev.index] == 0
    assert s.used(0) == 0  # the slice's memory is free for its other processes
    assert gpu.used(0) == 0  # and the GPU's for anyone: the driver holds it in host memory


def test_the_next_call_brings_the_state_back_intact(holder, gpu, hami_build):
    s, p = holder
    held = SIM_CONTEXT + 768 * MiB
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    # The process's own call: its hook asks for the state back and waits for it.
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]
    assert p.ok("check b 165")["equal"]
    me = slot(s, p.pid)
    assert me.park_state == HAMI_PARK_RUNNING and not me.park_wanted
    assert sum(me.parked.values()) == 0
    assert s.used(0) == held and gpu.used(0) == held
    p.ok("alloc 256m c")  # and it goes on as before


@pytest.mark.parametrize("resolve", ["dlsym", "procaddr"])
def test_a_first_call_the_library_does_not_hook_brings_the_state_back(resolve, cudrive, make_slice,
                                                                       hami_build):
    """After a quiet spell a program's first call is often one no hook of the
    library charges (here cuDeviceGetUuid), found through dlsym or, as the CUDA
    runtime finds everything, through cuGetProcAddress: it passes the gate too."""
    s = make_slice(limit="2g", overhead="64m")
    p = cudrive.start(s.env)
    for line in (f"resolve {resolve}", "init", "ctx 0", "alloc 256m a", "write a 33"):
        p.ok(line)
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    assert p.ok("uuid 0", timeout=WAIT_S)["rc"] == 0
    assert slot(s, p.pid).park_state == HAMI_PARK_RUNNING
    assert p.ok("check a 33")["equal"]


def test_a_resume_waits_for_room_in_the_slice(holder, cudrive, make_slice, hami_build):
    s, p = holder  # 832 MiB of a 2 GiB slice, about to be parked
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    other = cudrive.start(s.env)  # another process of the slice takes the room meanwhile
    other.ok("init")
    other.ok("ctx 0")
    other.ok("alloc 1200m big")  # 64 + 1200 MiB: 832 more would pass 2 GiB
    p.send("check a 90")  # asks for the state back: no room under the cap
    wait_for(lambda: slot(s, p.pid).park_wait == HAMI_PARK_WAIT_SLICE, WAIT_S,
             what="the resume waiting for room in the slice")
    assert slot(s, p.pid).park_state == HAMI_PARK_PARKED and s.used(0) <= 2 * GiB
    other.ok("free big")
    assert p.read(timeout=WAIT_S)["equal"]  # room again: it came back, contents intact
    assert slot(s, p.pid).park_state == HAMI_PARK_RUNNING


def test_a_resume_waits_for_free_memory_on_the_gpu(cudrive, make_slice, hami_build, gpu):
    s = make_slice(name="small", limit="12g", overhead="64m")
    p = cudrive.start(s.env)
    # 2 GiB never written (the simulated driver keeps no contents for it) and 1 MiB written.
    for line in ("init", "ctx 0", "alloc 2g a", "alloc 1m b", "write b 7"):
        p.ok(line)
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    hog = cudrive.start(gpu.env())  # no slice: another tenant of the 16 GiB GPU
    hog.ok("init")
    hog.ok("ctx 0")
    hog.ok("alloc 14g all")
    p.send("check b 7")
    wait_for(lambda: slot(s, p.pid).park_wait == HAMI_PARK_WAIT_GPU, WAIT_S,
             what="the resume waiting for free memory on the GPU")
    hog.ok("free all")
    assert p.read(timeout=WAIT_S)["equal"]


def test_a_parker_that_died_half_way_is_undone(holder, cudrive, gpu, hami_build):
    """PARKING, the process locked by the driver, and no parker holding the
    slot's park lock: the process's housekeeper unlocks it and runs on."""
    s, p = holder
    index = slot(s, p.pid).index
    # The parker's work, holding its lock as hami-park does; then it "dies" (the lock goes).
    fd = os.open(s.path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, slot_offset(index) +
                                                  HamiSlot.park_state.offset))
        set_park_state(s.path, index, HAMI_PARK_PARKING)
        locker = cudrive.run(f"init ckpt lock {p.pid}", gpu.env())
        assert locker.one("ckpt")["rc"] == 0, locker.describe()
    finally:
        os.close(fd)
    wait_for(lambda: slot(s, p.pid).park_state == HAMI_PARK_RUNNING, WAIT_S,
             what="the half-done park undone")
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]  # unlocked: its calls run


def test_a_process_killed_while_parked_leaves_nothing_behind(holder, cudrive, make_slice,
                                                             hami_build, gpu):
    s, p = holder
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    p.kill9()
    sweeper = cudrive.start(s.env)  # any process of the slice reclaims the dead slot
    sweeper.ok("init")
    sweeper.ok("ctx 0")
    wait_for(lambda: slot_of(s.snapshot(), p.pid) is None, WAIT_S, what="the dead slot reclaimed")
    snap = s.snapshot()
    assert not any(sum((x.parked or {}).values()) for x in snap.slots + snap.stale_slots)
    proc = next((x for x in gpu.status()["processes"] if x["pid"] == p.pid), None)
    assert proc is None or not proc.get("checkpoint_host_bytes"), proc


def test_hami_park_refuses_what_it_cannot_park(holder, hami_build, make_slice):
    s, p = holder
    rc, answer = run_park(hami_build, s.env, "park", s.path, os.getpid())
    assert rc == 1 and "has no live slot" in answer, answer
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid)
    assert rc == 1 and answer.startswith("error ") and "not running on the GPU" in answer, answer
    rc, answer = run_park(hami_build, s.env, "park", "/nonexistent/x.slice", p.pid)
    assert rc == 1 and "cannot open slice file" in answer
    rc, _ = run_park(hami_build, s.env, "park", s.path, "abc")
    assert rc == 2


def test_a_failed_park_leaves_the_process_running(holder, hami_build, gpu, cudrive):
    """The lock cannot be had (another locker holds the process): the park says
    why and the process runs on, never left locked by it."""
    s, p = holder
    assert cudrive.run(f"init ckpt lock {p.pid}", gpu.env()).one("ckpt")["rc"] == 0
    rc, answer = run_park(hami_build, s.env, "park", s.path, p.pid, 200)
    assert rc == 1 and "lock of process" in answer, answer
    assert slot(s, p.pid).park_state == HAMI_PARK_RUNNING
    assert cudrive.run(f"init ckpt unlock {p.pid}", gpu.env()).one("ckpt")["rc"] == 0
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]


def test_an_allocation_of_a_parked_process_waits_and_is_charged_after_the_resume(
        holder, hami_build, gpu):
    s, p = holder
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    rec = p.cmd("alloc 1g late", timeout=WAIT_S)
    assert rec["rc"] == 0
    assert s.used(0) == SIM_CONTEXT + 768 * MiB + GiB == gpu.used(0)
    rec = p.cmd("alloc 1g over", timeout=WAIT_S)
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY  # the cap holds as before


def test_a_park_says_why_until_the_process_resumes(holder, hami_build):
    """The reason hami-park is given is in the slot while parked (its user
    reads it in the status), and the process clears it when it comes back."""
    s, p = holder
    assert run_park(hami_build, s.env, "park", s.path, p.pid, 10000, "room")[0] == 0
    wait_for(lambda: sum(slot(s, p.pid).parked.values()), WAIT_S, what="parked")
    assert slot(s, p.pid).park_reason == HAMI_PARK_REASON_ROOM
    [proc] = slice_status(s.path)["other_processes"]
    assert proc["park_reason"] == "room"
    assert "parked to make room for another user's work" in format_text(slice_status(s.path))
    assert p.ok("check a 90", timeout=WAIT_S)["equal"]
    me = slot(s, p.pid)
    assert me.park_state == HAMI_PARK_RUNNING and me.park_reason == HAMI_PARK_REASON_NONE
    assert slice_status(s.path)["other_processes"][0]["park_reason"] is None


def test_a_park_without_a_reason_is_the_idle_policys_and_an_unknown_one_is_refused(holder, hami_build):
    s, p = holder
    rc, _ = run_park(hami_build, s.env, "park", s.path, p.pid, 10000, "bored")
    assert rc == 2 and slot(s, p.pid).park_state == HAMI_PARK_RUNNING
    assert run_park(hami_build, s.env, "park", s.path, p.pid)[0] == 0
    assert slot(s, p.pid).park_reason == HAMI_PARK_REASON_IDLE


def test_park_kernel_passes_its_reason_to_each_process(cudrive, make_slice, monkeypatch, hami_build):
    s = make_slice(limit="2g", overhead="64m")
    p = cudrive.start({**s.env, "HAMI_KERNEL_ID": "k-room"})
    for line in ("init", "ctx 0", "alloc 64m a"):
        p.ok(line)
    wait_for(lambda: slot(s, p.pid).active_unix_ns, WAIT_S, what="the parking thread's heartbeat")
    for name, value in s.env.items():  # hami-park finds the simulated driver as the process does
        if name != "LD_PRELOAD":
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("HAMI_NATIVE_DIR", str(hami_build.out))  # this test's build's hami-park
    with pytest.raises(ValueError):
        parking.park_kernel(s.path, "k-room", reason="bored")
    parking.park_kernel(s.path, "k-room", reason="room")
    [kernel] = slice_status(s.path)["kernels"]
    assert (kernel["park_state"], kernel["park_reason"]) == ("parked", "room")


def test_a_process_in_another_pid_namespace_is_found_by_its_host_pid(cudrive, make_slice, hami_build):
    """A kernel in a container's PID namespace holds a slot with its own PID
    there (1 here); a parker on the host (the broker, with hostPID) names it by
    the host's PID. hami-park finds the slot through /proc (the target's
    namespace and NSpid). The simulated driver knows processes by their own
    PID, so the lock fails after that here: what this shows is the slot found."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a PID namespace needs root and unshare")
    s = make_slice(limit="2g", overhead="64m")
    cmd = ["unshare", "--pid", "--fork", "--kill-child", str(hami_build.out / "tools" / "cudrive"), "stdin"]
    proc = subprocess.Popen(cmd, env=s.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("init\nctx 0\nalloc 64m\n")
        proc.stdin.flush()
        for _ in range(3):
            assert json.loads(proc.stdout.readline())["rc"] == 0
        inner = [x for x in s.snapshot().slots if x.pid == 1]
        assert inner, "the process's slot (PID 1 in its namespace)"
        host_pid = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                      text=True).stdout.split()[0])
        rc, answer = run_park(hami_build, s.env, "park", s.path, host_pid, 200)
        assert "has no live slot" not in answer, answer
    finally:
        proc.kill()
        proc.wait()


def _forged_slot(path, index, pid, pid_ns):
    """A LIVE slot naming *pid*, written into the slice file by hand, and the
    descriptor holding its lock (the owner the file's user plays)."""
    forged = HamiSlot()
    forged.state = 1  # HAMI_SLOT_LIVE
    forged.pid = pid
    forged.pid_ns = pid_ns
    forged.memory_used[0] = 3 * GiB
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, bytes(forged), slot_offset(index))
    fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, slot_offset(index)))
    return fd


@pytest.mark.parametrize("forgery", ["another-users-file", "no-namespace"])
def test_hami_park_parks_no_process_a_forged_slot_names(forgery, cudrive, make_slice, hami_build, gpu):
    """Issue 33, finding 1: a user wrote a slot naming another process into
    her own slice file and held its lock. hami-park (run as root, as the
    memory broker runs it) refuses: the process is not the file owner's, or the
    slot does not name it in its own PID namespace. It runs on, untouched."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the slice file is given to another user")
    victim = cudrive.with_context(gpu.env(), "alloc 512m")  # anyone's process, no preload
    s = make_slice(limit="8g", overhead="64m")
    assert cudrive.run("init ctx 0", s.env).one("ctx")["rc"] == 0  # the file exists
    ns = os.stat("/proc/self/ns/pid").st_ino
    fd = _forged_slot(s.path, 200, victim.pid, ns if forgery == "another-users-file" else 0)
    try:
        if forgery == "another-users-file":
            os.chown(s.path, 65534, 65534)  # the file's user is not the victim's (root)
        rc, answer = run_park(hami_build, s.env, "park", s.path, victim.pid, 1000, "room")
        assert rc == 1, answer
        why = "belongs to uid 0, not to uid 65534" if forgery == "another-users-file" else "has no live slot"
        assert why in answer, answer
        state = cudrive.run(f"init ckpt state {victim.pid}", gpu.env()).one("ckpt")
        assert state.get("state") == 0, state  # CU_PROCESS_STATE_RUNNING
        assert gpu.process_used(victim.pid, 0) == 512 * MiB + SIM_CONTEXT
    finally:
        os.close(fd)


NOBODY = 65534


def test_every_verb_of_hami_park_acts_only_for_the_targets_owner_or_root(cudrive, shared_gpu, hami_build):
    """Issue 39, item 3: ``hami-park hold BOBS_PID`` run by alice said "ok" and froze
    bob's kernel (park checked the owner, hold did not). Every verb refuses
    a caller who is neither the target's user nor root, before the driver is
    reached: the target runs on, untouched."""
    gpu = shared_gpu
    victim = cudrive.with_context(gpu.env(), "alloc 512m a", "write a 90")  # root's process
    tool = park_tool(hami_build)
    env = {k: v for k, v in gpu.env().items() if k != "LD_PRELOAD"}
    for args in (["park", "/nonexistent.slice", victim.pid, 1000, "room"], ["hold", victim.pid],
                 ["hold", victim.pid, 1000], ["restore", victim.pid], ["recover", victim.pid],
                 ["state", victim.pid]):
        done = subprocess.run([tool, *map(str, args)], env=env, capture_output=True, text=True, timeout=60,
                              preexec_fn=native_helpers.as_uid(NOBODY))
        assert done.returncode == 1, (args, done.stdout)
        assert done.stdout.startswith("error 800 ") and "belongs to uid 0" in done.stdout, (args, done.stdout)
    rc, answer = run_park(hami_build, gpu.env(), "state", victim.pid)
    assert (rc, answer) == (0, "ok running")
    assert victim.ok("check a 90")["equal"]
    assert gpu.process_used(victim.pid, 0) == 512 * MiB + SIM_CONTEXT
    # A user's own process is hers to hold and restore; root may act on anyone's.
    own = cudrive.with_context(gpu.env(), "alloc 256m b", "write b 165", uid=NOBODY)
    for user in (NOBODY, 0):
        for verb in ("hold", "restore"):
            done = subprocess.run([tool, verb, str(own.pid)], env=env, capture_output=True, text=True,
                                  timeout=60, preexec_fn=native_helpers.as_uid(NOBODY if user else None))
            assert done.returncode == 0 and done.stdout.startswith("ok"), (user, verb, done.stdout)
    assert own.ok("check b 165")["equal"]
