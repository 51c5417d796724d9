"""Each user's server, reached through the hub's proxy with the service's token.

The service never learns where a server really listens: the Hub API gives
its path (``/user/alice/``), and the proxy routes it, as it does for the
user's browser. The service's role holds ``access:servers``, which every
single-user server checks for its REST API, so the same token reads
``hami/v1/slices`` and acts on kernels.

All servers are read at once (one tornado ``AsyncHTTPClient``, no thread per
server), each with its own time limit, so one stuck server costs the refresh
at most that limit and never hides the others. What went wrong is kept as one
line for the document: the proxy's status when it could not reach the
server, the time limit when the server did not answer, the server's own
message otherwise.
"""

import asyncio
import json
import time
from urllib.parse import urlparse

from tornado.httpclient import HTTPClientError

from .document import Reading

SLICES_PATH = "hami/v1/slices"


def _message(body):
    """The "message" of a JSON error answer, else the first line of the text."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("message"):
            return str(data["message"])
    except ValueError:
        pass
    text = " ".join(text.split())
    return text[:200]


class ServerError(Exception):
    """A server call failed; *status* is the HTTP status (None: no answer at all)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class Servers:
    """Calls to single-user servers at *proxy_url* (origin of the hub's proxy)."""

    def __init__(self, proxy_url, token, client, timeout=3.0, action_timeout=120.0):
        self.proxy_url = proxy_url.rstrip("/")
        self.token, self.client = token, client
        self.timeout, self.action_timeout = timeout, action_timeout

    def url(self, ref, path):
        """The full URL of *path* under server *ref*."""
        base = ref.url if urlparse(ref.url).netloc else f"{self.proxy_url}{ref.url}"
        return base.rstrip("/") + "/" + path.lstrip("/")

    async def call(self, ref, method, path, body=None, timeout=None):
        """``(status, parsed JSON or None)``; :class:`ServerError` for any failure."""
        data = None if body is None else json.dumps(body)
        if data is None and method in ("POST", "PUT", "PATCH"):
            data = ""
        try:
            response = await self.client.fetch(
                self.url(ref, path), method=method, body=data,
                request_timeout=timeout or self.timeout, follow_redirects=False,
                headers={"Authorization": f"token {self.token}",
                         "Content-Type": "application/json"},
                allow_nonstandard_methods=True)
        except HTTPClientError as e:
            if e.code == 599:
                raise ServerError(f"no answer within {timeout or self.timeout:g} s "
                                  f"({e.message})") from None
            text = _message(e.response.body) if e.response is not None else ""
            raise ServerError(f"HTTP {e.code} {e.message}" + (f": {text}" if text else ""),
                              e.code) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ServerError(f"cannot connect: {e}") from None
        if response.code >= 300:  # a redirect: to a login page, the proxy's idea of a dead server
            raise ServerError(f"HTTP {response.code} (redirected to "
                              f"{response.headers.get('Location', '?')})", response.code)
        try:
            return response.code, json.loads(response.body) if response.body else None
        except ValueError:
            raise ServerError(f"HTTP {response.code} but not JSON: {_message(response.body)}",
                              response.code) from None

    async def read(self, ref):
        """*ref*'s ``hami/v1/slices`` as a :class:`~.document.Reading` (never raises)."""
        if not ref.ready:
            doing = {"spawn": "starting", "stop": "stopping"}.get(ref.pending)
            return Reading(ref, error=f"the server is {doing}" if doing
                           else "the hub says the server is not ready")
        started = time.monotonic()
        try:
            _, body = await self.call(ref, "GET", SLICES_PATH)
        except ServerError as e:
            return Reading(ref, error=str(e), seconds=time.monotonic() - started)
        if not isinstance(body, dict) or "slices" not in body:
            return Reading(ref, error="the server's answer is not hami-jupyter's (is hami-jupyter "
                                      "installed in the server's environment?)",
                           seconds=time.monotonic() - started)
        return Reading(ref, body=body, seconds=time.monotonic() - started)

    async def read_all(self, refs):
        """Every server of *refs* at once; one :class:`~.document.Reading` each, in order."""
        return list(await asyncio.gather(*(self.read(ref) for ref in refs)))
