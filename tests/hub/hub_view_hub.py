"""A JupyterHub whose servers lie on two simulated nodes, with the hub service.

Shared by tests/hub/test_hub_service_e2e.py (the service's document and
actions, ``AdminPanel()`` at the Python level) and
tests/hub/test_hub_view_browser.py (``AdminPanel()`` in JupyterLab, in a
browser). :class:`HubViewHub` is conftest.py's ``Hub`` with each server placed
on "node-a" or "node-b" (``PLACE``): each node has its own slice root and its
own simulated GPU (``NODES``, its UUID), and its servers report the node's
name (``HAMI_NODE_NAME``). ``hami-jupyter hub-service`` runs as the hub's
managed service ``NAME``, registered by ``register_hub_service`` as a
deployment would, with node-a as its own node (the one whose limits files it
holds). ``ADMIN`` is a JupyterHub administrator.
"""

import contextlib
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SERVICE, SIZES, TAG_ENV, Hub, _require_jupyterhub
from leftovers import marker_env
from local_servers import free_ports, request_json

from hami_jupyter import native

MiB, GiB = 1 << 20, 1 << 30
CONTEXT = 64 * MiB  # the simulated GPU's context, charged to every slice that uses the GPU
NAME = "hami-hub"
REFRESH = 1.0
SERVER_TIMEOUT = 2.0
NODES = {
    "node-a": "GPU-aaaaaaaa-0000-4000-8000-00000000000a",
    "node-b": "GPU-bbbbbbbb-0000-4000-8000-00000000000b",
}
PLACE = {"alice": "node-a", "bob": "node-a", "ada": "node-a", "carol": "node-b"}
ADMIN = "ada"


def allocate(mib):
    return ("from hami_jupyter import driver_memory as c\n"
            "c.init()\n"
            f"bufs = [c.DeviceBuffer({mib} << 20)]\n")


