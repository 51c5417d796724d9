"""``hami-jupyter agent``: start-up checks, the threads, the signals.

The agent runs the guard's policy, the room policy (the memory broker), or
both (``hami-jupyter guard`` and ``hami-jupyter broker`` are the agent with
one of them on), over one :class:`~.facts.look.Node`, one
:class:`~.actor.Actor` and one :class:`~.records.Records`:

- the watch (:mod:`.watch`) looks at the node every interval, in a thread of
  its own: with the guard on it judges, acts and writes ``guard.json``;
  either way its looks are how the agent learns who uses the GPU;
- with the room policy on: the socket (:mod:`.server`, the main thread), a
  thread per connection (:mod:`.rooms`), the headroom keeper
  (:mod:`.headroom`: ``--headroom``, else the ``--reserve``), and the room
  ledger (:mod:`.ledger`, every half second and at once when a queue
  changes) and ``broker.json`` (every second), written by one thread.

Start-up refuses, with one line saying why (exit status 1), when the slice
root is missing or cannot be trusted, when NVML does not start (an agent that
cannot see the GPUs holds no cap and measures no room), or, with the room
policy on, when the socket's folder cannot be trusted or another agent
answers on the socket already. It warns, and runs on, when the driver cannot
park processes (the guard then ends instead of parking; the broker answers
``OK`` when the room is there and ``NO`` otherwise) and when it is not root
(it can then act on its own user's processes only).

SIGTERM and SIGINT stop it, whatever they were set to when it started (a
service manager, or a shell that ignores SIGINT for background jobs): the
socket is removed, waiting requesters see their connection close (they ask
again; the next agent serves them), and it exits within a second or two. A
park under way is the driver's and ``hami-park``'s: it finishes, or is undone
by the parked process (docs/parking.md, "Faults").
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import threading
import time
from pathlib import Path

from .. import audit
from ..slice.broker_report import WRITE_INTERVAL_S, write_report
from ..slice.parking import checkpoint_api
from ..slice.paths import UntrustedPath, check_folder, root_problem
from ..slice.size import format_size
from . import protocol
from .actor import Actor
from .facts.look import Node
from .facts.nvml import NvmlUnavailable
from .guard.policy import DEFAULT_TOLERANCE
from .headroom import Keeper
from .ledger import Ledger, LedgerError, ledger_path
from .records import Records
from .room import report as room_report
from .rooms import Rooms
from .server import Server, listening_socket
from .watch import DEFAULT_INTERVAL, KILL, PARK, ReportFile, Watch

DEFAULT_MIN_IDLE_S = 60.0
DEFAULT_HOST_RESERVE = "2g"
DEFAULT_RESERVE = 256 << 20
LEDGER_INTERVAL_S = 0.5

log = logging.getLogger("hami_jupyter.agent")


class AgentStartError(RuntimeError):
    """The agent cannot do its job here; the message says why and what to do."""


def _check_root(root, guard):
    what = ": nothing to guard yet" if guard else ": no slice to make room in yet"
    problem = root_problem(root, f"{what} (the hub makes it; or give --root)")
    if problem:
        raise AgentStartError(problem)


def _check_socket(path):
    """Refuse to start when another agent answers at *path*, or when its folder
    is one another user could change (they could put their own socket there);
    a socket left by an agent that died is replaced."""
    try:
        check_folder(path.parent)
    except (OSError, UntrustedPath) as e:
        raise AgentStartError(f"the socket's folder {path.parent} cannot be used: {e}") from None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return
    except OSError as e:
        raise AgentStartError(f"cannot use the socket {path}: {e.strerror or e}") from None
    finally:
        probe.close()
    raise AgentStartError(f"another broker answers at {path} already: one agent per node")


def _more_files():
    """One open slice file per slice is kept between looks, and a socket per
    request: raise the soft limit on open files to the hard one (systemd's
    default soft limit is 1024)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 16), hard))
    except (ValueError, OSError):
        pass


class _RoomReport:
    """Writes the room ledger every half second and ``broker.json`` every second
    (both at once when a queue changes) until the agent stops; a write that
    fails is logged once."""

    def __init__(self, rooms, root, keeper, **settings):
        self.rooms, self.keeper, self.settings = rooms, keeper, settings
        self._write = ReportFile(write_report, root, "broker")

    def write(self, running=True):
        rooms, keeper = self.rooms, self.keeper
        held = [r for r in rooms.actor.held.values() if r.get("for") == "room"]
        report = room_report.build(
            queues=rooms.view(), decisions=rooms.records.latest(), granted=rooms.granted_view(),
            headroom_view=keeper.view() if keeper is not None else {},
            min_idle=rooms.min_idle, cannot_park=rooms.cannot_park, held=held, running=running,
            errors=list(rooms.node.look(within=WRITE_INTERVAL_S * 2).errors) + list(rooms.records.errors),
            reserve=rooms.reserve, **self.settings)
        self._write(report)

    def run(self):
        rooms = self.rooms
        last_report = 0.0
        while not rooms.stop.is_set():
            rooms.changed.clear()
            try:
                rooms.publish()
            except Exception:  # a ledger write that fails says so, and the next one is tried
                log.exception("broker: the room ledger could not be written")
            now = time.monotonic()
            if now - last_report >= WRITE_INTERVAL_S or rooms.changed.is_set():
                self.write()
                last_report = now
            rooms.changed.wait(LEDGER_INTERVAL_S)
            if rooms.changed.is_set():
                time.sleep(0.02)  # a burst of changes: one write for it


