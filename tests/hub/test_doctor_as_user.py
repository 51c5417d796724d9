"""``hami-jupyter doctor`` and ``status`` run by a user on a correct hub set-up.

Issue 12, item 7(b): alice's doctor said ``FAIL slice bob: Permission denied``
for bob's slice (0640 bob:hami-admin in the hub's root) and advised setting
HAMI_SLICE_ROOT to leave the hub's root. Another user's slice that alice
cannot read is not a failure (it is skipped, "not yours"), and the doctor
never advises leaving the root the hub manages. ``status`` shows the hub's
root beside the user's own and skips, with a note, the slices the user
cannot read (issue 26). Real Unix users: run as root.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from unix_users import RUNUSER, UnixUsers, require_root_users, shared_tmpdir, user_python

from hami_jupyter.hub.sizes import parse_size_spec
from hami_jupyter.hub.slice_files import owner_of, prepare_user_slice

REPO = Path(__file__).resolve().parents[2]

DOCTOR = """
import dataclasses, json, sys
from hami_jupyter.commands import doctor
root = sys.argv[1]
checks = [doctor.check_slice_root(root)] + doctor.check_slices(root)
print(json.dumps([dataclasses.asdict(c) for c in checks]))
"""


@pytest.fixture(scope="module")
def hub_root():
    require_root_users()
    users = UnixUsers().create()
    work = shared_tmpdir("hami-doctor-")
    try:
        python, why = user_python(work)
        if python is None:
            pytest.skip(why)
        root = work / "slices"  # the hub's: root-owned, 0755
        size = parse_size_spec("small", {"memory": "1g", "sm": 25})
        for name in ("alice", "bob"):
            uid, gid = owner_of(name)
            prepare_user_slice(name, size, uid, gid, root, admin_group="hami-admin", gpus=[])
        yield python, root
    finally:
        subprocess.run(["rm", "-rf", str(work)])
        users.remove()


def doctor_as(user, python, root):
    env = {"PATH": "/usr/bin:/bin", "JUPYTERHUB_USER": user, "PYTHONPATH": str(REPO),
           "HOME": f"/home/{user}"}
    done = subprocess.run([RUNUSER, "-u", user, "--", python, "-c", DOCTOR, str(root)],
                          env=env, cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {c["name"]: c for c in json.loads(done.stdout)}


# `hami-jupyter status ...` with the test's folder standing for /run/hami-jupyter.
STATUS = """
import sys
from pathlib import Path
from hami_jupyter.slice import paths
paths.HUB_ROOT = Path(sys.argv[1])
from hami_jupyter.commands.cli import main
sys.exit(main(sys.argv[2:]))
"""


def status_as(user, python, root, *argv):
    env = {"PATH": "/usr/bin:/bin", "JUPYTERHUB_USER": user, "PYTHONPATH": str(REPO),
           "HOME": f"/home/{user}", "HAMI_SLICE_ROOT": str(root.parent / f"{user}-own")}
    return subprocess.run([RUNUSER, "-u", user, "--", python, "-c", STATUS, str(root), "status",
                           *argv],
                          env=env, cwd="/", capture_output=True, text=True, timeout=60)


def test_status_shows_the_hubs_slices_one_may_read(hub_root):
    python, root = hub_root
    for argv in (["--root", str(root)], []):  # alone, or beside alice's own (empty) root
        done = status_as("alice", python, root, *argv)
        assert done.returncode == 0, done.stderr
        assert f"hami slice 'alice'  ({root / 'alice.slice'})" in done.stdout
        assert "'bob'" not in done.stdout
        assert done.stderr == (f"hami-jupyter status: note: skipped 1 slice(s) of other users "
                               f"under {root}, which you cannot read: bob\n")
    done = status_as("carol", python, root, "--json")  # an administrator reads them all
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [s["slice"] for s in json.loads(done.stdout)] == ["alice", "bob"]


def test_others_slices_are_skipped_not_failed(hub_root):
    python, root = hub_root
    assert oct(os.stat(root / "bob.slice").st_mode & 0o777) == "0o640"
    checks = doctor_as("alice", python, root)
    said = json.dumps(checks)
    assert not [c for c in checks.values() if c["status"] == "FAIL"], said
    assert checks['slice "alice"']["status"] == "PASS", said
    assert 'slice "bob"' not in checks, said
    other = checks["other slices"]
    assert other["status"] == "PASS" and "not yours" in other["detail"] and "bob" in other["detail"]
    # The hub's root, not writable by alice, is as it should be; never "leave it".
    assert checks["slice root"]["status"] == "PASS", said
    assert "managed by the hub" in checks["slice root"]["detail"]
    assert "HAMI_SLICE_ROOT" not in said


def test_an_administrator_sees_every_slice(hub_root):
    python, root = hub_root
    checks = doctor_as("carol", python, root)  # in hami-admin: may read usage
    assert checks['slice "alice"']["status"] == "PASS" and checks['slice "bob"']["status"] == "PASS"
    assert "HAMI_SLICE_ROOT" not in json.dumps(checks)


def test_no_slice_of_ones_own_yet_says_to_start_the_server(hub_root):
    python, root = hub_root
    checks = doctor_as("carol", python, root)
    root_check = checks["slice root"]
    assert root_check["status"] == "WARN", root_check
    assert "start (or restart) your server from the hub" in root_check["advice"]
    assert "HAMI_SLICE_ROOT" not in json.dumps(root_check)


def cli_as(user, python, *argv):
    env = {"PATH": "/usr/bin:/bin", "JUPYTERHUB_USER": user, "PYTHONPATH": str(REPO),
           "HOME": f"/home/{user}"}
    return subprocess.run([RUNUSER, "-u", user, "--", python, "-m", "hami_jupyter", *argv],
                          env=env, cwd="/", capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv", [["slice", "list"], ["status"], ["status", "--json"]],
                         ids=["slice-list", "status", "status-json"])
def test_slice_list_and_status_skip_others_slices_like_doctor(hub_root, argv):
    """Issue 27, item 6(g): as alice, `slice list` and `status` exited 1 on bob's
    slice ("no permission to read slice file"); they skip it as doctor does."""
    python, root = hub_root
    done = cli_as("alice", python, *argv, "--root", str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no permission" not in done.stdout + done.stderr
    assert "skipped" in done.stderr and "bob" in done.stderr, done.stderr
    if "--json" in argv:
        assert [s["slice"] for s in json.loads(done.stdout)] == ["alice"]
    else:
        assert "alice" in done.stdout and "bob" not in done.stdout, done.stdout