class HubViewHub(Hub):
    extra_environment = {}  # more variables for every server (a subclass may add some)

    def __init__(self, tmp):
        super().__init__(tmp)
        (self.service_port,) = free_ports(1)
        self.roots = {node: tmp / f"slices-{node}" for node in NODES}
        self.slice_root = self.roots["node-a"]
        self.service_url = f"{self.url}/services/{NAME}/"
        self.kernels, self.tokens = {}, {}

    def write_config(self, chp):
        node_env = {}
        for node, gpu in NODES.items():
            state = self.tmp / f"sim-{node}" / "state"
            state.parent.mkdir()
            node_env[node] = {"HAMI_NODE_NAME": node, "HAMI_SIM_UUIDS": gpu,
                              **native.sim_env(state, base={}, HAMI_SIM_DEVICES="1",
                                               HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m")}
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        environment = {TAG_ENV: self.tag, "PATH": path, "PYDEVD_DISABLE_FILE_VALIDATION": "1",
                       **marker_env(), **self.extra_environment}
        roots = {n: str(r) for n, r in self.roots.items()}
        config = textwrap.dedent("""\
            # Written by tests/hub/hub_view_hub.py for one test run.
            from traitlets.config import Config

            from hami_jupyter.hub import SlicePolicy, register_hub_service
            from hami_jupyter.hub.spawner import pre_spawn_hook

            c = get_config()  # noqa: F821
            """) + self.plumbing(chp) + self.local_servers(environment) + textwrap.dedent(f"""\
            # The hub's own check of a dead server waits: the service must see it first.
            c.Spawner.poll_interval = 600
            c.Authenticator.admin_users = {{{ADMIN!r}}}

            NODE_ENV = {node_env!r}
            PLACE = {PLACE!r}
            policies = {{}}
            for node, root in {roots!r}.items():
                pc = Config()
                pc.SlicePolicy.sizes = {SIZES!r}
                pc.SlicePolicy.default = "small"
                pc.SlicePolicy.offer = {{"*": ["small", "large"]}}
                pc.SlicePolicy.slice_root = root
                policies[node] = SlicePolicy(config=pc)
            policies["node-a"].configure_spawner(c)
            hooks = {{node: pre_spawn_hook(p) for node, p in policies.items()}}

            def place(spawner):
                node = PLACE[spawner.user.name]
                spawner.environment.update(NODE_ENV[node])
                hooks[node](spawner)

            c.Spawner.pre_spawn_hook = place
            register_hub_service(
                c, policies["node-a"], name={NAME!r}, port={self.service_port},
                refresh={REFRESH}, admin_groups=["gpu-admins"],
                extra_args=["--node=node-a", "--timeout={SERVER_TIMEOUT}"],
                environment={{{TAG_ENV!r}: {self.tag!r}}})
            # More roles, the way an administrator writes them: below the call, a
            # plain assignment (issue 35, item 14). The service's role outlives it.
            c.JupyterHub.load_roles = [
                c.JupyterHub.load_roles[0],  # the test's own service (conftest.py's plumbing)
                # The test's own service makes tokens and groups for the users.
                {{"name": "e2e-setup", "scopes": ["tokens", "admin:groups"], "services": [{SERVICE!r}]}},
                # Users who may reach the service without being its administrators.
                {{"name": "viewers", "scopes": ["access:services!service={NAME}"], "groups": ["viewers"]}},
            ]
            """)
        path = self.tmp / "jupyterhub_config.py"
        path.write_text(config)
        return path

    def spawn(self, user, options=None, expect=(201, 202)):
        if user == ADMIN:  # made at start, as admin_users
            self.api("POST", f"users/{user}/server", options or {}, expect=set(expect))
            self.users.append(user)
            return None
        return super().spawn(user, options, expect)

    # ---- the service ----

    def user_token(self, user, scopes=None):
        """A new API token of *user* (scopes: as requested, else the user's own)."""
        body = {"note": "hub service e2e"} | ({"scopes": scopes} if scopes is not None else {})
        return self.api("POST", f"users/{user}/tokens", body, expect={200, 201})["token"]

    def view(self, path="api/hub", token=None, method="GET", body=None):
        """``(status, answer)`` of the service through the proxy."""
        return request_json(method, self.service_url + path, token or self.tokens[ADMIN], body)

    def document(self):
        status, doc = self.view()
        assert status == 200, f"GET api/hub answered {status}: {doc}\n{self.log_tail()}"
        return doc

    def wait_document(self, check, timeout=20, what="the hub view"):
        """The first document *check* accepts (returns truthy for), within *timeout* s."""
        deadline = time.monotonic() + timeout
        while True:
            doc = self.document()
            if check(doc):
                return doc
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not come within {timeout} s; last document:\n"
                            f"{json.dumps(doc, indent=1)[:6000]}\n{self.log_tail()}", pytrace=False)
            time.sleep(0.3)

    def act(self, token=None, **request):
        return self.view("api/actions", token, "POST", request)


@contextlib.contextmanager
def running(hub):
    """*hub* started, and stopped on the way out; fails the test when processes
    of the hub outlived it. What the modules' ``view_hub`` fixtures yield."""
    _require_jupyterhub()
    try:
        hub.start()
        yield hub
    finally:
        left = hub.stop()
    if left:
        pytest.fail("processes of the hub outlived it and were killed: "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left), pytrace=False)


def kernels_of(doc):
    """``{kernel_id: (node, gpu uuid or None, kernel entry)}`` of a document."""
    found = {}
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            for s in gpu["slices"]:
                for k in s["kernels"]:
                    found[k["kernel_id"]] = (node["node"], gpu["uuid"], k)
        for k in node["kernels_without_gpu"]:
            found.setdefault(k["kernel_id"], (node["node"], None, k))
    return found


def slice_on(doc, node, name):
    for n in doc["nodes"]:
        if n["node"] == node:
            for gpu in n["gpus"]:
                for s in gpu["slices"]:
                    if s["slice"] == name:
                        return gpu, s
    return None, None
