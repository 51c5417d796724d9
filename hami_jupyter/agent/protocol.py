"""The memory broker's protocol: one request line in, one or two answer lines out.

A process under the preload library whose allocation the driver refused
(the GPU has no room, though the slice has) connects to the agent's Unix
socket (the broker's socket, as the library calls it) and writes one line::

    ROOM <gpu uuid> <bytes> <since_unix_ns>\\n

*bytes*: what the driver could not give; *since*: when this process's wait
began, kept across re-asks, so that a restarted agent still serves the
oldest wait first. The agent answers on the same connection:

- ``BUSY <n>``: at once when the request waits behind *n* others on that GPU
  (the final answer follows);
- ``OK <bytes made free> <ticket>``: room was made (or was there: 0): retry
  the driver. The room is the requester's in the room ledger (the ticket
  names its grant there) while it keeps the connection open, which it does
  until its retry is done;
- ``NO <why>``: nothing can be parked now; the library may ask again until its
  own deadline.

Then the agent closes the connection (after an ``OK``, once the requester
closed its end, or the grant's lease ran out). Nothing here touches a socket: this
module only reads and writes the lines, so the same rules serve the agent,
its tests and any other client.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from ..slice.broker_report import SOCKET_NAME, SOCKET_VARIABLE

MAX_LINE = 256  # a request is ~80 bytes; more is not a request
MAX_BYTES = 1 << 50  # 1 PiB: no GPU has more; a larger figure is garbage, not a need

# A GPU UUID as NVML spells it (GPU-xxxxxxxx-..., MIG-...): printable, no space.
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,80}")


class BadRequest(ValueError):
    """A line that is not a request; the message says what is wrong."""


@dataclass(frozen=True)
class Room:
    """One request: *bytes* on GPU *uuid*, waited for since *since_ns* (Unix ns)."""

    uuid: str
    bytes: int
    since_ns: int


def socket_path(root, env=None):
    """Where the broker listens: ``$HAMI_BROKER_SOCKET``, else ``<root>/broker.sock``."""
    env = os.environ if env is None else env
    return Path(env.get(SOCKET_VARIABLE) or Path(root) / SOCKET_NAME)


def parse_request(line):
    """The :class:`Room` of one request line (bytes or str, with or without its
    newline); BadRequest saying why it is not one."""
    if isinstance(line, bytes):
        try:
            line = line.decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest("not ASCII") from None
    words = line.rstrip("\n").split(" ")
    if len(words) != 4 or words[0] != "ROOM":
        raise BadRequest("expected ROOM <gpu uuid> <bytes> <since_unix_ns>")
    _, uuid, size, since = words
    if not _UUID.fullmatch(uuid):
        raise BadRequest(f"{uuid[:60]!r} is not a GPU UUID")
    if not (size.isdigit() and since.isdigit()):
        raise BadRequest("bytes and since must be whole numbers")
    size, since = int(size), int(since)
    if not 0 < size <= MAX_BYTES:
        raise BadRequest(f"{size} bytes is not a size to wait for")
    return Room(uuid, size, since)


def request_line(room):
    """The line a client writes for *room* (a :class:`Room`)."""
    return f"ROOM {room.uuid} {room.bytes} {room.since_ns}\n".encode()


def ok(made, ticket=0):
    return f"OK {int(made)} {int(ticket)}\n".encode()


def busy(ahead):
    return f"BUSY {int(ahead)}\n".encode()


def no(why):
    """``NO <why>``: one line, whatever *why* holds."""
    text = " ".join(str(why).split()) or "nothing can be parked now"
    return f"NO {text[:400]}\n".encode("ascii", "replace")


def parse_answer(line):
    """``(word, rest)`` of an answer line: ``("OK", 123)`` (the bytes made free),
    ``("BUSY", 2)``, ``("NO", "why")``."""
    if isinstance(line, bytes):
        line = line.decode("ascii", "replace")
    word, _, rest = line.rstrip("\n").partition(" ")
    if word in ("OK", "BUSY"):
        return word, int(rest.split(" ")[0])
    if word == "NO":
        return word, rest
    raise BadRequest(f"not an answer: {line[:80]!r}")


def peer_credentials(conn):
    """``(pid, uid, gid)`` of the process that connected *conn* (SO_PEERCRED):
    the kernel's word, in the broker's PID namespace, never the client's."""
    data = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)
