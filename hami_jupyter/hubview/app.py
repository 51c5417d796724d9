"""``hami-jupyter hub-service``: the service, its settings, and its refresh loop.

:class:`HamiHubService` is a traitlets ``Application``: every setting is
``c.HamiHubService.<name>`` in a config file (``--config FILE``) or
``--HamiHubService.<name>=value`` on the command line, and most default to
what JupyterHub gives a managed service in its environment
(``JUPYTERHUB_API_URL``, ``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_SERVICE_URL``,
``JUPYTERHUB_SERVICE_PREFIX``), so a service entry with only a command works.

Every ``refresh_interval`` seconds it asks the Hub for the running servers,
reads them all at once through the proxy, builds the document and adds one
sample to the history; requests are answered from the last document, so a
busy hub view never multiplies the load on the servers. An action refreshes
before it answers, so its effect shows in the next read.

The service keeps no state of its own beyond the history of the last
minutes: the Hub knows the servers, the servers know their slices.

JupyterHub's own code (its OAuth, :mod:`.handlers`) is imported only when the
service starts, so that ``--help`` and ``--help-all`` work where JupyterHub is
not installed; the ``hami-jupyter`` command then names the extra to install.
"""

import asyncio
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from tornado import web
from tornado.httpclient import AsyncHTTPClient
from traitlets import Bool, Float, Integer, List, Unicode, default
from traitlets.config import Application

from .. import __version__, audit
from ..slice.paths import default_root
from . import document as doc
from . import metrics
from .actions import Actions
from .history import History
from .hub_api import HubAPI, HubAPIError
from .servers import Servers

NODE_VARIABLE = "HAMI_NODE_NAME"  # as the server extension reads it (server/host.py)


def _origin(url):
    parsed = urlparse(url or "")
    return f"{parsed.scheme}://{parsed.netloc}" if parsed.scheme and parsed.netloc else ""


