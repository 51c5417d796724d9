"""Issue 12, items 4 and 5: an administrator's change outlives server restarts until
reset, every write of a limits file is logged, and the log is root's to write.

Most tests need root (CI runs as root): they hand files to other users, create a
test admin group and user with groupadd/useradd (removed afterwards), and play the
other users in child processes that drop privileges with setuid().
"""

import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from hami_jupyter import audit
from hami_jupyter.admin import actions, changes
from hami_jupyter.admin.cli import main
from hami_jupyter.hub.sizes import parse_size_spec
from hami_jupyter.gpus import HostGpu
from hami_jupyter.hub.slice_files import prepare_user_slice
from hami_jupyter.slice.file import read_snapshot

GiB = 1 << 30
NOBODY = 65534
UUIDS = ["GPU-5a1f0000-0000-4000-8000-000000000000"]
GPUS = [HostGpu(0, UUIDS[0], memory_total=16 * GiB)]
SMALL = parse_size_spec("small", {"memory": "1g", "sm": 25})
LARGE = parse_size_spec("large", {"memory": "2g", "sm": 50})
WAIT_S = 30

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: hands files to other "
                                "users, creates a test user and group, and setuid()s children")


def memory(path):
    return read_snapshot(path).fallback_limit.memory_limit


def records(root):
    return audit.read_records(audit.default_path(root))


@pytest.fixture
def base():
    """A folder every user may look into."""
    b = Path(tempfile.mkdtemp(prefix="hami-audit-", dir="/tmp"))
    os.chmod(b, 0o755)
    yield b
    shutil.rmtree(b, ignore_errors=True)


@pytest.fixture
def admins():
    """A test admin group with one member (created with groupadd/useradd, removed after)."""
    tag = f"{os.getpid() % 100000}"
    group, user = f"hamitg{tag}", f"hamitu{tag}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        subprocess.run(["useradd", "-M", "-N", "-g", "nogroup" if _has_group("nogroup") else "users",
                        "-G", group, "-s", "/usr/sbin/nologin", user], check=True, capture_output=True)
        try:
            pw = pwd.getpwnam(user)
            import grp
            yield SimpleNamespace(group=group, gid=grp.getgrnam(group).gr_gid, user=user,
                                  uid=pw.pw_uid, primary_gid=pw.pw_gid)
        finally:
            subprocess.run(["userdel", user], capture_output=True)
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


def _has_group(name):
    import grp
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


# A child that becomes another user once its imports are done (the interpreter may
# live where that user cannot read), then runs one step and prints JSON.
CHILD = textwrap.dedent("""
    import json, os, sys
    from hami_jupyter import audit
    from hami_jupyter.admin import actions, changes, service
    from hami_jupyter.admin import marks  # noqa: F401  imported before dropping privileges

    uid, gid, groups, step, arg = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    out = {"uid": os.getuid()}
    if step == "write-log":
        for what, act in (("append", lambda: open(arg, "a").write("forged\\n")),
                          ("truncate", lambda: os.truncate(arg, 0)),
                          ("unlink", lambda: os.unlink(arg))):
            try:
                act()
                out[what] = "done"
            except OSError as e:
                out[what] = type(e).__name__
    elif step == "guard-end":
        from hami_jupyter.admin.guard_parked import ParkedError
        root, pid = arg.rsplit(":", 1)
        try:
            out["message"] = actions.guard_act(root, int(pid), "end")
        except ParkedError as e:
            out["error"] = str(e)
    elif step in ("set", "reset"):
        try:
            if step == "set":
                c = actions.apply(arg, memory="4g")
                out["applied"] = c.summary()
            else:
                out["reset"] = actions.reset(arg)
        except changes.ChangeError as e:
            out["error"] = str(e)
            out["read_only"] = isinstance(e, changes.ReadOnlyError)
    print(json.dumps(out))
""")


def child(uid, gid, groups, step, arg, env=None):
    env = dict(os.environ if env is None else env)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(uid), str(gid), json.dumps(groups),
                           step, str(arg)], env=env, cwd="/", capture_output=True, text=True,
                          timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- item 5: who, and who may write the log ----------------------------------------------


