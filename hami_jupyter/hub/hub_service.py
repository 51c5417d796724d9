"""Registering ``hami-jupyter hub-service`` in ``jupyterhub_config.py``: one call.

::

    from hami_jupyter.hub import SlicePolicy, register_hub_service
    policy = SlicePolicy(config=c)
    register_hub_service(c, policy, admin_groups=["gpu-admins"])

It adds to the config what the service needs and nothing more:

- a managed service (``c.JupyterHub.services``) named *name* that runs
  ``hami-jupyter hub-service`` on loopback; its settings come from the policy
  (the slice root, the size names, the next-sizes file, the oversubscription
  its admission holds caps to) and the arguments;
- a role for it (``c.JupyterHub.load_roles``) with these scopes, each for one
  reason: ``list:users`` (find every user with a running server),
  ``read:servers`` (their servers' URLs and state), ``read:users:activity``
  (when each user was last active), ``access:servers`` (read each server's
  ``hami/v1/slices`` and act on its kernels through the proxy), and
  ``delete:servers`` only when *allow_stop_server* (stop a server). Nothing
  lets it start servers, read tokens or change users;
- ``access:services!service=<name>`` in the tokens JupyterHub gives
  single-user servers (``c.Spawner.server_token_scopes``, the server role's
  own scopes kept): a kernel's ``AdminPanel()`` shows the hub view with the
  token of its server. A token gets only scopes its user holds: JupyterHub
  admins hold it; members of *admin_groups* are given it by a second role;
  everyone else's token lacks it, and the service answers them 403;
- ``HAMI_HUB_SERVICE_URL`` in the servers' environment: where the panel
  finds the service (through the proxy; *service_url* overrides it, e.g.
  ``http://proxy-public/services/hami-hub/`` for pods on Kubernetes).

Single host: the hub (root) and the service run on the node that holds the
limits files, so the service resizes slices there live, audit-logged. On
Kubernetes (*kubernetes*), sizes change at the next server start.

What it adds outlives a later plain assignment in the same file: an
administrator's ``c.JupyterHub.load_roles = [...]`` (a Prometheus role, say)
or ``c.Spawner.environment = {...}`` below the call once dropped the
service's role, and the service got 403 from the hub every few seconds. The
call makes the two config sections it writes :class:`KeepingSection`: an
assignment there is merged with what the call added (the administrator's
entries first, and theirs win on a name or key both hold).
"""

import os
import shutil
import sys
from urllib.parse import urlparse

from traitlets.config import Config

SERVER_ROLE_SCOPES = ("users:activity!user", "access:servers!server")


class KeepingSection(Config):
    """A config section (``c.JupyterHub``, ``c.Spawner``) that keeps what
    :func:`register_hub_service` added to some of its settings through any later
    assignment of those settings (see the module docstring)."""

    def keep(self, key, value):
        """Keep *value* (a list or a dict) in the setting *key* from now on."""
        self.__dict__.setdefault("_hami_kept", {})[key] = value
        if key in self:
            self[key] = self[key]  # merged now, through __setitem__

    def __setitem__(self, key, value):
        ours = self.__dict__.get("_hami_kept", {}).get(key)
        if ours is not None:
            value = _merged(value, ours)
        super().__setitem__(key, value)


def _name(item):
    return item.get("name") if isinstance(item, dict) else item


def _merged(value, ours):
    """*value* with what of *ours* it lacks: a dict's keys, a list's entries by
    name (roles, services) or by value (scopes); anything else as it is (a
    callable ``server_token_scopes`` is the administrator's to extend)."""
    if isinstance(value, dict) and isinstance(ours, dict):
        return {**ours, **value}
    if isinstance(value, (list, tuple)) and isinstance(ours, list):
        names = {_name(item) for item in value}
        return [*value, *(item for item in ours if _name(item) not in names)]
    return value


def _keeping(c, name):
    """The config section *name* of *c*, made a :class:`KeepingSection`."""
    section = c[name]
    if not isinstance(section, KeepingSection):
        section = KeepingSection(section)
        c[name] = section
    return section


def service_scopes(allow_stop_server=True):
    """The scopes of the service's role (see the module docstring for why each)."""
    scopes = ["list:users", "read:servers", "read:users:activity", "access:servers"]
    if allow_stop_server:
        scopes.append("delete:servers")
    return scopes