def main(root, *, guard=True, room=True, interval=DEFAULT_INTERVAL, action=PARK, once=False,
         tolerance=DEFAULT_TOLERANCE, audit_path=None, min_idle=DEFAULT_MIN_IDLE_S, host_reserve=0, headroom=0,
         reserve=DEFAULT_RESERVE, socket_path=None, reader=None):
    """``hami-jupyter agent`` (*guard* and *room*: the policies on); returns the
    exit status, or raises AgentStartError. *once*: one look of the guard, then
    exit (no socket)."""
    root = Path(root)
    room = room and not once
    _check_root(root, guard)
    if room:
        socket_path = Path(socket_path) if socket_path else protocol.socket_path(root)
        _check_socket(socket_path)
    node = Node(root, reader=reader)
    try:
        node.start()
    except NvmlUnavailable as e:
        raise AgentStartError(f"cannot see the GPUs: {e}") from None
    if os.geteuid() != 0:
        log.warning("agent: not running as root (uid %d): it can read the environment of, park and end only "
                    "this user's processes; other users' processes over their caps are reported but not "
                    "acted on, and only this user's kernels are parked for room (docs/guard.md).", os.geteuid())
    _more_files()
    cannot_park = checkpoint_api()
    if guard and action == PARK and cannot_park is not None:
        log.warning("guard: cannot park here (%s): processes over their caps are ended instead "
                    "(--action kill)", cannot_park)
        action = KILL
    if room and cannot_park:
        log.warning("broker: cannot park here (%s): it answers OK when a GPU has the room, and NO "
                    "otherwise", cannot_park)
    records = Records(Path(audit_path) if audit_path else audit.default_path(root))
    actor = Actor(host_reserve)
    watch = Watch(root, node, actor, records, interval=interval, guard=guard, action=action, tolerance=tolerance)
    watch.start()
    stop = threading.Event()
    rooms = None
    if room:
        try:
            ledger = Ledger(ledger_path(socket_path))
        except LedgerError as e:
            node.close()
            raise AgentStartError(str(e)) from None
        rooms = Rooms(root, node, actor, records, min_idle=min_idle, cannot_park=cannot_park, ledger=ledger,
                      reserve=reserve, over_tolerance=tolerance if guard else None)
        stop = rooms.stop

    def stopping(signum, frame):
        log.info("agent: %s received, stopping", signal.Signals(signum).name)
        stop.set()

    # Set explicitly: a SIGINT ignored by whoever started us must still stop us.
    previous = {s: signal.signal(s, stopping) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if guard:
            log.info("guard: watching %s every %g s, action %s, default tolerance %s, audit log %s", root,
                     interval, action, format_size(tolerance), records.audit_path)
        if rooms is None:
            watch.run(stop, once=once)
        else:
            _serve(rooms, watch, stop, socket_path, root, host_reserve, headroom, interval)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if rooms is not None:
            rooms.ledger.close()
        node.close()
    log.info("agent: stopped")
    return 0


def _serve(rooms, watch, stop, socket_path, root, host_reserve, headroom, interval):
    """The room policy's socket and threads beside the watch, until *stop*."""
    try:
        listening = listening_socket(socket_path)
        made = os.stat(socket_path).st_ino
    except OSError as e:
        raise AgentStartError(f"cannot listen at {socket_path}: {e.strerror or e}") from None
    threads = [threading.Thread(target=watch.run, args=(stop,), name="agent-watch", daemon=True)]
    # The keeper keeps the headroom, or without one the reserve: the GPU never
    # fills, so that a checkpoint always has room. A park under way when the
    # agent stops is hami-park's to finish, as a request's is.
    keeper = Keeper(rooms, max(headroom, rooms.reserve)) if (headroom or rooms.reserve) else None
    if keeper is not None:
        threads.append(threading.Thread(target=keeper.run, name="agent-headroom", daemon=True))
    reporter = _RoomReport(rooms, root, keeper, socket_path=socket_path, host_reserve=host_reserve,
                           headroom=headroom)
    threads.append(threading.Thread(target=reporter.run, name="agent-room-report", daemon=True))
    # The settings first: the threads' first words (a headroom short, say) come after them.
    log.info("broker: making room at %s for the slices under %s: parks kernels idle for %g s, "
             "keeps %s of host memory free, %s kept free on each GPU for parks, %s, room ledger %s, "
             "audit log %s", socket_path, root, rooms.min_idle, format_size(host_reserve),
             format_size(rooms.reserve),
             f"a headroom of {format_size(headroom)} kept free on each GPU" if headroom
             else "no headroom (parks only when asked)", rooms.ledger.path, rooms.records.audit_path)
    for t in threads:
        t.start()
    try:
        Server(listening, rooms).run()
    finally:
        stop.set()
        listening.close()
        _remove(socket_path, made)
        rooms.queues.wake()
        rooms.changed.set()
        rooms.served.set()  # the headroom keeper sees the stop now
        for t in threads:
            t.join(max(2.0, 2 * interval))
        reporter.write(running=False)


def _remove(path, made):
    """Remove the socket (inode *made*), unless another agent has put its own there since."""
    try:
        if os.stat(path).st_ino == made:
            os.unlink(path)
    except OSError:
        pass
