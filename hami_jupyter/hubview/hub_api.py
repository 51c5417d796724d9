"""The Hub REST API, as the service uses it: who runs a server, and stopping one.

The service asks with its own token (``JUPYTERHUB_API_TOKEN``, which the
hub gives every managed service) and needs these scopes of its role:

- ``list:users``: ``GET /users?state=active``, every user with a server
  that is running, starting or stopping;
- ``read:servers``: the ``servers`` of each user in that list (URL, ready,
  pending);
- ``read:users:activity``: each user's last activity, shown beside them;
- ``delete:servers``: ``DELETE /users/<name>/servers/<server>``, only where
  stopping servers is offered (``HamiHubService.allow_stop_server``).

Lists are paged (JupyterHub's pagination header): a hub with more users than
one page holds is read to the end.
"""

import json
from urllib.parse import quote

from tornado.httpclient import HTTPClientError

from .document import ServerRef

PAGE = 200
PAGINATION = "application/jupyterhub-pagination+json"


class HubAPIError(Exception):
    """The Hub API did not answer as it should; the message says how."""


class HubAPI:
    """The Hub REST API at *url* (``.../hub/api``) with *token*, through *client*
    (a tornado ``AsyncHTTPClient``)."""

    def __init__(self, url, token, client, timeout=10.0):
        self.url, self.token, self.client, self.timeout = url.rstrip("/"), token, client, timeout

    async def _call(self, method, path, accept="application/json"):
        try:
            response = await self.client.fetch(
                f"{self.url}/{path}", method=method, request_timeout=self.timeout,
                headers={"Authorization": f"token {self.token}", "Accept": accept},
                allow_nonstandard_methods=True)
        except HTTPClientError as e:
            body = e.response.body.decode(errors="replace") if e.response is not None else ""
            try:
                body = json.loads(body).get("message") or body
            except (ValueError, AttributeError):
                pass
            raise HubAPIError(f"{method} {path}: HTTP {e.code} {body}".strip()) from None
        except OSError as e:
            raise HubAPIError(f"{method} {path}: the hub did not answer: {e}") from None
        return json.loads(response.body) if response.body else None

    async def running_servers(self):
        """Every server the hub counts as active (ready or pending), as :class:`ServerRef`."""
        refs, offset = [], 0
        while True:
            page = await self._call("GET", f"users?state=active&offset={offset}&limit={PAGE}",
                                    accept=PAGINATION)
            if isinstance(page, dict):
                items, following = page.get("items", []), (page.get("_pagination") or {}).get("next")
            else:  # a hub without pagination answers the whole list
                items, following = page or [], None
            for user in items:
                for name, server in (user.get("servers") or {}).items():
                    refs.append(ServerRef(
                        user=user["name"], name=name, url=server.get("url") or "",
                        ready=bool(server.get("ready")), pending=server.get("pending"),
                        started=server.get("started"), last_activity=server.get("last_activity"),
                        user_last_activity=user.get("last_activity")))
            if not following:
                return refs
            offset = following.get("offset", offset + len(items))

    async def stop_server(self, user, name=""):
        """Ask the hub to stop *user*'s server *name*. Returns once the hub has
        taken the request (204: stopped; 202: it is stopping)."""
        path = f"users/{quote(user, safe='')}/server"
        if name:
            path += f"s/{quote(name, safe='')}"
        await self._call("DELETE", path)
