"""What an administrator may do through the hub service, and where each is done.

Every action names a server the Hub lists (``user``, ``server``), and the
service reaches it only by the URL the Hub gave, so a request can touch
nothing but the hub's own servers and slices:

- ``interrupt``, ``restart``, ``shutdown`` a kernel: the server's Jupyter
  REST API (``api/kernels/<id>/interrupt|restart``, ``DELETE api/kernels/<id>``);
- ``park``, ``resume`` a kernel: the server extension's
  ``hami/v1/kernels/<id>/park|resume`` (the server parks its own user's
  process, which the driver allows);
- ``stop-server``: the Hub API (``delete:servers``), when
  ``allow_stop_server`` is on;
- ``resize`` and ``reset`` a slice: on a single host, where the hub owns the
  limits files, the slice file under the service's ``slice_root`` is changed
  with :func:`hami_jupyter.admin.changes.apply_here` (checked, applied live,
  one audit line naming the administrator, ``"via": "hub-service"``), as the
  admin panel and the admin service do. Only slices of the service's own
  node: another node's limits files are that node's. On Kubernetes a running
  slice is the pod's and cannot be resized: the answer says that a new size
  takes effect at the next server start and offers ``next-size``;
- ``next-size``: the size of a user's next start (:mod:`hami_jupyter.hub.next_sizes`,
  read by the policy at spawn).
- ``guard-resume``, ``guard-end`` a process the guard parked (``node``,
  ``pid``): on the service's own node only, through that node's root admin
  service (``<slice_root>/admin.sock``), which checks the guard's report,
  resumes or ends the process and writes the audit record, naming the
  administrator (``<who> (JupyterHub)``).

Kernel actions are also logged by the service (who, what, which kernel);
limit changes go to the audit log like every administrator's change.
"""

import asyncio
import os
import re

from ..admin import changes
from ..gpus import HostGpu
from ..hub import next_sizes
from ..slice import paths as slice_paths
from .servers import ServerError

KERNEL_ACTIONS = {
    "interrupt": ("POST", "api/kernels/{}/interrupt", "interrupted"),
    "restart": ("POST", "api/kernels/{}/restart", "restarted"),
    "shutdown": ("DELETE", "api/kernels/{}", "shut down"),
    "park": ("POST", "hami/v1/kernels/{}/park", "parked"),
    "resume": ("POST", "hami/v1/kernels/{}/resume", "resumed"),
}
SLICE_ACTIONS = ("resize", "reset")
GUARD_ACTIONS = {"guard-resume": "resume", "guard-end": "end"}
ACTIONS = (*KERNEL_ACTIONS, "stop-server", *SLICE_ACTIONS, "next-size", *GUARD_ACTIONS)
_KERNEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ActionError(Exception):
    """An action refused or failed: *status* is the HTTP status to answer with,
    *extra* more fields of the JSON answer."""

    def __init__(self, status, message, **extra):
        super().__init__(message)
        self.status, self.extra = status, extra


def _text(request, key, required=True):
    value = request.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value and key != "server"):
        raise ActionError(400, f"the request needs {key!r} (a string)")
    return value


