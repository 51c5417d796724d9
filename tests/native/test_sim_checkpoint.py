"""The simulated GPU's device memory contents and process checkpoints, without
the preload library.

One interactive cudrive is the target: a CUDA process with device memory whose
bytes it writes and checks itself. One-shot cudrive runs are the controller,
calling cuCheckpointProcess* on the target's pid from another process, as
the parking feature does on a real GPU. hami-simctl is the independent
witness of what each device and process holds.
"""

import errno
import os
import subprocess
import time

from native_helpers import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GiB,
    MiB,
    SIM_CONTEXT,
    SIM_MEMORY,
    wait_for,
)

CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_TIMEOUT = 909
CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2

RUNNING, LOCKED, CHECKPOINTED = 0, 1, 2

# How long a call must stay unanswered to count as blocked.
BLOCKED_S = 0.5
# The kernel a synchronize waits for while a lock waits for the synchronize.
KERNEL_S = 4

# The target's allocations: (cudrive command, name, byte written, bytes it holds on the device).
ALLOCATIONS = [
    ("alloc 1m plain", "plain", 0x11, MiB),
    ("pitch 1000 50 4 pitched", "pitched", 0x22, 1024 * 50),
    ("managed 3000 unified", "unified", 0x33, 3000),
    ("async 2m ordered", "ordered", 0x44, 2 * MiB),  # from the default pool: it grows by 2 MiB
]


def _target(cudrive, gpu, *lines):
    """An interactive CUDA process with a context on device 0 that ran LINES."""
    return cudrive.with_context(gpu.env(), *lines)


def _ckpt(cudrive, gpu, step, pid, *extra):
    """One checkpoint call on PID from a process of its own: its record."""
    res = cudrive.run(["init", "ckpt", step, pid, *extra], gpu.env())
    assert res.one("init")["rc"] == CUDA_SUCCESS, res.describe()
    return res.one("ckpt")


def _ok(cudrive, gpu, step, pid, *extra):
    rec = _ckpt(cudrive, gpu, step, pid, *extra)
    assert rec["rc"] == CUDA_SUCCESS, rec
    return rec


def _state(cudrive, gpu, pid):
    return _ok(cudrive, gpu, "state", pid)["state"]


def _proc(gpu, pid):
    """hami-simctl's record of the live process PID, or None."""
    for proc in gpu.status()["processes"]:
        if proc["pid"] == pid and proc["alive"]:
            return proc
    return None


def _side_file(gpu, kind, entry):
    return gpu.state.parent / f"{gpu.state.name}.{kind}" / str(entry)


