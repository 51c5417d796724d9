"""The agent's socket: who asks, each user's share of it, and every request's time.

Any local user may connect (the socket is 0666 in the root-owned slice
root): the agent learns who asks from the kernel (``SO_PEERCRED``: the
peer's PID and uid), never from what it writes. So that no user can hold it
for the others:

- each uid has at most :data:`MAX_PER_USER` connections open at once; one
  more is answered ``NO`` at once and closed, before any thread or read
  (all users together at most :data:`MAX_CONNECTIONS`);
- a connection has :data:`READ_TIMEOUT_S` to write its one request line;
- a request is then bounded by :mod:`.rooms` and :mod:`.room.queue`: at most
  :data:`~.room.queue.MAX_QUEUED_PER_USER` of a user's requests wait at once,
  and each is answered within :data:`~.room.request.REQUEST_TIMEOUT_S`;
- refusals are recorded at most once a minute per user and reason
  (:mod:`.records`).

Each connection is served by a thread of its own, from its line to its answer.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading

from . import protocol
from .facts.procs import user_name
from .room.request import Refused

READ_TIMEOUT_S = 5.0  # a client writes its line at once; one that does not is no client
MAX_PER_USER = 16  # connections of one uid open at once
MAX_CONNECTIONS = 1024  # of every uid together
ACCEPT_POLL_S = 0.2  # how soon a stop is seen

log = logging.getLogger("hami_jupyter.broker")


class Server:
    """Serves the socket *listening* for *rooms* (a :class:`~.rooms.Rooms`)."""

    def __init__(self, listening, rooms):
        self.listening = listening
        self.rooms = rooms
        self._open = {}  # uid -> connections open
        self._lock = threading.Lock()

    def run(self):
        """Accept until the agent stops."""
        poller = select.poll()
        poller.register(self.listening, select.POLLIN)
        while not self.rooms.stop.is_set():
            if not poller.poll(ACCEPT_POLL_S * 1000):
                continue
            try:
                conn, _ = self.listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            self.accept(conn)

    def accept(self, conn):
        """Serve *conn* from a thread of its own, if its user has room for it."""
        try:
            pid, uid, _ = protocol.peer_credentials(conn)
        except OSError:
            conn.close()
            return
        with self._lock:
            mine, total = self._open.get(uid, 0), sum(self._open.values())
            full = (f"user {user_name(uid) or uid} has {mine} connections to the agent open already"
                    if mine >= MAX_PER_USER else
                    f"the agent serves {total} connections already" if total >= MAX_CONNECTIONS else None)
            if full is None:
                self._open[uid] = mine + 1
        if full is not None:
            self.rooms.records.refused_stranger(self.rooms.root, pid, uid, user_name(uid), None, full, "too-many")
            _send(conn, protocol.no(full))
            conn.close()
            return
        threading.Thread(target=self.handle, args=(conn, pid, uid), name="agent-request", daemon=True).start()

    def handle(self, conn, pid, uid):
        try:
            request = self._request(conn, pid, uid)
            if request is not None:
                self.rooms.serve(request)
        except Exception:  # one request's trouble never ends the agent
            log.exception("broker: a request failed")
        finally:
            conn.close()
            with self._lock:
                self._open[uid] -= 1
                if not self._open[uid]:
                    del self._open[uid]

    def _request(self, conn, pid, uid):
        """The admitted :class:`~.room.request.Request` of *conn*, or None (answered ``NO`` already)."""
        user = user_name(uid)
        rooms = self.rooms
        try:
            line = _read_line(conn)
        except OSError:
            line = None
        if line is None:
            rooms.records.refused_stranger(rooms.root, pid, uid, user, None,
                                           "no request line (ROOM <gpu uuid> <bytes> <since_unix_ns>)",
                                           "no-request")
            return None
        room = None
        try:
            room = protocol.parse_request(line)
            return rooms.admit(conn, pid, uid, user, room)
        except protocol.BadRequest as e:
            why, kind = f"malformed request: {e}", "malformed"
        except Refused as e:
            why, kind = str(e), e.kind
        rooms.records.refused_stranger(rooms.root, pid, uid, user, room.uuid if room else None, why, kind)
        _send(conn, protocol.no(why))
        return None


def _read_line(conn):
    conn.settimeout(READ_TIMEOUT_S)
    data = b""
    while b"\n" not in data and len(data) <= protocol.MAX_LINE:
        chunk = conn.recv(protocol.MAX_LINE + 1 - len(data))
        if not chunk:
            break
        data += chunk
    conn.settimeout(None)
    return data.split(b"\n", 1)[0] if b"\n" in data else None


def _send(conn, line):
    try:
        conn.sendall(line)
    except OSError:
        pass


def listening_socket(path):
    """A Unix socket listening at *path*, mode 0666 (any local user may ask;
    the agent checks who asks), put in place with one rename, so that a
    client never meets a socket nobody listens on."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o111)  # bind makes the file 0666 itself: no chmod of a path someone could swap
    try:
        server.bind(str(tmp))
        os.umask(umask)
        server.listen(128)
        os.replace(tmp, path)
    except BaseException:
        os.umask(umask)
        server.close()
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    return server
