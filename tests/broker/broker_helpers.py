"""Helpers of the broker's tests (the fixtures are in conftest.py).

* ``BrokerProcess``: ``hami-jupyter broker`` as a child process, its report and its log;
* ``RoomClient``: tests/broker/room_client.py under the preload library in a
  slice, asking the broker for room over its socket;
* ``age``: make a process look idle for so many seconds (its slot's last GPU call);
* ``park_state_of``, ``audit_of``, ``wait_for``.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from native_helpers import DEFAULT_TIMEOUT, slot_of

from hami_jupyter import audit
from hami_jupyter.slice.broker_report import read_report
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import HAMI_PARK_PARKED, HAMI_PARK_RUNNING, HamiSlot, slot_offset

REPO = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).resolve().parent / "room_client.py"
MiB = 1 << 20
GiB = 1 << 30
START_TIMEOUT = 60
TICKS_S = 0.08  # a few of the parking thread's 20 ms ticks


class BrokerProcess:
    """``python -m hami_jupyter broker --root ROOT ...`` running as a child process."""

    def __init__(self, argv, env, root, socket_path, log_path, preexec_fn=None):
        self.root, self.socket = root, socket_path
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=preexec_fn)

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        if not self._log.closed:
            self._log.flush()
        return Path(self.log_path).read_text(errors="replace")

    def report(self):
        try:
            return read_report(self.root)
        except Exception:  # being replaced right now
            return None

    def wait_report(self, predicate=lambda r: True, timeout=DEFAULT_TIMEOUT, what="a report"):
        """The first report of this broker for which *predicate* holds."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the broker exited ({self.proc.returncode}) waiting for {what}:\n"
                                     f"{self.log()[-4000:]}")
            last = self.report()
            if last and last.get("broker_pid") == self.proc.pid and last.get("running") and predicate(last):
                return last
            time.sleep(0.05)
        raise AssertionError(f"{what} not written within {timeout} s; last report: "
                             f"{json.dumps(last)[:3000]}\nbroker log:\n{self.log()[-4000:]}")

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is not None and not self._log.closed:
                self._log.close()

    def kill(self):
        """SIGKILL the broker alone (a park it started goes on in its hami-park)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def teardown(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()


class RoomClient:
    """room_client.py running in a slice; ``ask`` sends a request, ``lines`` reads the answers."""

    def __init__(self, env, stderr_path):
        self._stderr = open(stderr_path, "wb")
        self.stderr_path = stderr_path
        self.proc = subprocess.Popen([sys.executable, str(CLIENT)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
        self.pid = self.proc.pid
        self._events = queue.Queue()
        self._pending = {}  # name -> events read but not asked for yet
        self.tickets = {}  # name -> the ticket of its OK (the grant in the room ledger)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._events.put(json.loads(line))
        self._events.put(None)

    def stderr(self):
        self._stderr.flush()
        return Path(self.stderr_path).read_text(errors="replace")

    def send(self, line):
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _next(self, name, timeout):
        pending = self._pending.setdefault(name, [])
        deadline = time.monotonic() + timeout
        while not pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"room client {self.pid}: nothing for {name!r} within {timeout} s; "
                                     f"stderr:\n{self.stderr()[-3000:]}")
            try:
                event = self._events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if event is None:
                raise AssertionError(f"room client {self.pid} ended; stderr:\n{self.stderr()[-3000:]}")
            key = event["name"] if event["op"] == "ask" else event["op"]
            self._pending.setdefault(key, []).append(event)
        return pending.pop(0)

    def init(self, device=0):
        self.send(f"init {device}")
        self._next("init", DEFAULT_TIMEOUT)

    def ask(self, name, socket_path, uuid, size, since=None):
        """Send a request on a new connection; returns its since (Unix ns)."""
        since = time.time_ns() if since is None else since
        self.send(f"ask {name} {socket_path} {uuid} {size} {since}")
        return since

    def line(self, name, timeout=DEFAULT_TIMEOUT):
        """The next answer line of connection *name* ("closed" when the broker closed it)."""
        event = self._next(name, timeout)
        if event.get("error"):
            raise AssertionError(f"request {name}: {event['error']}")
        return "closed" if event.get("closed") else event["line"]

    def final(self, name, timeout=DEFAULT_TIMEOUT):
        """``(lines before, final answer)``: the BUSY lines, then OK/NO (or "closed").
        An ``OK <made> <ticket>`` is given as ``OK <made>``: the ticket, which names
        the room granted in the room ledger, is kept in :attr:`tickets`."""
        before = []
        while True:
            line = self.line(name, timeout)
            if not line.startswith("BUSY"):
                if line.startswith("OK "):
                    words = line.split(" ")
                    assert len(words) == 3 and words[2].isdigit() and int(words[2]), \
                        f"an OK names its grant's ticket: {line!r}"
                    self.tickets[name] = int(words[2])
                    line = " ".join(words[:2])
                return before, line
            before.append(line)

    def close(self, name):
        self.send(f"close {name}")
        self._next("close", DEFAULT_TIMEOUT)

    def churn(self, socket_path, uuid, size, seconds):
        """Connect, send a request and close at once, for *seconds*; how many were sent."""
        self.send(f"churn {socket_path} {uuid} {size} {seconds}")
        return self._next("churn", seconds + DEFAULT_TIMEOUT)["count"]

    def teardown(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self._stderr.close()


def slot(path, pid):
    found = slot_of(read_snapshot(path), pid)
    assert found is not None, f"process {pid} has no live slot in {path}"
    return found


def age(path, pid, seconds, since_ns):
    """Make process *pid* look idle for *seconds*: its slot's last GPU call is
    moved back. *since_ns*: when its last command was sent. Its parking thread
    records calls at its next tick (every 20 ms), so the record is moved back
    once that thread has recorded the command's last call (the figure is at or
    after *since_ns* and stays put for a few ticks), and again if a late tick
    wrote over it."""
    index = slot(path, pid).index
    at = slot_offset(index) + HamiSlot.gpu_active_unix_ns.offset
    deadline = time.monotonic() + DEFAULT_TIMEOUT
    while time.monotonic() < deadline:
        seen = slot(path, pid).gpu_active_unix_ns
        time.sleep(TICKS_S)
        if seen < since_ns or slot(path, pid).gpu_active_unix_ns != seen:
            continue  # the command's calls are not all recorded yet
        when = time.time_ns() - int(seconds * 1e9)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(when.to_bytes(8, "little"))
        time.sleep(TICKS_S)
        if slot(path, pid).gpu_active_unix_ns == when:
            return
    raise AssertionError(f"process {pid}'s last GPU call could not be moved back within {DEFAULT_TIMEOUT} s")


def parked(path, pid):
    s = slot(path, pid)
    return s.park_state == HAMI_PARK_PARKED


def running(path, pid):
    return slot(path, pid).park_state == HAMI_PARK_RUNNING


def audit_of(root, *actions):
    """The audit log's records of these actions (all of them without any)."""
    found = audit.read_records(audit.default_path(root))
    return [r for r in found if not actions or r.get("action") in actions]


