"""A process that asks the broker for room, run under the preload library in a slice.

The broker knows who asks from the socket's peer (SO_PEERCRED): a request is
only a request when it comes from a process holding a live slot in a slice.
So the test's client is such a process: it starts CUDA on a device (the
library gives it its slot), then follows the protocol in Python. Commands on
stdin, one per line; every event is one JSON line on stdout:

    init DEV                          -> {"op": "init"}
    ask NAME SOCKET UUID BYTES SINCE  -> {"op": "ask", "name": NAME, "line": "BUSY 1"} per answer
                                         line, then {"op": "ask", "name": NAME, "closed": true}; after
                                         a final line (OK or NO) the client closes the connection
                                         itself, as the library does once it took the room granted
    close NAME                        -> the connection NAME is closed at once (a process that gives
                                         up, or is killed, mid-wait); {"op": "close", "name": NAME}
    churn SOCKET UUID BYTES SECONDS   -> connect, send a request (a new since each), close at once,
                                         again and again for SECONDS; {"op": "churn", "count": N}
"""

import json
import socket
import sys
import threading
import time

from hami_jupyter import driver_memory

out_lock = threading.Lock()
connections = {}


def say(**record):
    with out_lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def ask(name, path, uuid, size, since):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connections[name] = conn
    try:
        conn.connect(path)
        conn.sendall(f"ROOM {uuid} {size} {since}\n".encode())
        buffered = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                break
            buffered += chunk
            final = None
            while b"\n" in buffered and final is None:
                line, buffered = buffered.split(b"\n", 1)
                if line.startswith(b"BUSY"):
                    say(op="ask", name=name, line=line.decode())
                else:
                    final = line
            if final is not None:
                # The room is taken (the library's retry) and the connection
                # closed before the answer is told: the agent's next turn
                # finds this one over.
                conn.close()
                say(op="ask", name=name, line=final.decode())
                break
    except OSError as e:
        say(op="ask", name=name, error=str(e))
    conn.close()
    say(op="ask", name=name, closed=True)


def churn(path, uuid, size, seconds):
    """A hostile user's loop (issue 39): requests that go away at once."""
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            conn.sendall(f"ROOM {uuid} {size} {time.time_ns()}\n".encode())
            count += 1
        except OSError:
            time.sleep(0.01)
        finally:
            conn.close()
    say(op="churn", count=count)


for command in sys.stdin:
    words = command.split()
    if not words:
        continue
    if words[0] == "init":
        driver_memory.init(int(words[1]))
        say(op="init")
    elif words[0] == "ask":
        name, path, uuid, size, since = words[1:6]
        threading.Thread(target=ask, args=(name, path, uuid, int(size), int(since)), daemon=True).start()
    elif words[0] == "churn":
        churn(words[1], words[2], int(words[3]), float(words[4]))
    elif words[0] == "close":
        conn = connections.get(words[1])
        if conn is not None:
            conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        say(op="close", name=words[1])
