"""The hub's services end at once when the hub stops them (issue 27, item 5).

JupyterHub stops a managed service with SIGINT, then SIGTERM after a grace
period. A hub started in the background by a script has SIGINT ignored, and
its children inherit that: Python then installs no SIGINT handler of its own,
so a service that counts on KeyboardInterrupt never ends at SIGINT. Each
service is started here as such a child (SIGINT ignored) and must exit 0
within 2 s of either signal (the hub's own stop budget is seconds).

The hub view talks to a "hub" that accepts connections and never answers, so
a refresh is in flight when the signal comes: stopping must not wait for it.
"""

import grp
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from local_servers import free_ports

STOP_WITHIN_S = 2.0
START_TIMEOUT_S = 30.0


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_until(ready, proc, what):
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} at start-up: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not start within {START_TIMEOUT_S} s")
        time.sleep(0.05)


def _stops_cleanly(proc, signum):
    """Send *signum*; the service must exit 0 within STOP_WITHIN_S, with no
    traceback. Returns its output."""
    proc.send_signal(signum)
    try:
        out, _ = proc.communicate(timeout=STOP_WITHIN_S)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        status = None
    assert status == 0, f"{signum.name}: exit status {status} (None: still running after " \
                        f"{STOP_WITHIN_S} s)\n{out}"
    assert "Traceback" not in out, out
    return out


def _ended(proc):
    """Whatever happened, the service is not left running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
def silent_hub():
    """A port that accepts connections and never answers: a hub that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_hub_view_ends_at_once_with_sigint_ignored_by_its_parent(tmp_path, silent_hub, signum):
    (port,) = free_ports(1)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JUPYTERHUB_API_TOKEN": "t",
           "JUPYTERHUB_API_URL": f"http://127.0.0.1:{silent_hub}/hub/api",
           "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
           "HAMI_SLICE_ROOT": str(tmp_path / "slices")}
    proc = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "hub-service", "--refresh=0.2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ignore_sigint)
    try:
        def serving():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        _wait_until(serving, proc, "hami-jupyter hub-service")
        time.sleep(0.3)  # its first refresh now waits on the silent hub
        _stops_cleanly(proc, signum)
    finally:
        _ended(proc)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_admin_service_ends_at_once_with_sigint_ignored_by_its_parent(tmp_path, signum):
    if os.geteuid() != 0:
        pytest.skip("the admin service runs as root only")
    group = grp.getgrgid(os.getegid()).gr_name
    sock = tmp_path / "admin.sock"
    proc = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "admin-service",
                             "--root", str(tmp_path), "--admin-group", group, "--socket", str(sock)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ignore_sigint)
    try:
        _wait_until(sock.exists, proc, "hami-jupyter admin-service")
        _stops_cleanly(proc, signum)
    finally:
        _ended(proc)
    assert not sock.exists(), "the service left its socket behind"