class HeldPark:
    """What :func:`held_park_tool` made: ``folder`` (HAMI_NATIVE_DIR), the files
    ``go`` and ``began``; unpacks as ``folder, go, began``. :meth:`release` lets
    every held park go on and waits until each stand-in it held has ended."""

    def __init__(self, folder, go, began, pids):
        self.folder, self.go, self.began, self._pids = folder, go, began, pids

    def __iter__(self):
        return iter((self.folder, self.go, self.began))

    def release(self, timeout=30.0):
        """Touch ``go``, then wait for the stand-ins that were holding (each
        says its PID in ``held-pids``) to end, so that none outlives its test
        (one whose agent was killed has no parent to end it; a passed test's
        folder, ``go`` included, is removed at its teardown). One still there
        after *timeout* is killed."""
        self.go.touch()
        try:
            pids = [int(p) for p in self._pids.read_text().split()]
        except FileNotFoundError:
            return
        deadline = time.monotonic() + timeout
        for pid in pids:
            while _runs_stand_in(pid, self.folder):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.02)


def _runs_stand_in(pid, folder):
    """Whether *pid* is still the stand-in hami-park of *folder* (not ended, not another program now)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return str(folder).encode() in f.read()
    except OSError:
        return False


def held_park_tool(tmp_path, pid, once=False):
    """A folder laid out like native/build/ (HAMI_NATIVE_DIR) whose hami-park
    holds a park of process *pid* until the file ``go`` is there (it says it
    began with the file ``began``): a park that takes as long as the test needs.
    *once*: only the first park of *pid* is held; later ones go at once.
    A :class:`HeldPark`; call its ``release()`` when done. A stand-in also
    gives up (failing its park) once its folder is gone or after
    :data:`HELD_AT_MOST_S`, so that none is ever left looping."""
    import shlex

    from hami_jupyter import native

    folder = tmp_path / "held-native"
    folder.mkdir()
    real = native.park_tool_path()
    tool = folder / "hami-park"
    go, began, first, pids = tmp_path / "go", tmp_path / "began", tmp_path / "first-park", folder / "held-pids"
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    rounds = int(HELD_AT_MOST_S / 0.02)
    tool.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = park ] && [ "$3" = {pid} ]' + (f" && [ ! -e {q(first)} ]" if once else "") + "; then\n"
        f"  echo $$ >> {q(pids)}\n"
        f"  : > {q(first)}\n"
        f"  : > {q(began)}\n"
        "  n=0\n"
        f"  while [ ! -e {q(go)} ]; do\n"
        f"    [ -d {q(folder)} ] && [ $n -lt {rounds} ] || {{ echo 'error 999 the test let this park go'; exit 1; }}\n"
        "    n=$((n + 1)); sleep 0.02\n"
        "  done\n"
        "fi\n"
        f'exec {q(real)} "$@"\n')
    tool.chmod(0o755)
    return HeldPark(folder, go, began, pids)


HELD_AT_MOST_S = 180.0  # a held park no test lets go of ends by itself after this


def failing_park_tool(tmp_path, pid):
    """A folder laid out like native/build/ (HAMI_NATIVE_DIR) whose hami-park
    fails every park of process *pid* as a driver would (its checkpoint refused)."""
    import shlex

    from hami_jupyter import native

    folder = tmp_path / "failing-native"
    folder.mkdir()
    tool = folder / "hami-park"
    tool.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = park ] && [ "$3" = {pid} ]; then\n'
        f'  echo "error 999 checkpoint of process {pid} failed; it runs on, unparked"; exit 1\n'
        "fi\n"
        f'exec {shlex.quote(str(native.park_tool_path()))} "$@"\n')
    tool.chmod(0o755)
    return folder


def broker_env(gpu, **extra):
    """The broker's environment: the simulated GPU, this checkout first on the path."""
    env = gpu.env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env