def test_who_comes_from_the_os_even_with_jupyterhub_user_set(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert me != "alice"
    assert audit.current_user() == me
    record = audit.make_record("s", tmp_path / "s.slice", None, None, {}, {})
    assert (record["who"], record["uid"], record["euid"]) == (me, os.getuid(), os.geteuid())


@needs_root
def test_neither_users_nor_admins_can_append_to_or_cut_the_log(base, admins):
    root = base / "slices"
    prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, admin_group=admins.group, gpus=GPUS)
    log = audit.default_path(root)
    st = os.stat(log)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, admins.gid)
    before = log.read_bytes()
    for who in ((NOBODY, NOBODY, []), (admins.uid, admins.primary_gid, [admins.gid])):
        seen = child(*who, "write-log", log)
        assert seen == {"uid": who[0], "append": "PermissionError", "truncate": "PermissionError",
                        "unlink": "PermissionError"}, who
    assert log.read_bytes() == before
    assert audit.verify(log) == ([], [])


def test_audit_verify_finds_edits_removals_and_truncation(tmp_path, capsys):
    log = tmp_path / "audit.log"
    for n in range(3):
        with audit.AuditLog(log) as w:
            w.append({"slice": "alice", "n": n})
    assert audit.verify(log) == ([], [])
    assert main(["audit", "verify", "--log", str(log)]) == 0
    assert "intact (3 records" in capsys.readouterr().out
    good = log.read_bytes()

    lines = good.splitlines(keepends=True)
    log.write_bytes(lines[0] + lines[1].replace(b'"n": 1', b'"n": 7') + lines[2])  # an edit
    problems, _ = audit.verify(log)
    assert any(":3: the chain breaks" in p for p in problems), problems
    assert main(["audit", "verify", "--log", str(log)]) == 1

    log.write_bytes(lines[0] + lines[2])  # a removal
    assert any(":2: the chain breaks" in p for p in audit.verify(log)[0])

    log.write_bytes(lines[0] + lines[1])  # the end cut off
    problems, _ = audit.verify(log)
    assert any("has 2 lines, the head records 3" in p for p in problems), problems


# ---- item 5: the admin service --------------------------------------------------------------


@needs_root
def test_the_service_applies_an_admins_change_and_refuses_anyone_else(base, admins):
    from hami_jupyter.admin.service import AdminService

    root = base / "slices"
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, admin_group=admins.group, gpus=GPUS)
    service = AdminService(root, admins.group).start()
    try:
        sock = root / "admin.sock"
        st = os.stat(sock)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o660, 0, admins.gid)
        env = {**os.environ, "JUPYTERHUB_USER": "alice", "HOME": str(base)}
        admin = (admins.uid, admins.primary_gid, [admins.gid])

        # An admin (not root, cannot write the log) changes limits through the service.
        seen = child(*admin, "set", path, env)
        assert "error" not in seen and "1.0 GiB" in seen["applied"] and "4.0 GiB" in seen["applied"]
        assert memory(path) == 4 * GiB
        last = records(root)[-1]
        assert (last["action"], last["who"], last["uid"], last["euid"], last["via"]) == \
            ("set", admins.user, admins.uid, 0, "admin-service")
        mark = root / "alice.limits.admin"
        assert json.loads(mark.read_text())["who"] == admins.user
        assert stat.S_IMODE(os.stat(mark).st_mode) == 0o644 and os.stat(mark).st_uid == 0

        # Anyone else is refused by the uid the kernel reports, even with the socket open to all.
        os.chmod(sock, 0o666)
        count = len(records(root))
        seen = child(NOBODY, NOBODY, [], "set", path, env)
        assert seen.get("read_only") and "is not an administrator" in seen["error"], seen
        assert memory(path) == 4 * GiB and len(records(root)) == count

        # The admin resets: back to the policy's limits.
        seen = child(*admin, "reset", path, env)
        assert "back to the policy's size 'small'" in seen["reset"], seen
        assert memory(path) == GiB and not mark.exists()
        assert records(root)[-1]["action"] == "reset" and records(root)[-1]["who"] == admins.user
        assert audit.verify(audit.default_path(root))[0] == []
    finally:
        service.close()
    assert not (root / "admin.sock").exists()


