"""What a notebook cell printed, shown and raised, gathered from kernel messages.

Shared by the tests that run cells through a kernel client (tests/jupyter)
and over a server's websocket (tests/hub, tests/server: :func:`run_over_websocket`).
"""

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    outputs: list = field(default_factory=list)  # display_data / execute_result content
    error: dict | None = None
    status: str | None = None  # of the execute_reply, when the caller saw it

    def collect(self, msg):
        """Take one iopub message of the cell (others are ignored)."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            if content["name"] == "stdout":
                self.stdout += content["text"]
            else:
                self.stderr += content["text"]
        elif kind in ("display_data", "execute_result", "update_display_data"):
            self.outputs.append(content)
        elif kind == "error":
            self.error = content

    def text(self, mime="text/plain"):
        """The *mime* parts of the rich outputs, in order."""
        return [o["data"][mime] for o in self.outputs if mime in o.get("data", {})]


def execute_request(code, username="test"):
    """An ``execute_request`` as a browser sends it over the kernel websocket."""
    return {
        "channel": "shell",
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request", "username": username,
                   "session": uuid.uuid4().hex, "date": datetime.now(timezone.utc).isoformat(),
                   "version": "5.3"},
        "parent_header": {}, "metadata": {},
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
        "buffers": [],
    }


async def run_over_websocket(conn, code, username="test", closed=lambda: ""):
    """Send *code* as a cell over the open kernel websocket *conn* (tornado's)
    and gather its messages until its reply and the kernel's idle; a CellResult.
    *closed()* says more when the websocket closes mid-cell."""
    request = execute_request(code, username)
    msg_id = request["header"]["msg_id"]
    conn.write_message(json.dumps(request))
    result, replied, idle = CellResult(), False, False
    while not (replied and idle):
        raw = await conn.read_message()
        if raw is None:
            raise AssertionError(f"the kernel websocket closed mid-cell\n{closed()}")
        if not isinstance(raw, str):
            continue  # binary frames: buffers, which no reply here has
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "execute_reply":
            replied = True
            result.status = content["status"]
            if content["status"] == "error" and result.error is None:
                result.error = content
        elif kind == "status":
            idle = content["execution_state"] == "idle"
        else:
            result.collect(msg)
    return result
