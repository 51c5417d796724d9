"""What a notebook cell printed, shown and raised, gathered from kernel messages.

Shared by the tests that run cells through a kernel client (tests/jupyter)
and over a server's websocket (tests/hub).
"""

from dataclasses import dataclass, field


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