class HamiHubService(Application):
    """The hub-wide view of every node, GPU, slice and kernel, as a JupyterHub service."""

    name = "hami-jupyter hub-service"
    version = __version__
    description = ("One view of every JupyterHub server's GPU slices: per node, per GPU, per "
                   "user; actions on kernels and slices for administrators.")

    aliases = {
        "config": "HamiHubService.config_file",
        "proxy-url": "HamiHubService.proxy_url",
        "refresh": "HamiHubService.refresh_interval",
        "timeout": "HamiHubService.server_timeout",
        "admin-group": "HamiHubService.admin_groups",
        "slice-root": "HamiHubService.slice_root",
        "node": "HamiHubService.node",
        "next-sizes-file": "HamiHubService.next_sizes_file",
        "size": "HamiHubService.sizes",
        "log-level": "Application.log_level",
    }
    flags = {
        "kubernetes": ({"HamiHubService": {"kubernetes": True}},
                       "slices are pods' (resizes take effect at the next start)"),
        "no-stop-server": ({"HamiHubService": {"allow_stop_server": False}},
                           "do not offer to stop servers"),
    }

    config_file = Unicode("", config=True, help="A Python config file (c.HamiHubService.*).")

    hub_api_url = Unicode(config=True, help="The Hub REST API. Default: $JUPYTERHUB_API_URL.")
    api_token = Unicode(config=True, help="The service's token. Default: $JUPYTERHUB_API_TOKEN.")
    service_url = Unicode(config=True, help="Where the service listens. Default: "
                                            "$JUPYTERHUB_SERVICE_URL, else http://127.0.0.1:10101.")
    service_prefix = Unicode(config=True, help="The URL prefix the proxy routes to the service. "
                                               "Default: $JUPYTERHUB_SERVICE_PREFIX, else "
                                               "/services/hami-hub/.")
    proxy_url = Unicode(config=True, help=(
        "Origin of the hub's proxy, through which the servers are read "
        "(http://127.0.0.1:8000). Default: $HAMI_HUB_PROXY_URL, else the origin of "
        "$JUPYTERHUB_PUBLIC_URL, else http://127.0.0.1:8000 (JupyterHub's default bind_url)."))

    refresh_interval = Float(5.0, config=True, help="Seconds between refreshes (one history "
                                                    "sample each).")
    server_timeout = Float(3.0, config=True, help="Seconds a server may take to answer a "
                                                  "refresh before it is listed as unreachable.")
    action_timeout = Float(120.0, config=True, help="Seconds a park, resume or restart may take.")
    history_seconds = Float(600.0, config=True, help="How far back the charts' history goes "
                                                     "(kept in memory only).")
    max_clients = Integer(64, config=True, help="Servers read at the same time.")
    admin_groups = List(Unicode(), config=True, help=(
        "JupyterHub groups whose members may use the hub view and its actions, besides "
        "JupyterHub admins. Their tokens need access:services!service=<name> too (see "
        "hami_jupyter.hub.register_hub_service)."))
    allow_stop_server = Bool(True, config=True, help="Offer stopping a server (needs the "
                                                     "delete:servers scope).")
    kubernetes = Bool(config=True, help=(
        "Slices are pods' (KubeSpawner with HAMi): a resize takes effect at the next server "
        "start. Default: True when $KUBERNETES_SERVICE_HOST is set (the hub runs in a pod)."))
    node = Unicode(config=True, help=(
        "The node whose limits files this service holds: slices there may be resized live. "
        "Default: $HAMI_NODE_NAME, else the host name."))
    slice_root = Unicode(config=True, help="Where the hub keeps that node's slices (default as "
                                           "everywhere: $HAMI_SLICE_ROOT, /run/hami-jupyter, ...).")
    audit_log = Unicode("", config=True, help="The audit log (default: <slice_root>/audit.log).")
    next_sizes_file = Unicode(None, allow_none=True, config=True, help=(
        "Where administrators' picks for users' next starts go (the same file as "
        "SlicePolicy.next_sizes_file); None: no such picks."))
    sizes = List(Unicode(), config=True, help="The policy's size names, offered as next sizes.")
    memory_oversubscription = Float(None, allow_none=True, config=True, help=(
        "The policy's SlicePolicy.memory_oversubscription in force when the hub admits starts "
        "by the GPUs' room (None: it does not), shown beside each GPU's caps."))

    @default("hub_api_url")
    def _hub_api_url(self):
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _api_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("service_url")
    def _service_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")

    @default("service_prefix")
    def _service_prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/hami-hub/")

    @default("proxy_url")
    def _proxy_url(self):
        return (os.environ.get("HAMI_HUB_PROXY_URL")
                or _origin(os.environ.get("JUPYTERHUB_PUBLIC_URL"))
                or "http://127.0.0.1:8000")

    @default("kubernetes")
    def _kubernetes(self):
        return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))

    @default("node")
    def _node(self):
        import socket

        return os.environ.get(NODE_VARIABLE) or socket.gethostname()

    @default("slice_root")
    def _slice_root(self):
        return str(default_root())

    # ---- state ----

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file:
            path = Path(self.config_file)
            self.load_config_file(path.name, path=str(path.parent))
        self.document = doc.build([], time.time(), hub_error="not refreshed yet")
        self.refs = {}
        self.history = History(self.history_seconds)
        self.registry = metrics.registry(lambda: self.document)
        self.actions = Actions(self)
        self._refreshing = asyncio.Lock()

    def audit_path(self):
        return Path(self.audit_log) if self.audit_log else audit.default_path(Path(self.slice_root))

    def server_ref(self, user, name=""):
        return self.refs.get(f"{user}/{name}")

    def is_admin(self, model):
        """A JupyterHub admin, or a member of one of :attr:`admin_groups`."""
        return bool(model.get("admin")) or bool(set(model.get("groups") or ())
                                                & set(self.admin_groups))

    def view(self, viewer):
        """The document as ``GET api/hub`` answers it."""
        return {**self.document, "history": self.history.as_dict(), "viewer": viewer,
                "service": {"refresh_seconds": self.refresh_interval,
                            "server_timeout": self.server_timeout, "node": self.node,
                            "kubernetes": self.kubernetes, "sizes": list(self.sizes),
                            "next_sizes": bool(self.next_sizes_file),
                            "allow_stop_server": self.allow_stop_server,
                            "memory_oversubscription": self.memory_oversubscription,
                            "slice_root": self.slice_root}}

    # ---- refreshing ----

    async def refresh(self):
        """Read the hub and every server once; the new document and one history sample.
        One refresh at a time: an action's refresh waits for the loop's."""
        async with self._refreshing:
            return await self._refresh()

    async def _refresh(self):
        hub_error = None
        try:
            refs = await self.hub_api.running_servers()
        except HubAPIError as e:
            hub_error = str(e)
            refs = list(self.refs.values())  # the last listing, read again
            self.log.warning("hami-jupyter hub-service: %s", e)
        readings = await self.servers.read_all(refs)
        self.refs = {r.key: r for r in refs}
        self.document = doc.build(readings, time.time(), hub_error)
        self.history.add(self.document)
        return self.document

    async def refresh_after(self, what):
        """Refresh at once after an action, so that its answer, and the next read
        of the document, show its effect (*what* names it in the log if that fails)."""
        try:
            await self.refresh()
        except Exception:
            self.log.exception("hami-jupyter hub-service: refresh after %s failed", what)

    async def _loop(self, stop):
        """Refresh every ``refresh_interval`` until *stop* is set. A refresh in
        flight when it is set is abandoned: a hub or server that does not
        answer must not hold the service past the hub's stop (seconds)."""
        stopping = asyncio.ensure_future(stop.wait())
        while not stop.is_set():
            started = time.monotonic()
            refresh = asyncio.ensure_future(self.refresh())
            await asyncio.wait({refresh, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not refresh.done():
                refresh.cancel()
                await asyncio.gather(refresh, return_exceptions=True)
                break
            if not refresh.cancelled() and refresh.exception() is not None:
                # keep serving the last document; try again next time
                self.log.error("hami-jupyter hub-service: refresh failed",
                               exc_info=refresh.exception())
            pause = max(self.refresh_interval - (time.monotonic() - started), 0.05)
            await asyncio.wait({stopping}, timeout=pause)
        stopping.cancel()

    # ---- serving ----

    def make_app(self):
        from jupyterhub.services.auth import HubOAuth

        from .handlers import (ActionHandler, HubHandler, MetricsHandler, OAuthCallbackHandler,
                               TargetsHandler)

        prefix = self.service_prefix if self.service_prefix.endswith("/") else self.service_prefix + "/"
        hub_auth = HubOAuth(api_url=self.hub_api_url, api_token=self.api_token, base_url=prefix,
                            cache_max_age=60, parent=self)
        settings = {"hami_service": self, "hub_auth": hub_auth,
                    "cookie_secret": secrets.token_bytes(32), "login_url": hub_auth.login_url}
        return web.Application([
            (rf"{prefix}api/hub/?", HubHandler),
            (rf"{prefix}api/actions/?", ActionHandler),
            (rf"{prefix}api/targets/?", TargetsHandler),
            (rf"{prefix}metrics/?", MetricsHandler),
            (rf"{prefix}oauth_callback", OAuthCallbackHandler),
        ], **settings)

    def _check(self):
        problems = []
        if not self.api_token:
            problems.append("no API token: run it as a JupyterHub service (JUPYTERHUB_API_TOKEN) "
                            "or set HamiHubService.api_token")
        if self.refresh_interval <= 0 or self.server_timeout <= 0:
            problems.append("refresh_interval and server_timeout must be above 0 seconds")
        return problems

    async def _serve(self):
        client = AsyncHTTPClient(max_clients=self.max_clients)
        self.hub_api = HubAPI(self.hub_api_url, self.api_token, client)
        self.servers = Servers(self.proxy_url, self.api_token, client, self.server_timeout,
                               self.action_timeout)
        bind = urlparse(self.service_url)
        server = self.make_app().listen(bind.port or 80, bind.hostname or "127.0.0.1")
        self.log.info("hami-jupyter hub-service: %s%s on %s, reading servers through %s every "
                      "%g s", self.service_url.rstrip("/"), self.service_prefix, self.node,
                      self.proxy_url, self.refresh_interval)
        # JupyterHub stops a managed service with SIGINT, then SIGTERM: either ends
        # the service cleanly (exit 0), not with a traceback in the hub's log.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await self._loop(stop)
        self.log.info("hami-jupyter hub-service: stopping")
        server.stop()
        client.close()

    def start(self):
        # Without JupyterHub: ModuleNotFoundError before anything else is said.
        from . import handlers  # noqa: F401

        problems = self._check()
        if problems:
            for p in problems:
                print(f"hami-jupyter hub-service: error: {p}", file=sys.stderr)
            self.exit(1)
        asyncio.run(self._serve())


def main(argv=None):
    """Run the service; its exit status."""
    app = HamiHubService()
    app.initialize(argv)
    app.start()
    return 0