def _has_data(path):
    """True when the sparse file PATH holds any data (not only holes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
        return True
    except OSError as e:
        if e.errno == errno.ENXIO:
            return False
        raise
    finally:
        os.close(fd)


def _written(p):
    """Allocate and fill ALLOCATIONS in P; the bytes P then holds on device 0."""
    for cmd, name, byte, _ in ALLOCATIONS:
        p.ok(cmd)
        p.ok(f"write {name} {byte}")
    for _, name, byte, _ in ALLOCATIONS:
        assert p.ok(f"check {name} {byte}")["equal"]
    return SIM_CONTEXT + sum(size for *_, size in ALLOCATIONS)


def _all_intact(p):
    for _, name, byte, _ in ALLOCATIONS:
        rec = p.ok(f"check {name} {byte}")
        assert rec["equal"] and rec["mismatches"] == 0, rec


def _blocked(p):
    """True when P has not answered its last command within BLOCKED_S."""
    time.sleep(BLOCKED_S)
    return not p.ready()


# ---- contents ------------------------------------------------------------------


def test_copies_move_real_bytes_and_freed_memory_comes_back_zeroed(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 4m a", "write a 0x5a")
    rec = p.ok("check a 0x5a")
    assert (rec["equal"], rec["mismatches"], rec["first_mismatch"]) == (True, 0, -1)
    rec = p.ok("check a 0x5b")
    assert (rec["equal"], rec["mismatches"], rec["first_mismatch"], rec["found"]) == (False, 4 * MiB, 0, 0x5a)
    p.ok("alloc 4m b")
    assert p.ok("check b 0")["equal"]  # never written: zeros
    p.ok("free a")
    p.ok("alloc 4m c")  # the file extent a had: its bytes must not show
    assert p.ok("check c 0")["equal"]


def test_untouched_device_memory_costs_nothing(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 8g big", "alloc 1m small", "write small 1")
    entry = _proc(gpu, p.pid)["entry"]
    st = os.stat(_side_file(gpu, "mem", entry))
    assert st.st_blocks * 512 < 16 * MiB, st
    assert gpu.used(0) == SIM_CONTEXT + 8 * GiB + MiB


# ---- checkpoint and restore -------------------------------------------------------


def test_checkpoint_and_restore_keep_the_contents_and_move_the_memory(cudrive, gpu):
    p = _target(cudrive, gpu)
    held = _written(p)
    p.ok("ctx 1")  # memory on a second device too
    p.ok("alloc 3m other")
    p.ok("write other 0x55")
    p.ok("ctx 0")
    held1 = SIM_CONTEXT + 3 * MiB
    pid = p.pid
    before = _proc(gpu, pid)
    assert before["used"] == [held, held1] and before["checkpoint"] == "running" and before["host_bytes"] == 0
    assert (gpu.used(0), gpu.used(1)) == (held, held1)
    assert _state(cudrive, gpu, pid) == RUNNING

    rec = _ok(cudrive, gpu, "lock", pid)
    assert rec["waited_ms"] < 5000
    assert _state(cudrive, gpu, pid) == LOCKED
    assert _proc(gpu, pid)["used"] == [held, held1]  # a lock moves nothing

    _ok(cudrive, gpu, "checkpoint", pid)
    assert _state(cudrive, gpu, pid) == CHECKPOINTED
    proc = _proc(gpu, pid)
    assert proc["used"] == [0, 0] and proc["checkpoint"] == "checkpointed", proc
    assert proc["host_bytes"] == held + held1 and proc["parked"] == [held, held1], proc
    assert (gpu.used(0), gpu.used(1)) == (0, 0)
    # The host copy holds the bytes; the device copy reads zeros.
    entry = proc["entry"]
    assert _has_data(_side_file(gpu, "ckpt", entry))
    assert not _has_data(_side_file(gpu, "mem", entry))
    # NVML lists the process with 0 bytes.
    res = cudrive.run("nvml nvmlprocs 0", gpu.env())
    listed = {e["pid"]: e["used"] for e in res.one("nvmlprocs")["processes"]}
    assert listed.get(pid) == 0, res.describe()

    _ok(cudrive, gpu, "restore", pid)
    assert _state(cudrive, gpu, pid) == LOCKED
    proc = _proc(gpu, pid)
    assert proc["used"] == [held, held1] and proc["host_bytes"] == 0 and proc["parked"] == [0, 0], proc
    assert (gpu.used(0), gpu.used(1)) == (held, held1)
    assert not _side_file(gpu, "ckpt", entry).exists()

    _ok(cudrive, gpu, "unlock", pid)
    assert _state(cudrive, gpu, pid) == RUNNING
    _all_intact(p)
    p.ok("ctx 1")
    assert p.ok("check other 0x55")["equal"]
    res = cudrive.run("nvml nvmlprocs 0", gpu.env())
    listed = {e["pid"]: e["used"] for e in res.one("nvmlprocs")["processes"]}
    assert listed.get(pid) == held, res.describe()
    # The process goes on as before: new memory, new contents, freeing.
    p.ok("ctx 0")
    p.ok("alloc 1m later")
    p.ok("write later 0x66")
    assert p.ok("check later 0x66")["equal"]
    p.ok("free plain")
    assert _proc(gpu, pid)["used"][0] == held


def test_a_second_round_and_memory_written_between_rounds(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 1m a", "write a 1")
    for byte in (2, 3):
        for step in ("lock", "checkpoint", "restore", "unlock"):
            _ok(cudrive, gpu, step, p.pid)
        assert p.ok(f"check a {byte - 1}")["equal"]
        p.ok(f"write a {byte}")
    assert p.ok("check a 3")["equal"]


# ---- blocking ------------------------------------------------------------------


def test_calls_block_while_locked_and_go_on_after_unlock(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 1m a", "write a 0x11")
    pid = p.pid
    _ok(cudrive, gpu, "lock", pid)
    p.send("write a 0x22")
    assert _blocked(p), "a copy answered while its process was locked"
    proc = _proc(gpu, pid)
    assert proc["checkpoint"] == "locked" and proc["in_flight"] == 0, proc
    # Checkpointed and restored under the waiting call: it still waits.
    _ok(cudrive, gpu, "checkpoint", pid)
    assert _blocked(p)
    _ok(cudrive, gpu, "restore", pid)
    assert _blocked(p)
    _ok(cudrive, gpu, "unlock", pid)
    rec = p.read(timeout=10)
    assert (rec["op"], rec["rc"]) == ("write", CUDA_SUCCESS), rec
    assert p.ok("check a 0x22")["equal"]


def test_every_kind_of_call_waits_for_unlock(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 1m a", "module")
    pid = p.pid
    for line in ("alloc 1m b", "free a", "meminfo", "sync", "launch 1000", "event 1000", "ctx 1", "count"):
        _ok(cudrive, gpu, "lock", pid)
        p.send(line)
        assert _blocked(p), f"{line!r} answered while its process was locked"
        _ok(cudrive, gpu, "unlock", pid)
        rec = p.read(timeout=10)
        assert rec["rc"] == CUDA_SUCCESS, (line, rec)
        p.ok("ctx 0")


def test_lock_waits_for_a_synchronize_in_flight(cudrive, gpu):
    p = _target(cudrive, gpu, "module")
    pid = p.pid
    launched = time.monotonic()
    p.ok(f"launch {KERNEL_S * 10**9}")  # the device is idle: it ends KERNEL_S from now
    p.send("sync")
    wait_for(lambda: _proc(gpu, pid)["in_flight"] == 1, timeout=10, what="the synchronize inside the driver")
    # A lock that cannot wait long enough fails and leaves the process running.
    rec = _ckpt(cudrive, gpu, "lock", pid, 100)
    assert rec["rc"] == CUDA_ERROR_TIMEOUT and rec["waited_ms"] >= 100, rec
    assert _state(cudrive, gpu, pid) == RUNNING
    assert _proc(gpu, pid)["in_flight"] == 1
    assert not p.ready()  # the synchronize is still waiting for its kernel
    rec = _ok(cudrive, gpu, "lock", pid)
    # The lock returned only once the synchronize had: after the kernel's end.
    assert time.monotonic() - launched >= KERNEL_S, rec
    assert rec["waited_ms"] >= 200, rec
    rec = p.read(timeout=10)
    assert (rec["op"], rec["rc"]) == ("sync", CUDA_SUCCESS), rec
    assert _state(cudrive, gpu, pid) == LOCKED
    _ok(cudrive, gpu, "unlock", pid)
    p.ok("sync")


def test_a_timed_lock_of_an_idle_process_succeeds_at_once(cudrive, gpu):
    p = _target(cudrive, gpu)
    rec = _ok(cudrive, gpu, "lock", p.pid, 1000)
    assert rec["timeout_ms"] == 1000 and rec["waited_ms"] < 1000, rec
    _ok(cudrive, gpu, "unlock", p.pid)
    p.ok("meminfo")


# ---- state rules ------------------------------------------------------------------


def test_calls_in_the_wrong_state_fail_and_change_nothing(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 1m a", "write a 9")
    pid = p.pid
    held = SIM_CONTEXT + MiB

    def expect(state, used, host):
        assert _state(cudrive, gpu, pid) == state
        proc = _proc(gpu, pid)
        assert (proc["used"][0], proc["host_bytes"]) == (used, host), proc
        assert gpu.used(0) == used

    for step in ("checkpoint", "restore", "unlock"):
        assert _ckpt(cudrive, gpu, step, pid)["rc"] == CUDA_ERROR_ILLEGAL_STATE, step
    expect(RUNNING, held, 0)
    p.ok("check a 9")  # still running: calls go through

    _ok(cudrive, gpu, "lock", pid)
    for step in ("lock", "restore"):
        assert _ckpt(cudrive, gpu, step, pid)["rc"] == CUDA_ERROR_ILLEGAL_STATE, step
    expect(LOCKED, held, 0)

    _ok(cudrive, gpu, "checkpoint", pid)
    for step in ("lock", "checkpoint", "unlock"):
        assert _ckpt(cudrive, gpu, step, pid)["rc"] == CUDA_ERROR_ILLEGAL_STATE, step
    expect(CHECKPOINTED, 0, held)

    _ok(cudrive, gpu, "restore", pid)
    assert _ckpt(cudrive, gpu, "restore", pid)["rc"] == CUDA_ERROR_ILLEGAL_STATE
    expect(LOCKED, held, 0)
    _ok(cudrive, gpu, "unlock", pid)
    expect(RUNNING, held, 0)
    assert p.ok("check a 9")["equal"]


def test_restore_needs_room_on_every_device(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 4g big", "alloc 1m a", "write a 0x77", "ctx 1", "alloc 1g b",
                "write b 0x78")
    pid = p.pid
    held = [SIM_CONTEXT + 4 * GiB + MiB, SIM_CONTEXT + GiB]
    _ok(cudrive, gpu, "lock", pid)
    _ok(cudrive, gpu, "checkpoint", pid)
    # Another process takes device 1 (only) while the target is parked.
    hog = cudrive.start(gpu.env())
    for line in ("init", "ctx 1", f"alloc {SIM_MEMORY - SIM_CONTEXT - 512 * MiB} hogmem"):
        hog.ok(line)
    hogged = SIM_MEMORY - 512 * MiB
    assert (gpu.used(0), gpu.used(1)) == (0, hogged)

    rec = _ckpt(cudrive, gpu, "restore", pid)
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY, rec
    # Nothing changed: not even device 0, where there was room.
    assert _state(cudrive, gpu, pid) == CHECKPOINTED
    proc = _proc(gpu, pid)
    assert proc["used"] == [0, 0] and proc["parked"] == held, proc
    assert (gpu.used(0), gpu.used(1)) == (0, hogged)

    hog.ok("free hogmem")
    _ok(cudrive, gpu, "restore", pid)
    assert _proc(gpu, pid)["used"] == held
    assert (gpu.used(0), gpu.used(1)) == (held[0], held[1] + SIM_CONTEXT)
    _ok(cudrive, gpu, "unlock", pid)
    p.ok("ctx 0")
    assert p.ok("check a 0x77")["equal"]
    p.ok("ctx 1")
    assert p.ok("check b 0x78")["equal"]


def test_a_process_killed_while_checkpointed_leaves_nothing(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 2g a", "alloc 1m b", "write b 0x42")
    pid = p.pid
    entry = _proc(gpu, pid)["entry"]
    _ok(cudrive, gpu, "lock", pid)
    _ok(cudrive, gpu, "checkpoint", pid)
    host_copy = _side_file(gpu, "ckpt", entry)
    assert host_copy.exists() and _proc(gpu, pid)["host_bytes"] == SIM_CONTEXT + 2 * GiB + MiB
    p.kill9()

    assert _proc(gpu, pid) is None  # status sweeps the dead first
    assert not host_copy.exists() and not _side_file(gpu, "mem", entry).exists()
    status = gpu.status()
    assert all(proc["pid"] != pid for proc in status["processes"]), status
    assert [d["used"] for d in status["devices"]] == [0, 0]
    assert _ckpt(cudrive, gpu, "state", pid)["rc"] == CUDA_ERROR_INVALID_VALUE
    assert _ckpt(cudrive, gpu, "restore", pid)["rc"] == CUDA_ERROR_INVALID_VALUE
    # Its bytes are counted nowhere: another process gets the whole device.
    other = _target(cudrive, gpu, f"alloc {SIM_MEMORY - SIM_CONTEXT} all")
    assert gpu.used(0) == SIM_MEMORY
    other.ok("free all")


def test_a_process_killed_while_locked_with_a_call_waiting(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 1g a")
    pid = p.pid
    _ok(cudrive, gpu, "lock", pid)
    p.send("alloc 1m b")
    assert _blocked(p)
    p.kill9()
    assert _proc(gpu, pid) is None
    assert gpu.used(0) == 0
    assert _ckpt(cudrive, gpu, "unlock", pid)["rc"] == CUDA_ERROR_INVALID_VALUE


def test_pids_that_are_no_cuda_process_of_this_gpu_fail(cudrive, gpu):
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    nvml_only = cudrive.start(gpu.env())
    nvml_only.ok("nvml")  # has an entry, never initialised CUDA
    not_yet = cudrive.start(gpu.env())
    not_yet.ok("echo")
    for pid in (os.getpid(), dead.pid, nvml_only.pid, not_yet.pid, 0, -1, 2**31 - 1):
        for step in ("state", "lock", "checkpoint", "restore", "unlock"):
            rec = _ckpt(cudrive, gpu, step, pid)
            assert rec["rc"] == CUDA_ERROR_INVALID_VALUE, (pid, rec)
    # Another simulated GPU's process is not this one's.
    elsewhere = cudrive.start(gpu.env(HAMI_SIM_STATE=str(gpu.state) + "-other"))
    elsewhere.ok("init")
    assert _ckpt(cudrive, gpu, "state", elsewhere.pid)["rc"] == CUDA_ERROR_INVALID_VALUE


def test_the_entry_points_resolve_through_cuGetProcAddress_from_12_8(cudrive, gpu):
    names = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
             "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")
    script = []
    for name in names:
        script += ["getproc", name, "12080", "0", "getproc", name, "12060", "0", "dlsym", name]
    res = cudrive.run(script, gpu.env())
    found = res.ops("getproc")
    dlsyms = res.ops("dlsym")
    for i, name in enumerate(names):
        new, old, direct = found[2 * i], found[2 * i + 1], dlsyms[i]
        assert new["rc"] == CUDA_SUCCESS and new["sym"] == name and new["ptr"] == direct["ptr"], res.describe()
        assert old["status"] == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, res.describe()
    # And they work when resolved that way.
    p = _target(cudrive, gpu)
    res = cudrive.run(f"init resolve procaddr 12080 ckpt state {p.pid}", gpu.env())
    assert res.one("ckpt")["rc"] == CUDA_SUCCESS and res.one("ckpt")["state"] == RUNNING, res.describe()


# ---- who may checkpoint whom (issue 39, item 3) ---------------------------------------

NOBODY = 65534
CUDA_ERROR_OPERATING_SYSTEM = 304


def test_only_root_and_the_targets_own_user_may_checkpoint_it(cudrive, shared_gpu):
    """The real driver reaches its target through /proc, so the kernel's rule for
    looking into another process holds (docs/parking.md, "Who may park whom"):
    another user's every checkpoint call is refused and changes nothing; the
    target's own user and root may."""
    gpu = shared_gpu
    roots = _target(cudrive, gpu, "alloc 1m a", "write a 90")
    for step in ("state", "lock", "checkpoint", "restore", "unlock"):
        rec = cudrive.run(["init", "ckpt", step, roots.pid], gpu.env(), uid=NOBODY).one("ckpt")
        assert rec["rc"] == CUDA_ERROR_OPERATING_SYSTEM, (step, rec)
    assert _state(cudrive, gpu, roots.pid) == RUNNING
    assert roots.ok("check a 90")["equal"]  # not locked: it answers at once
    # Its own user may, and so may root.
    own = cudrive.with_context(gpu.env(), "alloc 1m b", "write b 165", uid=NOBODY)
    for step in ("lock", "checkpoint"):
        rec = cudrive.run(["init", "ckpt", step, own.pid], gpu.env(), uid=NOBODY).one("ckpt")
        assert rec["rc"] == CUDA_SUCCESS, (step, rec)
    assert _state(cudrive, gpu, own.pid) == CHECKPOINTED  # root asks
    _ok(cudrive, gpu, "restore", own.pid)
    _ok(cudrive, gpu, "unlock", own.pid)
    assert own.ok("check b 165")["equal"]
