"""One request for room: who may ask, for how much, since when; and the request on its connection.

Who asks is what the kernel said of the connection's peer (``SO_PEERCRED``:
its PID, as the agent's PID namespace numbers it, and its uid), never what
the request line says. :func:`admit` takes it from there, from facts:

- the peer must be a live process that the agent matched to a live slot of
  a slice under its root whose file its owner owns (a process under the
  preload library in one of its slices);
- that slice's limits must not be its user's own word: a limits file (the
  hub's) is in force, or the slice file is the agent's own user's;
- the slice must hold less than its limit on that GPU by NVML; the request
  counts for no more than the limit less that use (a user's wait cannot have
  more parked for it than her slice may hold);
- its wait cannot have begun before its process started (``/proc``), nor,
  once the agent has run a while, more than :data:`HEARD_SLACK_S` before the
  agent first heard of it: a process asks within a second of its wait's start,
  so an older *since* only claims a place in the queue.

The connection stays open until the answer: while it waits, the process is
known to be alive and to still want the room; a process that died or gave up
closes it, and :meth:`Request.alive` sees that before anything is parked for
it. Every request expires :data:`REQUEST_TIMEOUT_S` after it came (answered
``NO``: it asks again, keeping its place by its *since*).
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...slice.size import format_size

REQUEST_TIMEOUT_S = 60.0  # a request is answered within this, at the latest NO (the library asks again)
HEARD_SLACK_S = 2.0  # a wait asks within a second of its start
RESTART_GRACE_S = 10.0  # waits heard this soon after the agent's start may be older (asked a predecessor)


class Refused(Exception):
    """A request answered ``NO`` before it is queued; the message says why,
    *kind* names the rule (the audit log records each kind once a minute per user)."""

    def __init__(self, why, kind):
        super().__init__(why)
        self.kind = kind


@dataclass(eq=False)
class Request:
    """*pid*: the requester's host PID (the peer's); *uid*/*user*: its owner;
    *slice*, *path*, *kernel_id*: where its slot is; *bytes*: what it asked, no
    more than *room* (its slice's limit less its use); *expires*: when it is
    answered NO at the latest (monotonic)."""

    conn: socket.socket
    pid: int
    uid: int
    user: str | None
    slice: str
    path: Path
    kernel_id: str
    uuid: str
    bytes: int
    since_ns: int
    room: int | None = None
    seq: int = 0
    arrived: float = field(default_factory=time.monotonic)
    expires: float = 0.0

    def __post_init__(self):
        if not self.expires:
            self.expires = self.arrived + REQUEST_TIMEOUT_S

    def expired(self):
        return time.monotonic() >= self.expires

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
        poller = select.poll()  # not select(): the agent's descriptors may pass 1024
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

    def wait_closed(self, most_s, stop):
        """Until the requester closes its end (it took the room granted to it),
        at most *most_s* seconds, or the agent stops."""
        deadline = time.monotonic() + most_s
        while not stop.is_set() and time.monotonic() < deadline and self.alive():
            poller = select.poll()
            try:
                poller.register(self.conn, select.POLLIN | select.POLLHUP)
                poller.poll(200)
            except (OSError, ValueError):
                return

    def answer(self, line):
        """Send one answer line; False when the requester is gone."""
        try:
            self.conn.sendall(line)
            return True
        except OSError:
            return False


@dataclass
class ForHeadroom:
    """The requester of a headroom park, as :class:`~hami_jupyter.agent.records.Records`
    names requesters: no user, no slice; the GPU, the headroom and its free bytes."""

    uuid: str
    headroom: int
    free: int
    uid: int | None = None  # the audit record takes the agent's own

    def who(self):
        return (f"the {format_size(self.headroom)} headroom of GPU {self.uuid} "
                f"({format_size(self.free)} free)")

    def record(self):
        return {"for": "headroom", "slice": None, "pid": None, "user": None, "kernel": None,
                "bytes": max(0, self.headroom - self.free), "headroom_bytes": self.headroom,
                "free_bytes": self.free}


def admit(look, found, uid, user, room, heard_unix, started_unix, root):
    """The fields of the :class:`Request` for *room* (a protocol Room) from the
    peer *found* (``(facts, attribution)`` of its PID, None when gone) in
    *look*; Refused saying why it may not ask. *heard_unix*: when the agent
    first heard of this wait; *started_unix*: when the agent started."""
    if found is None or found[1].slot is None:
        pid = found[0].pid if found else "?"
        raise Refused(f"pid {pid} holds no live slot in a slice under {root}: only a process running "
                      "under the preload library in one of its slices may ask for room", "no-slot")
    facts, attribution = found
    seen = attribution.seen
    if not seen.limits_trusted:
        raise Refused(f"slice {seen.name} has no limits file beside it: its limits are its user's own word, "
                      "and room is made only within limits its user cannot raise", "own-limits")
    limit = seen.limits(room.uuid).memory_limit
    left = None
    if limit and room.bytes > limit:
        raise Refused(f"{format_size(room.bytes)} is more than slice {seen.name}'s "
                      f"{format_size(limit)} limit on GPU {room.uuid}", "over-limit")
    if limit:
        use = look.slice_bytes(seen.name, room.uuid)
        left = limit - use
        if left <= 0:
            raise Refused(f"slice {seen.name} holds {format_size(use)} on GPU {room.uuid}, at or over its "
                          f"{format_size(limit)} limit: room is made only within a limit", "over-limit")
    floor = facts.started_unix
    if heard_unix - started_unix > RESTART_GRACE_S:
        floor = max(floor, heard_unix - HEARD_SLACK_S)
    since = min(max(room.since_ns, int(floor * 1e9)), time.time_ns())
    return dict(pid=facts.pid, uid=uid, user=user or facts.user, slice=seen.name, path=seen.path,
                kernel_id=attribution.slot.kernel_id, uuid=room.uuid,
                bytes=room.bytes if left is None else min(room.bytes, left), since_ns=since, room=left)
