"""One request for room, from a checked process, on its open connection.

Who asks is what the kernel said of the connection's peer (SO_PEERCRED: its
PID, as the broker's PID namespace numbers it, and its uid), matched to the
live slot that process holds in a slice under the broker's root
(:mod:`.server` does the check). The connection stays open until the answer:
while it waits, the process is known to be alive and to still want the room;
a process that died or gave up closes it, and :meth:`Request.alive` sees that
before anything is parked for it.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(eq=False)
class Request:
    """*pid*: the requester's PID here (the peer's); *slot_pid*: as its slot
    records it (its own PID namespace's); *uid*/*user*: its owner; *slice*,
    *path*, *kernel_id*: where its slot is."""

    conn: socket.socket
    pid: int
    uid: int
    user: str | None
    slice: str
    path: Path
    kernel_id: str
    slot_pid: int
    uuid: str
    bytes: int
    since_ns: int
    seq: int = 0
    arrived: float = field(default_factory=time.monotonic)

    def who(self):
        kernel = f", kernel {self.kernel_id}" if self.kernel_id else ""
        return f"pid {self.pid} (user {self.user or self.uid}, slice {self.slice}{kernel})"

    def record(self):
        """The requester as the audit log and the report name it."""
        return {"slice": self.slice, "pid": self.pid, "user": self.user, "kernel": self.kernel_id or None,
                "bytes": self.bytes, "since_unix_ns": self.since_ns}

    def alive(self):
        """Whether the requester's end of the connection is still open: it never
        writes after its request, so anything readable is its close (or garbage)."""
        poller = select.poll()  # not select(): the broker's descriptors may pass 1024
        try:
            poller.register(self.conn, select.POLLIN)
            events = poller.poll(0)
        except (OSError, ValueError):
            return False
        if not events:
            return True
        if events[0][1] & (select.POLLERR | select.POLLNVAL):
            return False
        try:
            return self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def answer(self, line):
        """Send one answer line; False when the requester is gone."""
        try:
            self.conn.sendall(line)
            return True
        except OSError:
            return False
