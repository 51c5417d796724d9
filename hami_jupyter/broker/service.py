"""``hami-jupyter broker``: start-up checks, the socket, the signals, the loop.

Start-up refuses, with one line saying why, when the slice root is missing
or cannot be trusted, when NVML does not start (a broker that cannot measure
room cannot make it), or when another broker answers on the socket already.
It warns, and runs on, when the driver cannot park processes (it then only
says ``OK`` when room is there, and why it cannot make room otherwise), and
when it is not root (it can then park only its own user's kernels).

SIGTERM and SIGINT stop it, whatever they were set to when it started (a
service manager, or a shell that ignores SIGINT for background jobs): the
socket is removed, waiting requesters see their connection close (they ask
again, the next broker serves them), and it exits within a second or two.
A park under way is the driver's and ``hami-park``'s: it finishes, or is
undone by the parked process (docs/parking.md, "Faults").
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import threading

from ..guard.nvml import NvmlUnavailable
from ..slice.paths import UntrustedPath, check_folder, root_problem
from ..slice.size import format_size
from .. import audit
from . import protocol
from .headroom import Keeper
from .parker import Parker
from .report import Reporter
from .room import Room
from .server import Broker, listening_socket

DEFAULT_MIN_IDLE_S = 60.0
DEFAULT_HOST_RESERVE = "2g"
ACCEPT_POLL_S = 0.2  # how soon a signal is acted on

log = logging.getLogger("hami_jupyter.broker")


class BrokerStartError(RuntimeError):
    """The broker cannot do its job here; the message says why and what to do."""


def _check_root(root):
    problem = root_problem(root, ": no slice to make room in yet (the hub makes it; or give --root)")
    if problem:
        raise BrokerStartError(problem)


def _check_socket(path):
    """Refuse to start when another broker answers at *path*, or when its folder
    is one another user could change (they could put their own socket there);
    a socket left by a broker that died is replaced."""
    try:
        check_folder(path.parent)
    except (OSError, UntrustedPath) as e:
        raise BrokerStartError(f"the socket's folder {path.parent} cannot be used: {e}") from None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return
    except OSError as e:
        raise BrokerStartError(f"cannot use the socket {path}: {e.strerror or e}") from None
    finally:
        probe.close()
    raise BrokerStartError(f"another broker answers at {path} already: one broker per node")


def main(root, *, min_idle=DEFAULT_MIN_IDLE_S, host_reserve, headroom=0, audit_path=None, socket_path=None):
    """``hami-jupyter broker``: returns the exit status, or raises BrokerStartError.
    *headroom*: bytes kept free on each GPU by parking idle kernels before
    anyone asks (:mod:`.headroom`); 0: parks only for a request."""
    _check_root(root)
    socket_path = socket_path or protocol.socket_path(root)
    _check_socket(socket_path)
    room = Room()
    try:
        room.start()
    except NvmlUnavailable as e:
        raise BrokerStartError(f"cannot see the GPUs: {e}") from None
    if os.geteuid() != 0:
        log.warning("broker: not running as root (uid %d): it can park only this user's kernels "
                    "(docs/broker.md)", os.geteuid())
    cannot_park = Parker.why_not_here()
    if cannot_park:
        log.warning("broker: cannot park here (%s): it answers OK when a GPU has the room, and NO "
                    "otherwise", cannot_park)
    broker = Broker(root, room=room, parker=Parker(host_reserve), min_idle=min_idle,
                    audit_path=audit_path or audit.default_path(root), cannot_park=cannot_park)

    def stopping(signum, frame):
        log.info("broker: %s received, stopping", signal.Signals(signum).name)
        broker.stop.set()

    # Set explicitly: a SIGINT ignored by whoever started us must still stop us.
    previous = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = listening_socket(socket_path)
        made = os.stat(socket_path).st_ino
    except OSError as e:
        for s, handler in previous.items():
            signal.signal(s, handler)
        raise BrokerStartError(f"cannot listen at {socket_path}: {e.strerror or e}") from None
    reporter = Reporter(broker, root, socket_path=socket_path, host_reserve=host_reserve)
    writer = threading.Thread(target=reporter.run, name="broker-report", daemon=True)
    writer.start()
    if headroom:
        # A park under way when the broker stops is hami-park's to finish, as a request's is.
        broker.keeper = Keeper(broker, headroom)
        threading.Thread(target=broker.keeper.run, name="broker-headroom", daemon=True).start()
    log.info("broker: making room at %s for the slices under %s: parks kernels idle for %g s, "
             "keeps %s of host memory free, %s, audit log %s", socket_path, root, min_idle,
             format_size(host_reserve),
             f"a headroom of {format_size(headroom)} kept free on each GPU" if headroom
             else "no headroom (parks only when asked)",
             broker.decisions.audit_path)
    try:
        _accept(server, broker)
    finally:
        broker.stop.set()
        server.close()
        _remove(socket_path, made)
        broker.queues.wake()
        broker.changed.set()
        broker.served.set()  # the headroom keeper sees the stop now
        writer.join(2.0)
        reporter.write(running=False)
        for s, handler in previous.items():
            signal.signal(s, handler)
    log.info("broker: stopped")
    return 0


def _accept(server, broker):
    poller = select.poll()
    poller.register(server, select.POLLIN)
    while not broker.stop.is_set():
        if not poller.poll(ACCEPT_POLL_S * 1000):
            continue
        try:
            conn, _ = server.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue
        broker.accept(conn)


def _remove(path, made):
    """Remove the socket (inode *made*), unless another broker has put its own there since."""
    try:
        if os.stat(path).st_ino == made:
            os.unlink(path)
    except OSError:
        pass