def test_the_service_ends_a_process_the_guard_parked_for_an_admin_only(base, admins):
    """Issue 27, item 2: an administrator who is not root ends (or resumes) a
    process the guard parked through the admin service, which checks who asks
    and audits it under their name."""
    from fake_guard import write_guard

    from hami_jupyter.admin.service import AdminService
    from hami_jupyter.processes import start_ticks
    from hami_jupyter.slice.guard_report import write_report

    root = base / "slices"
    prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, admin_group=admins.group, gpus=GPUS)
    parked = subprocess.Popen(["sleep", "60"])
    service = AdminService(root, admins.group).start()
    try:
        report = write_guard(root, {}, action="park")
        report["parked"] = [{"pid": parked.pid, "start_ticks": start_ticks(parked.pid), "slice": "alice",
                             "user": "alice", "uuid": UUIDS[0], "command": "sleep 60",
                             "process_bytes": GiB, "unix": report["written_unix"], "action": "park",
                             "why": "held 1.0 GiB past its slice's cap without the preload library"}]
        write_report(report, root)
        env = {**os.environ, "HOME": str(base)}
        target = f"{root}:{parked.pid}"

        os.chmod(root / "admin.sock", 0o666)  # the service's own check, by the caller's uid
        seen = child(NOBODY, NOBODY, [], "guard-end", target, env)
        assert "not an administrator" in seen.get("error", ""), seen
        assert parked.poll() is None

        seen = child(admins.uid, admins.primary_gid, [admins.gid], "guard-end", target, env)
        assert "error" not in seen and f"process {parked.pid} (alice) ended" in seen["message"], seen
        assert parked.wait(WAIT_S) != 0
        last = records(root)[-1]
        assert (last["action"], last["who"], last["uid"], last["pid"], last["slice"]) == \
            ("guard-end", admins.user, admins.uid, parked.pid, "alice")
        assert audit.verify(audit.default_path(root))[0] == []
    finally:
        service.close()
        if parked.poll() is None:
            parked.kill()
            parked.wait()


# ---- item 4: the hub keeps an admin's change until reset ---------------------------------------


@needs_root
def test_a_server_restart_keeps_an_admins_change_and_logs_it(base, caplog):
    root = base / "slices"
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, gpus=GPUS)
    actions.apply(path, memory="3g")  # root: written directly
    assert memory(path) == 3 * GiB
    with caplog.at_level(logging.INFO, logger="hami_jupyter.hub"):
        prepare_user_slice("alice", LARGE, NOBODY, NOBODY, root, gpus=GPUS)  # the server restarts
    assert memory(path) == 3 * GiB  # the admin's change wins
    said = caplog.text
    assert "slice alice keeps the limits an administrator set" in said
    assert "3.0 GiB" in said and "large" in said and "2.0 GiB" in said
    log = records(root)
    assert [r["action"] for r in log] == ["policy", "set", "policy-kept"]
    assert [r["who"] for r in log][::2] == [audit.HUB_WHO] * 2
    assert [r.get("size") for r in log][::2] == ["small", "large"]
    assert log[0]["new"]["default"]["memory_limit"] == GiB
    assert log[2]["policy"]["default"]["memory_limit"] == 2 * GiB


@needs_root
def test_reset_returns_to_the_policy_and_the_hub_applies_it_again(base, capsys):
    root = base / "slices"
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, gpus=GPUS)
    actions.apply(path, memory="3g", sm="10")
    prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, gpus=GPUS)
    assert memory(path) == 3 * GiB
    assert main(["slice", "reset", "alice", "--root", str(root)]) == 0
    assert "back to the policy's size 'small'" in capsys.readouterr().out
    fallback = read_snapshot(path).fallback_limit
    assert (fallback.memory_limit, fallback.sm_share) == (GiB, 25)
    assert main(["slice", "reset", "alice", "--root", str(root)]) == 1  # nothing left to reset
    assert "no limits set by an administrator" in capsys.readouterr().err
    prepare_user_slice("alice", LARGE, NOBODY, NOBODY, root, gpus=GPUS)  # the policy rules again
    assert memory(path) == 2 * GiB
    assert [r["action"] for r in records(root)] == ["policy", "set", "policy-kept", "reset", "policy"]
    assert audit.verify(audit.default_path(root))[0] == []


@needs_root
def test_a_marker_the_admin_did_not_write_through_root_is_ignored(base):
    """An admin-set marker must come from root: a user's file of that name means nothing."""
    root = base / "slices"
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, gpus=GPUS)
    actions.apply(path, memory="3g")
    os.chown(root / "alice.limits.admin", NOBODY, NOBODY)  # as if someone else had made it
    prepare_user_slice("alice", SMALL, NOBODY, NOBODY, root, gpus=GPUS)
    assert memory(path) == GiB
