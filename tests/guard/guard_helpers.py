"""Helpers of the guard's tests (the fixtures are in conftest.py).

* ``Slices``: slice files under a test's root and the environment of a
  process in one, with the preload library or without it (a bypass);
* ``Guard``: ``hami-jupyter guard`` running as a child process, its reports
  and its log;
* ``audit_records``, ``guard_env``, ``wait_dead``, ``wait_exec``.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from native_helpers import slice_env

from hami_jupyter import audit
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.guard_report import read_report
from hami_jupyter.slice.settings import resolve_limits

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GiB = 1 << 30
CONTEXT = 64 * MiB  # the simulated GPU's context, and the library's charge for one here
GUARD_START_TIMEOUT = 60
KILL_WITHIN_S = 2.0  # from the allocation that passes the cap to the process's end


class Slices:
    def __init__(self, gpu, root):
        self.gpu, self.root = gpu, root

    def path(self, name):
        return self.root / f"{name}.slice"

    def make(self, name, memory="1g"):
        path = self.path(name)
        ensure_slice(path, name, resolve_limits({"memory_limit": memory}, {}))
        return path

    def env(self, name, preload=True, **extra):
        if preload:
            return slice_env(self.gpu, self.path(name), limit=None, overhead="64m", **extra)
        return self.gpu.env(HAMI_SLICE=str(self.path(name)), **extra)


def audit_records(root, *actions):
    """The audit log's records of these actions (all of them without any)."""
    found = audit.read_records(audit.default_path(root))
    return [r for r in found if not actions or r.get("action") in actions]


class Guard:
    """A guard running as a child process."""

    def __init__(self, args, env, root, log_path):
        self.root = root
        self.env = env
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def log(self):
        if not self._log.closed:
            self._log.flush()
        return Path(self.log_path).read_text(errors="replace")

    def report(self):
        return read_report(self.root)

    def wait_report(self, predicate=lambda r: True, timeout=10.0, what="a report"):
        """The first report written by this guard for which *predicate* holds."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the guard exited ({self.proc.returncode}) waiting for "
                                     f"{what}:\n{self.log()[-4000:]}")
            try:
                last = self.report()
            except Exception:  # being replaced right now: the next look sees the new one
                last = None
            if last and last.get("guard_pid") == self.proc.pid and predicate(last):
                return last
            time.sleep(0.05)
        raise AssertionError(f"{what} not written within {timeout} s; last report: "
                             f"{json.dumps(last)[:3000]}\nguard log:\n{self.log()[-4000:]}")

    def rounds(self, n, timeout=20.0):
        """Wait until this guard has written *n* more reports; returns the last."""
        seen = self.wait_report(timeout=timeout)["written_unix"]
        for _ in range(n):
            seen = self.wait_report(lambda r, s=seen: r["written_unix"] > s, timeout)["written_unix"]
        return self.report()

    def stop(self, timeout=20.0):
        """SIGTERM, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()


def guard_env(gpu, **extra):
    """The guard's environment: the simulated GPU, this checkout first on the path."""
    env = gpu.env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def wait_dead(it, timeout):
    """Seconds until cudrive *it* died (fails after *timeout*)."""
    began = time.monotonic()
    while it.proc.poll() is None:
        if time.monotonic() - began > timeout:
            raise AssertionError(f"pid {it.pid} still alive after {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - began


def wait_exec(child, program, timeout=10.0):
    """Wait until *child* (a Popen) runs *program*: before its exec, /proc shows
    the forked copy of our own environment, not the one it was given."""
    import shutil

    want = os.path.realpath(shutil.which(program))
    deadline = time.monotonic() + timeout

    def started():
        # The new program's file comes first, its environment a moment later.
        if os.path.realpath(f"/proc/{child.pid}/exe") != want:
            return False
        with open(f"/proc/{child.pid}/environ", "rb") as f:
            return bool(f.read())

    while not started():
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {child.pid} did not start {program} within {timeout} s")
        time.sleep(0.005)
    return child
