"""Who owns what: slice folders and files another user could have planted are refused.

The rule is native/src/trust.c's, held in Python by hami_jupyter/slice_paths.py
(docs/slice-file.md, "Who owns what"): a folder is owned by the user or root
and is not writable by everyone unless sticky; a slice file, limits file or
registry entry is a regular file nobody else may write, owned by the user or
root, or lying in a root-owned folder nobody else may write (the hub's). The
tests that change owners need root; one runs its checks as user nobody in a
child process, the way a user meets a folder another user made first.
"""

import json
import os
import subprocess
import sys
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.settings import AskedLimits
from hami_jupyter.slice.layout import limits_file_path
from hami_jupyter.slice.file import SliceFile, SliceFileError, read_snapshot
from hami_jupyter.slice.paths import UntrustedPath, list_slice_paths
from hami_jupyter.slice.create import create_limits_file, create_slice, ensure_slice

GiB = 1 << 30
OTHER_UID = 1001  # "mallory": any uid that is neither root nor the test's user
NOBODY = 65534
ONE_GIB = Limits(memory_limit=GiB)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give files to another user")


def folder(path, mode=0o700, uid=None):
    path.mkdir(mode=mode)
    path.chmod(mode)  # whatever the umask says
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def mode_of(path):
    return os.stat(path).st_mode & 0o7777


# ---- folders ------------------------------------------------------------------------


@needs_root
def test_a_slice_folder_another_user_made_is_refused(tmp_path):
    """/tmp/hami-jupyter-<uid> is easy to guess: whoever makes it first must be us or root."""
    planted = folder(tmp_path / "hami-jupyter-0", 0o755, uid=OTHER_UID)
    with pytest.raises(UntrustedPath) as info:
        ensure_slice(planted / "alice.slice", "alice", AskedLimits(ONE_GIB))
    message = str(info.value)
    assert f"slice folder {planted} is owned by uid {OTHER_UID}, not by you (uid 0) or root" in message
    assert "remove it" in message and "HAMI_SLICE_ROOT" in message
    assert os.listdir(planted) == []  # nothing written into it

    create_slice(tmp_path / "alice.slice", "alice", ONE_GIB)
    os.link(tmp_path / "alice.slice", planted / "alice.slice")  # a slice file planted there
    with pytest.raises(UntrustedPath, match=f"owned by uid {OTHER_UID}"):
        SliceFile(planted / "alice.slice")


def test_a_folder_everyone_may_write_is_refused_unless_sticky(tmp_path):
    open_folder = folder(tmp_path / "open", 0o777)
    with pytest.raises(UntrustedPath, match=r"is writable by every user \(mode 777\).*chmod o-w"):
        ensure_slice(open_folder / "alice.slice", "alice", AskedLimits(ONE_GIB))
    assert os.listdir(open_folder) == []

    sticky = folder(tmp_path / "sticky", 0o1777)  # as /tmp: nobody can swap another's files
    assert ensure_slice(sticky / "alice.slice", "alice", AskedLimits(ONE_GIB)) == "created"
    assert read_snapshot(sticky / "alice.slice").fallback_limit.memory_limit == GiB


# ---- files --------------------------------------------------------------------------


def test_a_slice_file_everyone_may_write_is_refused(tmp_path):
    path = tmp_path / "alice.slice"
    create_slice(path, "alice", ONE_GIB)
    path.chmod(0o666)
    with pytest.raises(UntrustedPath, match=r"slice file .*alice.slice is writable by every user \(mode 666\)"):
        SliceFile(path)
    with pytest.raises(UntrustedPath):
        ensure_slice(path, "alice", AskedLimits(ONE_GIB))


def test_a_dangling_link_is_refused_naming_its_target(tmp_path):
    path = tmp_path / "alice.slice"
    path.symlink_to(tmp_path / "gone.slice")
    with pytest.raises(UntrustedPath, match=r"is a symbolic link to .*gone.slice, which does not exist"):
        SliceFile(path)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        ensure_slice(path, "alice", AskedLimits(ONE_GIB))  # never "kept" as if it were a slice
    assert not (tmp_path / "gone.slice").exists()


def test_a_fifo_in_place_of_a_slice_is_refused_at_once(tmp_path):
    path = tmp_path / "alice.slice"
    os.mkfifo(path)
    for attempt in (lambda: SliceFile(path), lambda: ensure_slice(path, "alice", AskedLimits(ONE_GIB))):
        with pytest.raises(UntrustedPath, match=r"is a FIFO \(named pipe\), not a regular file"):
            attempt()


@needs_root
def test_the_hub_hands_users_their_own_files(tmp_path):
    """In a root-owned folder nobody else may write, a slice file the hub gave to a
    user is read by root's tools, and so are the user's registry entries."""
    hub = folder(tmp_path / "hub", 0o755)
    path = hub / "alice.slice"
    create_limits_file(path, ONE_GIB)
    create_slice(path, "alice", ONE_GIB)
    os.chown(path, OTHER_UID, OTHER_UID)
    registry = folder(hub / "alice.slice.kernels", 0o700, uid=OTHER_UID)
    entry = kernel_registry.new_entry(path, "k-1", "alice", "hami-python3", os.getpid())
    (registry / "k-1.json").write_text(json.dumps(entry.__dict__))
    os.chown(registry / "k-1.json", OTHER_UID, OTHER_UID)

    assert read_snapshot(path).fallback_limit.memory_limit == GiB
    assert [k.kernel_id for k in kernel_registry.kernels(path)] == ["k-1"]
    assert list_slice_paths(hub) == [path]

    # Should the hub's folder become writable by everyone, nothing in it is trusted.
    hub.chmod(0o777)
    with pytest.raises(UntrustedPath):
        read_snapshot(path)


