"""``hami-jupyter admin-service``: administrators' changes, applied and logged by root.

Under a hub, the limits files' folder, the audit log and the admin markers
are root's: an administrator cannot append to the log, cut it short, or
leave a change unlogged through the toolkit. This small service, run as root
(by JupyterHub as a managed service, or by systemd), does it for them:

- it listens on a Unix socket, ``<slice root>/admin.sock`` by default,
  owned by root and the admin group, mode 0660, so that only root and the
  group can connect at all;
- for each connection it asks the kernel who the caller is
  (``SO_PEERCRED``: pid, uid, gid, which the caller cannot fake), and serves
  only root and members of the admin group (by the group database, the
  caller's primary group included);
- it reads one request (one JSON line: ``{"op": "set", "slice": NAME,
  "device", "memory", "guarantee", "sm", "mode", "overcommit"}``, ``{"op": "reset",
  "slice": NAME}``, or ``{"op": "park"|"resume", "slice": NAME, "kernel_id":
  ID}`` for a kernel of that slice), applies it with :func:`.changes.apply_here` /
  :func:`.changes.reset_here` on the slice of that name under its own root
  (never a path the caller names), and appends the audit record with the
  caller's user name and uid from the OS;
- ``{"op": "guard-resume"|"guard-end", "pid": PID}``: resumes or ends a
  process the guard parked (:func:`hami_jupyter.admin.guard_parked.handle`, which
  checks the guard's report under its root and audits it with the caller's
  name and uid). Root may add ``"on_behalf": NAME`` (the hub view, root
  itself, acting for a JupyterHub administrator): the record then names
  ``NAME (JupyterHub)``;
- it answers one JSON line: ``{"ok": true, "change": ...}`` or
  ``{"ok": false, "error": ..., "change": ...}``.

:func:`.actions.apply` sends a non-root caller's change here when the socket
exists and the caller may connect to it; root writes directly.
"""

import grp
import json
import os
import pwd
import signal
import socket
import socketserver
import stat
import struct
import sys
import threading
from pathlib import Path

from .. import audit
from ..gpus import read_gpus
from ..slice import parking
from ..slice import paths as slice_paths
from . import changes
from .changes import Change, ChangeError, ReadOnlyError

SOCKET_NAME = "admin.sock"
GUARD_RESUME, GUARD_END = "guard-resume", "guard-end"
MAX_REQUEST = 1 << 16
TIMEOUT_S = 30.0


class ServiceError(Exception):
    """The service could not be reached or did not answer sensibly."""


def socket_path(root):
    return Path(root) / SOCKET_NAME


def usable(sock):
    """True when *sock* is a socket this process may connect to."""
    try:
        st = os.stat(sock)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and os.access(sock, os.W_OK)


def peer_credentials(conn):
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def is_admin(uid, admin_gid):
    """Root, or a user whose primary or supplementary groups include *admin_gid*."""
    if uid == 0:
        return True
    if admin_gid is None:
        return False
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    return admin_gid in os.getgrouplist(pw.pw_name, pw.pw_gid)


# ---- the client -------------------------------------------------------------------