class Actions:
    """Carries out actions for *service* (:class:`.app.HamiHubService`: its
    settings, the latest listing and document, the Hub API and the servers)."""

    def __init__(self, service):
        self.service = service

    @property
    def log(self):
        return self.service.log

    async def run(self, request, who):
        """Do *request* (a dict with ``action``) for administrator *who*; the answer as a dict."""
        if not isinstance(request, dict):
            raise ActionError(400, "the request must be a JSON object")
        action = request.get("action")
        if action in KERNEL_ACTIONS:
            return await self._kernel(action, request, who)
        if action == "stop-server":
            return await self._stop_server(request, who)
        if action in SLICE_ACTIONS:
            return await self._slice(action, request, who)
        if action == "next-size":
            return await self._next_size(request, who)
        if action in GUARD_ACTIONS:
            return await self._guard(GUARD_ACTIONS[action], request, who)
        raise ActionError(400, f"unknown action {action!r}; actions: {', '.join(ACTIONS)}")

    def _server(self, request):
        user, name = _text(request, "user"), _text(request, "server", required=False) or ""
        ref = self.service.server_ref(user, name)
        if ref is None:
            label = f"{user}'s server" + (f" {name!r}" if name else "")
            raise ActionError(404, f"{label} is not running (the hub lists no such server)")
        return ref

    async def _kernel(self, action, request, who):
        ref = self._server(request)
        kernel_id = _text(request, "kernel_id")
        if not _KERNEL_ID.match(kernel_id):
            raise ActionError(400, f"not a kernel id: {kernel_id!r}")
        method, path, done = KERNEL_ACTIONS[action]
        timeout = self.service.action_timeout if action in ("park", "resume", "restart") else None
        try:
            _, body = await self.service.servers.call(ref, method, path.format(kernel_id),
                                                      timeout=timeout)
        except ServerError as e:
            status = e.status if e.status in (404, 409, 504) else 502
            raise ActionError(status, f"{action} of kernel {kernel_id} on {ref.key}: {e}") from None
        message = f"{done} kernel {kernel_id} of {ref.user}" + (f"'s server {ref.name!r}"
                                                                if ref.name else "")
        if action == "park" and isinstance(body, dict) and "parked_bytes" in body:
            message += f" ({body['parked_bytes']} bytes to host memory in {body.get('seconds')} s)"
        self.log.info("hami-jupyter hub-service: %s %s", who, message)
        await self.service.refresh_after(action)
        return {"ok": True, "message": message, "result": body}

    async def _stop_server(self, request, who):
        if not self.service.allow_stop_server:
            raise ActionError(403, "stopping servers is not offered by this hub service "
                                   "(HamiHubService.allow_stop_server is off)")
        ref = self._server(request)
        try:
            await self.service.hub_api.stop_server(ref.user, ref.name)
        except Exception as e:  # HubAPIError, or the hub gone
            raise ActionError(502, f"the hub did not stop {ref.key}: {e}") from None
        self.log.info("hami-jupyter hub-service: %s stopped the server %s", who, ref.key)
        await self.service.refresh_after("stop-server")
        return {"ok": True, "message": f"asked the hub to stop {ref.user}'s server"
                                      + (f" {ref.name!r}" if ref.name else "")}

    # ---- slices ----

    def _find_slice(self, node, name):
        """The document's entries of slice *name* on *node* (one per GPU), and the GPUs there."""
        for n in self.service.document.get("nodes", []):
            if n["node"] != node:
                continue
            found = [s for g in n["gpus"] for s in g["slices"] if s["slice"] == name]
            gpus = [HostGpu(g["index"], g["uuid"], g["name"], g["memory_total"],
                            g.get("nvml_memory_used"), g.get("utilization")) for g in n["gpus"]]
            return found, gpus
        return [], []

    def _next_start(self, user, node, name):
        sizes = list(self.service.sizes)
        raise ActionError(
            409, f"on Kubernetes, slice {name!r} on {node} is as large as its pod: a new size "
                 f"takes effect at {user}'s next server start. Pick the size of that start "
                 "(action next-size) and restart the server.",
            applies="next-start", next_size={"user": user, "sizes": sizes,
                                             "available": bool(self.service.next_sizes_file)})

    async def _slice(self, action, request, who):
        node, name = _text(request, "node"), _text(request, "slice")
        found, gpus = self._find_slice(node, name)
        users = sorted({u for s in found for u in s["users"]})
        if self.service.kubernetes:
            self._next_start(request.get("user") or (users[0] if users else name), node, name)
        if not found:
            raise ActionError(404, f"no slice {name!r} on node {node!r} in the hub's latest view "
                                   "(it shows once a kernel of it runs)")
        if node != self.service.node:
            raise ActionError(409, f"slice {name!r} lives on node {node!r}; this hub service holds "
                                   f"the limits files of node {self.service.node!r} only. Resize it "
                                   f"there (hami-jupyter slice set {name} ...).")
        try:
            path = slice_paths.slice_path(name, root=self.service.slice_root)
        except slice_paths.SliceNameError as e:
            raise ActionError(400, str(e)) from None
        if not path.is_file() or os.path.abspath(path) not in {s["path"] for s in found}:
            raise ActionError(409, f"slice {name!r} of node {node!r} is not under this service's "
                                   f"slice root {self.service.slice_root} (its file: "
                                   f"{found[0]['path']})")
        actor = f"{who} (JupyterHub)"
        loop = asyncio.get_running_loop()
        try:
            if action == "reset":
                message = await loop.run_in_executor(None, lambda: changes.reset_here(
                    path, audit_path=self.service.audit_path(), who=actor, via="hub-service"))
                change = None
            else:
                fields = {k: request.get(k) for k in ("device", "memory", "sm", "mode",
                                                      "guarantee")}
                change = await loop.run_in_executor(None, lambda: changes.apply_here(
                    path, **fields, overcommit=bool(request.get("overcommit")), gpus=gpus,
                    audit_path=self.service.audit_path(), who=actor, via="hub-service"))
                message = f"applied {change.summary()}"
        except changes.ChangeError as e:
            c = e.change
            raise ActionError(403 if isinstance(e, changes.ReadOnlyError) else 400, str(e),
                              errors=c.errors if c is not None else [str(e)],
                              warnings=c.warnings if c is not None else []) from None
        self.log.info("hami-jupyter hub-service: %s: %s", actor, message)
        await self.service.refresh_after(action)
        return {"ok": True, "message": message,
                "change": change.as_dict() if change is not None else None,
                "warnings": change.warnings if change is not None else []}

    async def _guard(self, what, request, who):
        from ..admin import service as admin_service
        from ..admin.guard_parked import ParkedError

        node, pid = _text(request, "node"), request.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ActionError(400, "the request needs 'pid' (a process id)")
        listed = next((p for n in self.service.document.get("nodes", []) if n["node"] == node
                       for p in n.get("parked", []) if p["pid"] == pid), None)
        if listed is None:
            raise ActionError(404, f"the hub's latest view lists no process {pid} parked by the "
                                   f"guard on node {node!r}")
        if node != self.service.node:
            raise ActionError(409, f"process {pid} is on node {node!r}; this hub service acts on "
                                   f"node {self.service.node!r} only. There: hami-jupyter guard "
                                   f"--{what} {pid}")
        sock = admin_service.socket_path(self.service.slice_root)
        if not admin_service.usable(sock):
            raise ActionError(503, f"no admin service listens on {sock}: it resumes and ends "
                                   "processes the guard parked (hami-jupyter admin-service)")
        loop = asyncio.get_running_loop()
        try:
            message = await loop.run_in_executor(
                None, lambda: admin_service.remote_guard(sock, pid, what, on_behalf=who))
        except ParkedError as e:
            raise ActionError(409, str(e)) from None
        self.log.info("hami-jupyter hub-service: %s (JupyterHub): %s", who, message)
        await self.service.refresh_after(f"guard-{what}")
        return {"ok": True, "message": message}

    async def _next_size(self, request, who):
        user = _text(request, "user")
        size = request.get("size")
        if size is not None and not isinstance(size, str):
            raise ActionError(400, "'size' must be a size name, or null to clear the pick")
        try:
            next_sizes.pick(self.service.next_sizes_file, user, size or None, by=who,
                            sizes=list(self.service.sizes) or None)
        except next_sizes.NextSizesError as e:
            raise ActionError(400, str(e)) from None
        except OSError as e:
            raise ActionError(500, f"cannot store the next size: {e}") from None
        message = (f"{user}'s next server start gets size {size!r}" if size
                   else f"{user}'s next server start gets the policy's size")
        self.log.info("hami-jupyter hub-service: %s: %s", who, message)
        return {"ok": True, "message": message}