# ---- the limits file fails closed ------------------------------------------------------


def test_a_limits_file_that_cannot_be_looked_for_fails_closed(tmp_path):
    """Never the user-owned block of the slice file in place of the hub's limits."""
    path = tmp_path / "alice.slice"
    create_slice(path, "alice", ONE_GIB)
    os.symlink(tmp_path / "gone", limits_file_path(path))
    with pytest.raises(UntrustedPath, match="limits file .* is a symbolic link to .*gone, which does not exist"):
        read_snapshot(path)
    with pytest.raises(UntrustedPath):
        ensure_slice(path, "alice", AskedLimits(ONE_GIB))

    # A slice name of 249 characters fits NAME_MAX; its limits file's name does not.
    long = tmp_path / ("x" * 249 + ".slice")
    long.write_bytes(path.read_bytes())
    with pytest.raises(SliceFileError, match="the limits file of this slice cannot be looked for "
                                             r"\(File name too long\)"):
        read_snapshot(long)
    with pytest.raises(SliceFileError, match="cannot be looked for"):
        ensure_slice(long, "long", AskedLimits(ONE_GIB))


@needs_root
def test_a_limits_file_must_be_the_users_or_roots_wherever_it_lies(tmp_path):
    hub = folder(tmp_path / "hub", 0o755)
    path = hub / "alice.slice"
    create_limits_file(path, ONE_GIB)
    create_slice(path, "alice", ONE_GIB)
    os.chown(limits_file_path(path), OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedPath, match=f"limits file .*alice.limits is owned by uid {OTHER_UID}"):
        read_snapshot(path)


# ---- what Python creates ----------------------------------------------------------------


def test_what_python_creates_is_private_to_the_user(tmp_path):
    old = os.umask(0)  # the modes must not depend on a lenient umask
    try:
        path = tmp_path / "a" / "b" / "alice.slice"
        assert ensure_slice(path, "alice", AskedLimits(ONE_GIB)) == "created"
        kernel_registry.register(path, kernel_registry.new_entry(path, "k-1", "alice", "py", os.getpid()))
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "a") == 0o700 and mode_of(tmp_path / "a" / "b") == 0o700
    assert mode_of(path) == 0o600
    assert mode_of(kernel_registry.registry_dir(path)) == 0o700
    assert mode_of(kernel_registry.registry_dir(path) / "k-1.json") == 0o644


# ---- as a user meets it: a child running as nobody ---------------------------------------

AS_NOBODY = textwrap.dedent("""
    import contextlib, io, json, os, sys
    from hami_jupyter.commands.cli import main
    from hami_jupyter.slice.file import read_snapshot
    from hami_jupyter.slice.create import ensure_slice
    from hami_jupyter.slice.limits import Limits
    from hami_jupyter.slice.settings import AskedLimits

    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    planted, mine = sys.argv[1], sys.argv[2]
    seen = {}

    def attempt(name, f):
        try:
            seen[name] = ["ok", f()]
        except Exception as e:
            seen[name] = [type(e).__name__, str(e)]

    def status(root):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["status", "--root", root])
        return [code, out.getvalue(), err.getvalue()]

    attempt("ensure", lambda: ensure_slice(os.path.join(planted, "me.slice"), "me", AskedLimits(Limits(memory_limit=1 << 30))))
    attempt("read_planted", lambda: read_snapshot(os.path.join(mine, "evil.slice")).name)
    attempt("read_own", lambda: read_snapshot(os.path.join(mine, "good.slice")).name)
    seen["status_planted"] = status(planted)
    seen["status_mine"] = status(mine)
    print(json.dumps(seen))
""")


@needs_root
def test_a_user_refuses_what_another_user_planted():
    """User nobody finds its slice folder made by another user, and a slice file of
    another user in its own folder (as a slice name it would use by default)."""
    base = Path(tempfile.mkdtemp(prefix="hami-trust-"))
    try:
        base.chmod(0o755)
        # Made first by another user, open to all (sticky, like /tmp) so that the
        # victim's tools write there; its owner can still remove or swap anything.
        planted = folder(base / "planted", 0o1777, uid=OTHER_UID)
        mine = folder(base / "mine", 0o755)
        create_slice(mine / "evil.slice", "evil", Limits(memory_limit=1 << 20), mode=0o644)
        os.chown(mine / "evil.slice", OTHER_UID, OTHER_UID)
        create_slice(mine / "good.slice", "good", ONE_GIB)
        os.chown(mine / "good.slice", NOBODY, NOBODY)
        os.chown(mine, NOBODY, NOBODY)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "JUPYTERHUB_"))}
        env["HOME"] = str(base)
        child = subprocess.run([sys.executable, "-c", AS_NOBODY, str(planted), str(mine)], env=env,
                               cwd=base, capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stderr
        seen = json.loads(child.stdout)
    finally:
        shutil.rmtree(base)

    kind, message = seen["ensure"]
    assert kind == "UntrustedPath", seen["ensure"]
    assert f"is owned by uid {OTHER_UID}, not by you (uid {NOBODY}) or root" in message
    assert "HAMI_SLICE_ROOT" in message
    kind, message = seen["read_planted"]
    assert kind == "UntrustedPath" and f"evil.slice is owned by uid {OTHER_UID}" in message
    assert seen["read_own"] == ["ok", "good"]

    code, out, err = seen["status_planted"]
    assert code == 0 and out == ""
    assert f"warning: skipped slice folder {planted} is owned by uid {OTHER_UID}" in err
    code, out, err = seen["status_mine"]
    assert code == 0 and "hami slice 'good'" in out and "evil" not in out
    assert f"warning: skipped slice file {mine / 'evil.slice'} is owned by uid {OTHER_UID}" in err
    assert "Traceback" not in err