def _proxy_url(c):
    """The origin of the hub's proxy, as this config sets it (JupyterHub's default otherwise)."""
    hub = c.JupyterHub
    if "bind_url" in hub:
        parsed = urlparse(hub.bind_url)
        host = parsed.hostname or "127.0.0.1"
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        scheme = parsed.scheme or "http"
    else:
        host = hub.ip if "ip" in hub and hub.ip else "127.0.0.1"
        port = hub.port if "port" in hub else 8000
        scheme = "http"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{scheme}://{host}:{port}"


def _command():
    here = os.path.join(sys.prefix, "bin", "hami-jupyter")
    return [here if os.access(here, os.X_OK) else (shutil.which("hami-jupyter") or here)]


def register_hub_service(c, policy=None, *, name="hami-hub", port=10101, url=None, listen=None,
                         proxy_url=None, service_url=None, admin_groups=(), refresh=5.0,
                         allow_stop_server=True, kubernetes=False, next_sizes_file=None,
                         extra_args=(), environment=None, spawner="Spawner"):
    """Add the hub service to JupyterHub config *c* (see the module docstring).

    *url* is where the proxy reaches the service (default
    ``http://127.0.0.1:<port>``); *listen*, where it listens when that differs
    (a pod: ``http://0.0.0.0:10101`` behind ``url="http://hub:10101"``).
    *proxy_url* is the origin the service reads the servers through (default:
    the hub's own bind URL as this config sets it). *extra_args* go to
    ``hami-jupyter hub-service`` as they are, *environment* into its
    environment. *spawner* names the config section of the servers' token
    scopes and environment: "KubeSpawner" under z2jh, which sets
    ``c.KubeSpawner.environment`` itself (a more specific section wins over
    ``c.Spawner``). Returns the service's entry of ``c.JupyterHub.services``."""
    proxy_url = (proxy_url or _proxy_url(c)).rstrip("/")
    base = c.JupyterHub.base_url if "base_url" in c.JupyterHub else "/"
    prefix = f"{base.rstrip('/')}/services/{name}/"
    args = [f"--proxy-url={proxy_url}", f"--HamiHubService.refresh_interval={refresh}"]
    args += [f"--HamiHubService.admin_groups={g}" for g in admin_groups]
    if listen:
        args.append(f"--HamiHubService.service_url={listen}")
    if not allow_stop_server:
        args.append("--no-stop-server")
    if kubernetes:
        args.append("--kubernetes")
    if policy is not None:
        args.append(f"--slice-root={policy.slice_root}")
        args += [f"--HamiHubService.sizes={s}" for s in policy.size_names]
        if policy.checks_admission and not kubernetes:
            args.append(f"--HamiHubService.memory_oversubscription={policy.oversubscription!r}")
        next_sizes_file = next_sizes_file or policy.next_sizes_file
    if next_sizes_file:
        args.append(f"--next-sizes-file={next_sizes_file}")
    entry = {
        "name": name,
        "url": url or f"http://127.0.0.1:{port}",
        "command": _command() + ["hub-service", *args, *extra_args],
        "oauth_no_confirm": True,
        "display": True,
        "info": {"description": "GPU slices of every server: per node, per GPU, per user"},
    }
    if environment:
        entry["environment"] = dict(environment)
    hub = _keeping(c, "JupyterHub")
    existing = hub.services if "services" in hub else []
    hub.services = [s for s in existing if s.get("name") != name] + [entry]
    hub.keep("services", [entry])

    roles = [{"name": name, "description": "hami-jupyter's hub view: reads every server's slices",
              "scopes": service_scopes(allow_stop_server), "services": [name]}]
    access = f"access:services!service={name}"
    if admin_groups:
        roles.append({"name": f"{name}-admins",
                      "description": "may use hami-jupyter's hub view (with JupyterHub admins)",
                      "scopes": [access], "groups": list(admin_groups)})
    loaded = hub.load_roles if "load_roles" in hub else []
    names = {r["name"] for r in roles}
    hub.load_roles = [r for r in loaded if r.get("name") not in names] + roles
    hub.keep("load_roles", roles)

    section = _keeping(c, spawner)
    scopes = section.server_token_scopes if "server_token_scopes" in section else None
    if callable(scopes):
        raise ValueError(f"c.{spawner}.server_token_scopes is a callable: add {access!r} to "
                         "what it returns yourself, then call register_hub_service before "
                         "setting it")
    scopes = list(scopes or SERVER_ROLE_SCOPES)
    if access not in scopes:
        scopes.append(access)
    section.server_token_scopes = scopes
    section.keep("server_token_scopes", [access])
    where = {"HAMI_HUB_SERVICE_URL": service_url or f"{proxy_url}{prefix}"}
    section.environment.update(where)
    section.keep("environment", where)
    return entry
