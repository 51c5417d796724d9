"""The broker as a service: who may ask, one broker per socket, and how it stops."""

import os
import signal
import socket
import stat
import time

from broker_helpers import GiB, audit_of

from hami_jupyter import audit
from hami_jupyter.agent.protocol import parse_answer
from hami_jupyter.commands.cli import main as cli
from hami_jupyter.slice.broker_report import read_report

STOP_BOUND_S = 10  # the broker stops within a second or two; this only keeps a hang from hanging the suite


def ask_raw(path, line):
    """Send *line* from this process (which holds no slot) and read the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(path))
        conn.sendall(line)
        return conn.makefile("rb").readline().decode()


def test_only_a_process_of_a_slice_may_ask_and_only_within_its_limit(slices, client, start_broker,
                                                                     socket_path, gpu, root):
    uuid = gpu.uuid(0)
    slices.make("carol", "2g", "1g")
    asker = client(slices.env("carol"))
    start_broker()
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o666  # any local user may ask

    word, why = parse_answer(ask_raw(socket_path, f"ROOM {uuid} {GiB} {time.time_ns()}\n".encode()))
    assert word == "NO" and f"pid {os.getpid()} holds no live slot in a slice under {root}" in why
    # Asked again, the same refusal is not recorded again: nobody fills the audit log.
    assert ask_raw(socket_path, f"ROOM {uuid} {GiB} {time.time_ns()}\n".encode()).startswith("NO ")
    word, why = parse_answer(ask_raw(socket_path, b"GIVE ME EVERYTHING\n"))
    assert word == "NO" and why.startswith("malformed request")

    asker.ask("w", socket_path, uuid, 3 * GiB)  # more than carol's 2 GiB limit
    word, why = parse_answer(asker.final("w")[1])
    assert word == "NO" and "more than slice carol's 2.0 GiB limit" in why

    refused = audit_of(root, "broker-refused")
    assert [(r["requester"]["pid"], r["why"].split(":")[0]) for r in refused] == [
        (os.getpid(), f"pid {os.getpid()} holds no live slot in a slice under {root}"),
        (os.getpid(), "malformed request"),
        (asker.pid, "3.0 GiB is more than slice carol's 2.0 GiB limit on GPU " + uuid)]
    assert all(r["who"] == "hami-jupyter broker" for r in refused)
    assert audit.verify(audit.default_path(root)) == ([], [])


def test_a_stopped_broker_takes_its_socket_away(start_broker, socket_path, root):
    broker = start_broker()
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    second = start_broker(wait=False)  # one broker per socket
    assert second.wait(STOP_BOUND_S * 3) == 1
    assert f"another broker answers at {socket_path} already" in second.log()
    broker.signal(signal.SIGTERM)
    assert broker.wait(STOP_BOUND_S) == 0
    assert not socket_path.exists()  # a library that asks now finds no broker, and says so
    report = read_report(root)
    assert report["running"] is False and report["stale"] is True
    assert "SIGTERM received, stopping" in broker.log()


def test_sigint_stops_it_even_when_it_was_ignored_at_start(start_broker, socket_path):
    # A shell starting a background job, or a service manager, may leave SIGINT ignored.
    broker = start_broker(preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    with open(f"/proc/{broker.pid}/status") as f:
        ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGINT - 1))  # the broker set its own handler
    sent = time.monotonic()
    broker.signal(signal.SIGINT)
    assert broker.wait(STOP_BOUND_S) == 0
    print(f"stopped {time.monotonic() - sent:.2f} s after SIGINT")
    assert not socket_path.exists()


def test_usage_errors(capsys):
    assert cli(["broker", "--host-memory-reserve", "lots", "--min-idle-seconds", "-1", "--headroom", "half"]) == 2
    err = capsys.readouterr().err
    assert "--host-memory-reserve:" in err and "--min-idle-seconds -1" in err
    assert "--headroom: invalid size 'half'" in err
