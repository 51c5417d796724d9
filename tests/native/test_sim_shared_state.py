"""One simulated GPU for every user (issue 27, item 6d).

docs/single-host.md makes the state as root, in a folder only root may write
(/run/hami-sim, 0755), for the processes of every user. The device memory of
each process and its checkpoint's host copy live in ``state.mem/`` and
``state.ckpt/`` beside it: a user's process must be able to write there
(before: "cannot create /run/hami-sim/state.mem: Permission denied", and
cuMemcpyHtoD_v2 failed), and root's checkpoint of that process must come
back to it intact.

Two uids: root, and ``nobody`` for one process (started with its uid and gid
dropped). Skipped when the tests do not run as root (CI does).
"""

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

USER = "nobody"


@pytest.fixture
def shared_state(gpu):
    """The state in a root-owned 0755 folder that *USER* can search, made by root
    under umask 000 as the guide says; its path."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a process of another user shares the simulated GPU")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER}")
    folder = Path(tempfile.mkdtemp(prefix="hami-sim-shared-", dir="/tmp"))
    os.chmod(folder, 0o755)
    state = folder / "state"
    old = os.umask(0)
    try:
        subprocess.run([str(gpu.build.simctl), "--state", str(state), "status"],
                       env=env_for(gpu, state), check=True, capture_output=True)
    finally:
        os.umask(old)
    yield state, pw
    shutil.rmtree(folder, ignore_errors=True)


def env_for(gpu, state):
    env = gpu.env()
    env["HAMI_SIM_STATE"] = str(state)
    return env


def as_user(pw):
    def drop():
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
        os.umask(0o022)
    return drop


def records(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_every_user_writes_device_memory_and_roots_checkpoint_keeps_it(gpu, shared_state):
    state, pw = shared_state
    env = env_for(gpu, state)
    cudrive = str(gpu.build.cudrive)

    # root first: its process ends, and its entry is free for the next one.
    done = subprocess.run([cudrive, "init", "ctx", "0", "alloc", "1m", "A", "write", "A", "1",
                           "check", "A", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert [r["rc"] for r in records(done.stdout)] == [0] * 5, done.stdout + done.stderr

    # nobody's process, holding memory it wrote.
    user = subprocess.Popen([cudrive, "stdin"], env=env, preexec_fn=as_user(pw), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def cmd(line):
            user.stdin.write(line + "\n")
            user.stdin.flush()
            return json.loads(user.stdout.readline())

        for line in ("init", "ctx 0", "alloc 1m A"):
            assert cmd(line)["rc"] == 0, line
        wrote = cmd("write A 90")
        assert wrote["rc"] == 0, f"{wrote}: {user.stderr.readline() if wrote['rc'] else ''}"
        assert cmd("check A 90")["equal"]

        # root parks it (the guard's hami-park hold does these calls) and brings it back.
        for step in ("lock", "checkpoint", "restore", "unlock"):
            ran = subprocess.run([cudrive, "init", "ckpt", step, str(user.pid)], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert [r["rc"] for r in records(ran.stdout)] == [0, 0], f"ckpt {step}: {ran.stdout}{ran.stderr}"
        assert cmd("check A 90")["equal"], "the checkpoint lost the user's device memory"
    finally:
        user.kill()
        user.communicate()
    for kind in ("mem", "ckpt"):
        mode = os.stat(f"{state}.{kind}").st_mode & 0o7777
        assert mode == 0o1777, f"{state}.{kind}: {mode:o}"
