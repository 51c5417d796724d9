"""The service's HTTP routes, under its prefix (``/services/<name>/``).

- ``GET api/hub``: the hub view (:mod:`.document` plus :mod:`.history`);
- ``POST api/actions``: one action (:mod:`.actions`), a JSON object;
- ``GET api/targets``: Prometheus HTTP service discovery (:mod:`.metrics`);
- ``GET metrics``: the per-node GPU totals, for Prometheus.

Who may ask: the hub authenticates every request (a token in the
``Authorization`` header, or a browser's login through the hub's OAuth), and
the token must carry ``access:services!service=<name>`` (JupyterHub's rule
for services). Then this service decides: a JupyterHub administrator, or a
member of one of ``admin_groups``, may read and act; any other user gets 403
(the hub view shows every user's kernels, and the actions act on them). A
*service* (Prometheus's token, say) may read, never act.
"""

import json

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web

from . import metrics
from .actions import ActionError


class _Base(HubOAuthenticated, web.RequestHandler):
    @property
    def service(self):
        return self.settings["hami_service"]

    @property
    def hub_auth(self):
        return self.settings["hub_auth"]

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"ok": False, "status": status_code, "message": message}))

    def who(self, act=False):
        """The caller's name when they may read (*act*: and act); else 403."""
        model = self.current_user
        if model is None:
            raise web.HTTPError(403, "the hub did not authenticate this request")
        if model.get("kind") == "service":
            if act:
                raise web.HTTPError(403, f"service {model['name']} may read the hub view, not act")
            return f"service {model['name']}"
        if not self.service.is_admin(model):
            raise web.HTTPError(403, f"{model['name']} is not an administrator of this hub: the "
                                     "hub view is for JupyterHub admins"
                                + (f" and members of {', '.join(self.service.admin_groups)}"
                                   if self.service.admin_groups else ""))
        return model["name"]

    def send_json(self, data, status=200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


class HubHandler(_Base):
    """``GET api/hub``."""

    @web.authenticated
    def get(self):
        viewer = self.who()
        self.send_json(self.service.view(viewer))


class ActionHandler(_Base):
    """``POST api/actions``."""

    @web.authenticated
    async def post(self):
        who = self.who(act=True)
        try:
            request = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        try:
            answer = await self.service.actions.run(request, who)
        except ActionError as e:
            self.send_json({"ok": False, "status": e.status, "message": str(e), **e.extra}, e.status)
            return
        self.send_json(answer)


class TargetsHandler(_Base):
    """``GET api/targets``: Prometheus HTTP service discovery."""

    @web.authenticated
    def get(self):
        self.who()
        self.send_json(metrics.targets(self.service.document, self.service.proxy_url))


class MetricsHandler(_Base):
    """``GET metrics``."""

    @web.authenticated
    def get(self):
        self.who()
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(metrics.exposition(self.service.registry))


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """Where the hub sends a browser back after login (the service's own HubOAuth)."""

    @property
    def hub_auth(self):
        return self.settings["hub_auth"]
