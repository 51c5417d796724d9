"""The session check of leftovers.py: a test that leaves a process behind fails the run (issue 39, item 14).

An inner pytest session runs with the check: one test leaves a ``sleep``
behind as its child, another one orphaned (its parent gone, reparented away
from pytest, known by its environment only). The session fails, names both
test files, and the two processes are ended. A process started meanwhile by
someone else (here: this outer test) is neither named nor ended.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CHILD = textwrap.dedent("""
    import subprocess

    def test_leaves_a_child():
        subprocess.Popen(["sleep", "67"])
""")
ORPHAN = textwrap.dedent("""
    import os, subprocess, time
    from pathlib import Path

    def test_leaves_an_orphan():
        # the sleep's parent ends at once: it is no descendant of pytest any more
        subprocess.run(["sh", "-c", "sleep 68 & exit 0"], check=True)
        Path(os.environ["STARTED"]).touch()
        while not Path(os.environ["GO"]).exists():
            time.sleep(0.05)
""")


def _alive(argv):
    """PIDs of live processes whose command line is *argv*."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:-1] == [a.encode() for a in argv]:
                    with open(f"/proc/{name}/stat", "rb") as s:
                        if s.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(name))
        except OSError:
            pass
    return found


def test_a_session_whose_tests_leave_processes_fails_naming_their_files(tmp_path):
    (tmp_path / "test_child.py").write_text(CHILD)
    (tmp_path / "test_orphan.py").write_text(ORPHAN)
    started, go = tmp_path / "started", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(TESTS), STARTED=str(started), GO=str(go))
    env.pop("PYTEST_HAMI_SESSION", None)  # the inner session has a token of its own
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "leftovers", "-p", "no:cacheprovider",
                              "test_child.py", "test_orphan.py"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    unrelated = None
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert inner.poll() is None and time.monotonic() < deadline, inner.stdout.read()
            time.sleep(0.05)
        # Started while the inner session runs, by someone else: not its business.
        unrelated = subprocess.Popen(["sleep", "69"], env={k: v for k, v in env.items() if k != "STARTED"})
        go.touch()
        out, _ = inner.communicate(timeout=120)
        assert inner.returncode == 1, out
        assert "processes left behind" in out and "2 process(es)" in out, out
        assert "test_child.py: pid" in out and "sleep 67" in out, out
        assert "test_orphan.py: pid" in out and "sleep 68" in out, out
        assert "sleep 69" not in out and str(unrelated.pid) not in out, out
        assert "2 passed" in out, out
        assert not _alive(["sleep", "67"]) and not _alive(["sleep", "68"])  # ended by the check
        assert unrelated.poll() is None, "the check ended a process that was not its session's"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        if unrelated is not None:
            unrelated.kill()
            unrelated.wait()
