"""What the tests that start a real server on loopback (JupyterHub, JupyterLab) share.

Free ports, JSON requests with a token, the tail of the server's log, and the
processes of a run, found again by a tag in their environment: a server
starts proxies, servers and kernels of its own, some of which outlive it or
get re-parented to init. Every one inherits the environment, so a per-run tag
variable finds them all in /proc, whoever their parent is now, and the test
can end them and say which were left.
"""

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

# No proxy from the environment: every request here goes to loopback.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_ports(count):
    """*count* distinct loopback ports that were free a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def request_json(method, url, token, body=None, timeout=30):
    """``(status, parsed JSON or text)`` of *url*; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _opener.open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def log_tail(path, chars, what):
    """The last *chars* characters of a server's log, for a failure message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {what} log)"
    return f"--- last {min(chars, len(text))} characters of {path} ---\n" + text[-chars:]


def tagged_processes(variable, tag):
    """PIDs of live (not zombie) processes whose environment has ``variable=tag``."""
    needle = f"{variable}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != b"Z":
            found.append(int(entry))
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def end_tagged(variable, tag, grace=0.0):
    """Wait up to *grace* s for the tagged processes to end by themselves, then
    end the rest (SIGTERM, then SIGKILL, 3 s each). Returns ``[(pid, cmdline)]``
    of those that were still alive after the grace: a test fails on them."""
    deadline = time.monotonic() + grace
    while tagged_processes(variable, tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(pid, cmdline(pid)) for pid in tagged_processes(variable, tag)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = tagged_processes(variable, tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while tagged_processes(variable, tag) and time.monotonic() < deadline:
            time.sleep(0.1)
    return left