def _call(sock, request):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(TIMEOUT_S)
    try:
        conn.connect(os.fspath(sock))
        conn.sendall(json.dumps(request).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise ServiceError(f"the admin service at {sock} did not answer: {e.strerror or e}") from None
    finally:
        conn.close()
    try:
        reply = json.loads(data)
    except ValueError:
        raise ServiceError(f"the admin service at {sock} gave no answer") from None
    if not isinstance(reply, dict):
        raise ServiceError(f"the admin service at {sock} gave no answer")
    return reply


def _raise(reply):
    kind = ReadOnlyError if reply.get("read_only") else ChangeError
    raise kind(reply.get("error") or "the admin service refused the change",
               Change.from_dict(reply.get("change")))


def remote_apply(sock, path, request):
    """:func:`.changes.apply_here` through the service; the same results and errors."""
    try:
        reply = _call(sock, {"op": "set", "slice": slice_paths.slice_name(path), **request})
    except ServiceError as e:
        raise ChangeError(f"{e}; nothing was changed") from None
    if not reply.get("ok"):
        _raise(reply)
    return Change.from_dict(reply["change"])


def remote_parking(sock, path, op, kernel_id):
    """Park or resume (*op*) a kernel through the service; its line, or ParkError."""
    try:
        reply = _call(sock, {"op": op, "slice": slice_paths.slice_name(path), "kernel_id": kernel_id})
    except ServiceError as e:
        raise parking.ParkError(f"{e}; nothing was done") from None
    if not reply.get("ok"):
        raise parking.ParkError(reply.get("error") or f"the admin service did not {op} it")
    return reply["message"]


def remote_guard(sock, pid, what, on_behalf=None):
    """Resume or end (*what*: "resume" or "end") the process *pid* the guard
    parked, through the service; its line, or ParkedError."""
    from .guard_parked import ParkedError

    request = {"op": f"guard-{what}", "pid": pid}
    if on_behalf:
        request["on_behalf"] = on_behalf
    try:
        reply = _call(sock, request)
    except ServiceError as e:
        raise ParkedError(f"{e}; nothing was done") from None
    if not reply.get("ok"):
        raise ParkedError(reply.get("error") or f"the admin service did not {what} it")
    return reply["message"]


def remote_reset(sock, path):
    """:func:`.changes.reset_here` through the service."""
    try:
        reply = _call(sock, {"op": "reset", "slice": slice_paths.slice_name(path)})
    except ServiceError as e:
        raise ChangeError(f"{e}; nothing was changed") from None
    if not reply.get("ok"):
        _raise(reply)
    return reply["message"]


# ---- the service ------------------------------------------------------------------


class _Handler(socketserver.StreamRequestHandler):
    timeout = TIMEOUT_S

    def handle(self):
        reply = self.server.service.serve_one(self.connection, self.rfile)
        try:
            self.wfile.write(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class AdminService:
    """The service for the slices under *root*; *admin_group* names who may use it."""

    def __init__(self, root, admin_group=None, sock=None, log=None):
        self.root = Path(root)
        self.admin_gid = grp.getgrnam(admin_group).gr_gid if admin_group else None
        self.sock = Path(sock) if sock else socket_path(self.root)
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.server = None
        self._thread = None

    def serve_one(self, conn, rfile):
        pid, uid, _gid = peer_credentials(conn)
        who = audit.user_name(uid)
        # The request is read whoever asks: closing on unread bytes would reset
        # the connection, and the caller would never see why it was refused.
        line = rfile.readline(MAX_REQUEST)
        if not is_admin(uid, self.admin_gid):
            self.log(f"hami-jupyter admin-service: refused {who} (uid {uid}, pid {pid}): "
                     "not root or in the admin group")
            return {"ok": False, "read_only": True,
                    "error": f"{changes.READ_ONLY}: {who} (uid {uid}) is not an administrator"}
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError
            if request.get("op") in (GUARD_RESUME, GUARD_END):
                return self._guard(request, who, uid)
            name = request["slice"]
            if not isinstance(name, str) or "/" in name:
                raise ValueError
            path = slice_paths.slice_path(name, root=self.root)
        except (ValueError, KeyError, slice_paths.SliceNameError) as e:
            return {"ok": False, "error": f"a malformed request: {e}"}
        op = request.get("op")
        try:
            if op == "set":
                fields = {k: request.get(k) for k in ("device", "memory", "sm", "mode",
                                                      "guarantee")}
                change = changes.apply_here(path, **fields, overcommit=bool(request.get("overcommit")),
                                            gpus=read_gpus()[0], who=who, uid=uid, via="admin-service")
                self.log(f"hami-jupyter admin-service: {who} (uid {uid}) applied {change.summary()}")
                return {"ok": True, "change": change.as_dict()}
            if op == "reset":
                message = changes.reset_here(path, who=who, uid=uid, via="admin-service")
                self.log(f"hami-jupyter admin-service: {who} (uid {uid}): {message}")
                return {"ok": True, "message": message}
            if op in ("park", "resume"):
                return self._parking(op, path, request.get("kernel_id"), who, uid)
            return {"ok": False, "error": f"unknown request {op!r}"}
        except ChangeError as e:
            return {"ok": False, "error": str(e),
                    "change": e.change.as_dict() if e.change is not None else None,
                    "read_only": isinstance(e, ReadOnlyError)}

    def _guard(self, request, who, uid):
        from . import guard_parked as parked

        pid = request.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return {"ok": False, "error": "a malformed request: no pid"}
        on_behalf = request.get("on_behalf")
        if on_behalf is not None:
            if uid != 0 or not isinstance(on_behalf, str) or not on_behalf:
                return {"ok": False, "error": "only root may act on behalf of another"}
            who = f"{on_behalf} (JupyterHub)"
        what = parked.RESUME if request["op"] == GUARD_RESUME else parked.END
        try:
            message = parked.handle(self.root, pid, what, who=who, uid=uid)
        except parked.ParkedError as e:
            return {"ok": False, "error": str(e)}
        except OSError as e:
            return {"ok": False, "error": f"could not {what} process {pid}: {e.strerror or e}"}
        self.log(f"hami-jupyter admin-service: {who} (uid {uid}): {message}")
        return {"ok": True, "message": message}

    def _parking(self, op, path, kernel_id, who, uid):
        if not isinstance(kernel_id, str) or not kernel_id:
            return {"ok": False, "error": "a malformed request: no kernel_id"}
        try:
            if op == "park":
                result = parking.park_kernel(path, kernel_id)
                message = (f"parked kernel {kernel_id}: {parking.format_size(result.bytes)} to "
                           f"host memory in {result.seconds:.1f} s")
            else:
                restored, seconds = parking.resume_kernel(path, kernel_id, timeout=60.0)
                message = (f"resumed kernel {kernel_id}: {parking.format_size(restored)} back on "
                           f"the GPU in {seconds:.1f} s")
        except parking.ParkError as e:
            return {"ok": False, "error": str(e)}
        self.log(f"hami-jupyter admin-service: {who} (uid {uid}): {message}")
        return {"ok": True, "message": message}

    def bind(self):
        """Make the socket: root's, the admin group's, 0660 (0600 without a group)."""
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            if stat.S_ISSOCK(os.lstat(self.sock).st_mode):
                os.unlink(self.sock)  # a stale socket of an earlier run
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            self.server = _Server(os.fspath(self.sock), _Handler)
        finally:
            os.umask(old)
        self.server.service = self
        os.chown(self.sock, -1, self.admin_gid if self.admin_gid is not None else -1)
        os.chmod(self.sock, 0o660 if self.admin_gid is not None else 0o600)
        return self

    def serve_forever(self):
        if self.server is None:
            self.bind()
        self.log(f"hami-jupyter admin-service: listening on {self.sock}")
        try:
            self.server.serve_forever()
        finally:
            self.close()

    def stop_on_signals(self):
        """End :meth:`serve_forever` cleanly on SIGINT or SIGTERM. Handled here,
        not left to Python's KeyboardInterrupt: JupyterHub stops a managed
        service with SIGINT, and Python installs no SIGINT handler in a process
        that started with SIGINT ignored (a hub started in the background by a
        script); SIGTERM's default would end it with no exit status of its own."""

        def stop(signum, _frame):
            # shutdown() waits for serve_forever, which runs in this very thread.
            if self.server is not None:
                threading.Thread(target=self.server.shutdown, daemon=True).start()

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop)
        return self

    def start(self):
        """Serve from a daemon thread (tests); returns self."""
        if self.server is None:
            self.bind()
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="hami-admin-service")
        self._thread.start()
        return self

    def close(self):
        if self.server is not None:
            if self._thread is not None:
                self.server.shutdown()
                self._thread.join(5)
                self._thread = None
            self.server.server_close()
            try:
                os.unlink(self.sock)
            except FileNotFoundError:
                pass
            self.server = None
