"""The hub service, as a kernel's admin panel reaches it.

A single-user server's environment, and so every kernel's, holds what is
needed: ``HAMI_HUB_SERVICE_URL`` (where the service is; the hub config puts
it there, see :func:`hami_jupyter.hub.register_hub_service`) and
``JUPYTERHUB_API_TOKEN`` (the server's token, which JupyterHub gives the
scope ``access:services!service=<name>`` only where its user holds it:
administrators). The service checks the token with the hub and answers a
non-administrator 403, which the panel turns into a one-line note.

Plain ``urllib``, synchronous: the panel calls it from its refresh thread.
"""

import json
import os
import urllib.error
import urllib.request

URL_VARIABLE = "HAMI_HUB_SERVICE_URL"
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
TIMEOUT_S = 10.0
ACTION_TIMEOUT_S = 180.0  # a park or resume of a large kernel takes a while

# No proxy from the environment: the service is the hub's, reached as the hub routes it.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HubServiceError(Exception):
    """The service refused or failed; *status* is the HTTP status (None: no
    answer), *body* the JSON answer when there was one."""

    def __init__(self, message, status=None, body=None):
        super().__init__(message)
        self.status, self.body = status, body or {}


class HubClient:
    """Calls to the hub service at *url* (ending in ``/``) with *token*."""

    def __init__(self, url, token):
        self.url = url if url.endswith("/") else url + "/"
        self.token = token

    @classmethod
    def from_environment(cls, env=None):
        """The client the environment describes, or None when it describes none."""
        env = os.environ if env is None else env
        url, token = env.get(URL_VARIABLE), env.get(TOKEN_VARIABLE)
        return cls(url, token) if url and token else None

    def _call(self, method, path, body=None, timeout=TIMEOUT_S):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"token {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with _opener.open(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = {}
            message = (answer.get("message") if isinstance(answer, dict) else None) or e.reason
            raise HubServiceError(str(message), e.code, answer if isinstance(answer, dict) else {}) \
                from None
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise HubServiceError(f"the hub service at {self.url} did not answer: {reason}") \
                from None
        try:
            return json.loads(raw)
        except ValueError:
            raise HubServiceError(f"the hub service at {self.url} did not answer with JSON") \
                from None

    def document(self):
        """``GET api/hub``: the hub view."""
        return self._call("GET", "api/hub")

    def act(self, **request):
        """``POST api/actions``: one action (see :mod:`hami_jupyter.hubview.actions`);
        the answer, or :class:`HubServiceError` with the service's message."""
        return self._call("POST", "api/actions", request, timeout=ACTION_TIMEOUT_S)


def connect(env=None):
    """``(client and its first document, or None; a note when None)``.

    None and no note: the environment names no hub service (no hub, or one
    without it). None and a note: it does, but the service refused this user
    (not an administrator) or did not answer; the note says which, in a line.
    """
    client = HubClient.from_environment(env)
    if client is None:
        return None, None, None
    try:
        first = client.document()
    except HubServiceError as e:
        if e.status == 403:
            return None, None, ("the hub view is for JupyterHub administrators (the hub service "
                                "answered 403): this shows this server's host only")
        return None, None, f"the hub view is unavailable ({e}); this is this server's host only"
    return client, first, None
