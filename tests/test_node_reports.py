"""Who reads the agent's reports (issue 39, row 7): guard.json and broker.json
(0644) showed every user's PIDs, kernel ids and bytes to every user.

The full reports are root's and the administrators' (the audit log's group);
each user who owns a slice file in the root reads a view of her own, with her
slices and her processes only, through the same ``read_report`` every view
uses. Needs root: the slice files are given to other users, and the reports
are read as them (a forked child that drops to their uid).
"""

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from hami_jupyter.slice import broker_report, guard_report, node_report

ALICE, BOB, ADMINS = 4242, 4343, 4444


@pytest.fixture
def root():
    """A slice root other users can reach (a test's tmp_path is root's, 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the slice files belong to other users")
    folder = Path(tempfile.mkdtemp(prefix="hami-reports-", dir="/tmp"))
    folder.chmod(0o755)
    for name, uid in (("alice", ALICE), ("bob", BOB)):
        (folder / f"{name}.slice").write_bytes(b"\0" * 64)
        os.chown(folder / f"{name}.slice", uid, uid)
    (folder / "audit.log").write_text("")
    os.chown(folder / "audit.log", 0, ADMINS)  # the hub gives the audit log to the admin group
    yield folder
    shutil.rmtree(folder)


def _as(uid, gid, read):
    """What *read()* returns in a child process running as *uid*/*gid* (JSON), or its error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, read, say, leave
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                out = {"report": read()}
            except Exception as e:  # noqa: BLE001 (said to the parent)
                out = {"error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _process(pid, user):
    return {"pid": pid, "start_ticks": 1, "real_bytes": 1 << 30, "preload": True, "attributed_by": "slot",
            "user": user, "charged_bytes": None, "allowed_bytes": None}


GUARD = {
    "written_unix": 1e12, "interval": 0.5, "action": "park", "guard_pid": 1, "host": "h",
    "errors": ["slice bob: cannot be read (junk): held to its limits file", "pid 77 of slice bob: not parked now",
               "GPU index 1: NVML: GPU is lost"],
    "slices": {"alice": {"path": "/r/alice.slice", "gpus": {"GPU-0": {"real_bytes": 1 << 30,
                                                                       "processes": [_process(1001, "alice")]}}},
               "bob": {"path": "/r/bob.slice", "gpus": {"GPU-0": {"real_bytes": 2 << 30,
                                                                   "processes": [_process(2002, "bob")]}}}},
    "unattributed": [{"pid": 3003, "uuid": "GPU-0", "real_bytes": 5, "user": "bob", "uid": BOB, "why": "x"},
                     {"pid": 3004, "uuid": "GPU-0", "real_bytes": 5, "user": "alice", "uid": ALICE, "why": "x"}],
    "actions": [{"slice": "bob", "pid": 2002, "action": "park", "command": "python secret_bob.py"}],
    "parked": [{"slice": "bob", "pid": 2002, "command": "python secret_bob.py"}],
    "returns": [],
}

BROKER = {
    "written_unix": 1e12, "running": True, "broker_pid": 1, "host": "h", "errors": [],
    "gpus": {"GPU-0": {
        "queue": [{"slice": "alice", "pid": 1001, "user": "alice", "kernel": "k-alice", "bytes": 1,
                   "since_unix_ns": 1, "serving": True},
                  {"slice": "bob", "pid": 2002, "user": "bob", "kernel": "k-bob", "bytes": 2,
                   "since_unix_ns": 2, "serving": False}],
        "decisions": [
            {"action": "park", "slice": "bob", "kernel": "k-bob", "pids": [2002], "user": "bob", "bytes": 9,
             "requester": {"slice": "alice", "pid": 1001, "user": "alice", "kernel": "k-alice"},
             "why": "to make room for pid 1001 (user alice): kernel k-bob of slice bob"},
            {"action": "refused", "requester": {"slice": "bob", "pid": 2002, "user": "bob", "kernel": "k-bob"},
             "why": "NO to pid 2002"}]}},
    "held": [{"slice": "bob", "pid": 2002, "for": "room"}],
}


def test_the_full_reports_are_the_administrators_and_each_user_reads_her_own(root):
    guard_report.write_report(dict(GUARD), root)
    broker_report.write_report(dict(BROKER), root)
    for name in ("guard.json", "broker.json"):
        st = os.stat(root / name)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, ADMINS, 0o640), name
        view = node_report.view_path(root / name, ALICE)
        st = os.stat(view)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (ALICE, 0o400), name

    got = _as(ALICE, ALICE, lambda: guard_report.read_report(root))
    assert "report" in got, got
    alice = got["report"]
    text = json.dumps(alice)
    assert list(alice["slices"]) == ["alice"] and not alice["stale"]
    for secret in ("2002", "3003", "secret_bob", "bob"):
        assert secret not in text, (secret, text)
    assert [u["pid"] for u in alice["unattributed"]] == [3004]
    assert alice["errors"] == ["GPU index 1: NVML: GPU is lost"]

    seen = _as(ALICE, ALICE, lambda: broker_report.read_report(root))["report"]
    gpu = seen["gpus"]["GPU-0"]
    assert [q["pid"] for q in gpu["queue"]] == [1001] and gpu["others_waiting"] == 1
    [park] = gpu["decisions"]  # the park made for her; bob's refusal is his
    assert park["requester"]["pid"] == 1001 and park["user"] == "bob"
    assert "2002" not in json.dumps(seen) and "k-bob" not in json.dumps(seen) and seen["held"] == []

    bob = _as(BOB, BOB, lambda: guard_report.read_report(root))["report"]
    assert list(bob["slices"]) == ["bob"] and [p["pid"] for p in bob["parked"]] == [2002]
    # An administrator (the audit log's group) and root read all of it.
    admin = _as(5555, ADMINS, lambda: guard_report.read_report(root))["report"]
    assert sorted(admin["slices"]) == ["alice", "bob"]
    assert sorted(guard_report.read_report(root)["slices"]) == ["alice", "bob"]
    # A user with no slice here reads nothing of it.
    assert _as(6666, 6666, lambda: guard_report.read_report(root)) == {"report": None}
    # Nobody may read another's view.
    other = _as(BOB, BOB, lambda: open(node_report.view_path(root / "guard.json", ALICE)).read())
    assert "Permission denied" in other["error"]


def test_a_user_who_owns_no_slice_any_more_loses_her_view(root):
    guard_report.write_report(dict(GUARD), root)
    view = node_report.view_path(root / "guard.json", BOB)
    assert view.exists()
    (root / "bob.slice").unlink()
    guard_report.write_report(dict(GUARD), root)
    assert not view.exists()
