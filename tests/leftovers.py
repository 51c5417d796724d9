"""No test leaves a process behind: a check over the whole pytest session (issue 39, item 14).

A stand-in ``hami-park`` loop left by one test spun for 14 minutes with no
parent while the rest of the suite ran, and a timing test on the same two
cores failed. So every session is checked: after each test, the processes
the tests started are noted with the test that was running; once the session
is over (every fixture torn down), those still alive fail the run, named
with their test files, and are ended.

Which processes are the tests': only ones started after the session began
(``/proc/<pid>/stat``'s start time), and of those only

- descendants of this pytest process (its children, theirs, ...), or
- processes whose environment carries :data:`MARKER` with this session's
  own token (set in ``os.environ`` at the start, so every child that inherits
  the environment carries it; the hub tests put it into their servers'
  environment too). A process that outlived its parent is reparented and is
  no descendant any more: the token is how it is still known.

Nothing else is looked at, so another user's processes, another pytest
session's (its token differs) and anything started before this session
are never blamed or ended. Zombies are dead already and are not counted.
A process is ended only after its start time is checked again.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

MARKER = "PYTEST_HAMI_SESSION"  # not HAMI_*: test helpers drop those from the environments they pass on
GRACE_S = 10.0  # what is on its way out (a killed process, a server stopping) gets this long
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

_session = {}  # "token", "since" (clock ticks since boot), "seen": {(pid, start): nodeid}


def token():
    """This session's token (the value of :data:`MARKER`), or None outside a session."""
    return _session.get("token")


def marker_env():
    """``{MARKER: token}`` for an environment built from nothing (empty outside a session)."""
    return {MARKER: _session["token"]} if "token" in _session else {}


def _uptime_ticks():
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * TICKS_PER_S)


def _stat(pid):
    """``(ppid, state, start ticks)`` of *pid*, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[1]), fields[0].decode(), int(fields[19])


def _carries(pid, mark):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in b"\0" + f.read()
    except OSError:
        return False


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(400).rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def ours(since=None, own=None, mark=None):
    """``{(pid, start ticks): command line}`` of the live processes this session
    started (see the module); *since*, *own*, *mark*: the session's start,
    pytest's PID and the environment entry to look for (tests pass their own)."""
    since = _session["since"] if since is None else since
    own = os.getpid() if own is None else own
    mark = (b"\0" + f"{MARKER}={_session['token']}".encode() + b"\0") if mark is None else mark
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                table[int(name)] = found
    found = {}
    for pid, (ppid, state, start) in table.items():
        if pid == own or start < since or state in ("Z", "X"):
            continue
        up, hops = ppid, 0
        while up not in (0, 1, own) and up in table and hops < 64:
            up, hops = table[up][0], hops + 1
        if up == own or _carries(pid, mark):
            found[(pid, start)] = _command(pid)
    return found


def end(processes):
    """SIGKILL each ``(pid, start ticks)`` that still started then."""
    for pid, start in processes:
        now = _stat(pid)
        if now is not None and now[2] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- the hooks (tests/conftest.py imports them) --------------------------------------


def pytest_sessionstart(session):
    _session.update(token=uuid.uuid4().hex, since=_uptime_ticks(), seen={})
    os.environ[MARKER] = _session["token"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    result = yield
    if "token" in _session:
        for key in ours():
            _session["seen"].setdefault(key, item.nodeid)
    return result


def pytest_sessionfinish(session, exitstatus):
    if "token" not in _session:
        return
    deadline = time.monotonic() + GRACE_S
    left = ours()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = ours()
    if not left:
        return
    seen = _session["seen"]
    by_file = {}
    for key, command in sorted(left.items()):
        where = seen.get(key, "(started after the last test)").split("::")[0]
        by_file.setdefault(where, []).append(f"pid {key[0]}: {command}")
    lines = [f"{where}: " + "; ".join(procs) for where, procs in sorted(by_file.items())]
    message = (f"{len(left)} process(es) started by the tests were still alive {GRACE_S:g} s after the "
               "session (ended now); each is named with the test file that was running when it was "
               "first seen:\n  " + "\n  ".join(lines))
    end(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True, bold=True)
        reporter.write_line(message)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
