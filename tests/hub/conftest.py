"""A real JupyterHub on loopback for the end-to-end test.

* ``hub`` (one per module): a running ``python -m jupyterhub`` (dummy authenticator,
  ``SimpleLocalProcessSpawner``, configurable-http-proxy) whose spawner is
  wired to a :class:`hami_jupyter.hub.SlicePolicy` with two sizes, "small"
  (1 GiB, SM 25 %, hard; the default) and "large" (2 GiB, SM 50 %, elastic;
  offered to everyone). Single-user servers see the simulated GPU. The test
  talks to it as a service holding an API token (``hub.api``), and to the
  single-user servers through the proxy (``hub.server_api``,
  ``hub.execute``); everything it and its servers log goes to
  ``hub.log_path``, whose tail failures quote. Teardown stops the servers,
  then the hub, then anything of this hub still alive (found by a tag in
  every process's environment), each step bounded; a process that outlived
  the hub fails the test.
* ``admitting_hub`` (one per module): the same, with admission on
  (``memory_oversubscription``) and the sizes ``whole`` (16 GiB, the
  simulated GPU's all) and ``shared`` (8 GiB, 2 GiB guaranteed) offered too;
  its hub reads no NVML; its servers' kernels wait up to 30 s for GPU room.

Without JupyterHub and Jupyter Server installed the test is skipped, unless
``HAMI_REQUIRE_HUB_E2E`` is set (dev/test.sh sets it): then it fails, so CI
can never skip it silently. configurable-http-proxy comes from PATH, else
from ``node_modules/`` of this checkout (dev/hub-deps.sh installs it there).
"""

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from cell_result import run_over_websocket
from leftovers import marker_env
from local_servers import end_tagged, free_ports, log_tail, request_json

from hami_jupyter import native

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "HAMI_REQUIRE_HUB_E2E"
# Marks every process of one hub: the hub itself, the proxy (it inherits the
# hub's environment), the single-user servers (Spawner.environment) and their
# kernels (they inherit the server's). Teardown finds leftovers by it.
TAG_ENV = "HAMI_HUB_E2E_TAG"
SERVICE = "hami-e2e"

HUB_START_TIMEOUT = 30
SERVER_START_TIMEOUT = 60
REQUEST_TIMEOUT = 30
CELL_TIMEOUT = 30
STOP_TIMEOUT = 15

SIZES = {
    "small": {"memory": "1g", "sm": 25},
    "large": {"memory": "2g", "sm": 50, "mode": "elastic"},
}

def _require_jupyterhub():
    missing = []
    for module in ("jupyterhub", "jupyter_server"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if not missing:
        return
    why = (f"the JupyterHub end-to-end test needs {' and '.join(missing)} "
           f"(`pip install -e '.[test]'`)")
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{why}, and {REQUIRE_ENV} is set", pytrace=False)
    pytest.skip(why)


def find_chp():
    """configurable-http-proxy: PATH first, then this checkout's node_modules/."""
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    pytest.fail("configurable-http-proxy not found on PATH nor in node_modules/; "
                "run dev/hub-deps.sh (it needs npm)", pytrace=False)


class Hub:
    python = sys.executable  # runs the hub (a subclass may pick another)
    policy_lines = ""  # config lines of a module's own, before the policy is built

    def __init__(self, tmp):
        self.tmp = tmp
        self.slice_root = tmp / "slices"
        self.log_path = tmp / "jupyterhub.log"
        self.tag = uuid.uuid4().hex
        self.token = secrets.token_hex(24)
        self.port, self.hub_port, self.api_port = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.users = []

    # ---- start -------------------------------------------------------------

    def sim_env(self, base):
        """*base* and the simulated GPU of this hub's servers: one of 16 GiB, contexts of 64 MiB."""
        return native.sim_env(self.tmp / "sim-state", base=base, HAMI_SIM_DEVICES="1",
                              HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m")

    def write_config(self, chp):
        sim = self.sim_env({})
        environment = {
            **sim,
            **marker_env(),  # the session's check finds what outlives the test (tests/leftovers.py)
            TAG_ENV: self.tag,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        config = textwrap.dedent("""\
            # Written by tests/hub/conftest.py for one test run.
            from hami_jupyter.hub import SlicePolicy

            c = get_config()  # noqa: F821
            """) + self.plumbing(chp) + self.local_servers(environment) + textwrap.dedent(f"""\

            c.SlicePolicy.sizes = {SIZES!r}
            c.SlicePolicy.default = "small"
            c.SlicePolicy.offer = {{"*": ["small", "large"]}}
            c.SlicePolicy.slice_root = {str(self.slice_root)!r}
            """) + textwrap.dedent(self.policy_lines) + textwrap.dedent("""            SlicePolicy(config=c).configure_spawner(c)
            """)
        path = self.tmp / "jupyterhub_config.py"
        path.write_text(config)
        return path

    def local_servers(self, environment):
        """Config lines of servers run as local processes of this Python
        (``jupyterhub.singleuser``) with *environment*, homes under the test's folder."""
        cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
        args = ["--allow-root"] if os.geteuid() == 0 else []
        return textwrap.dedent(f"""\
            c.JupyterHub.spawner_class = "simple"
            c.SimpleLocalProcessSpawner.home_dir_template = {str(self.tmp / "home" / "{username}")!r}
            c.Spawner.cmd = {cmd!r}
            c.Spawner.args = {args!r}
            c.Spawner.environment = {environment!r}
            """)

    def plumbing(self, chp):
        """Config lines every test hub has: loopback ports, the proxy, a
        private database and secrets, the dummy authenticator, the test's
        service and its token, and the servers' time limits."""
        return textwrap.dedent(f"""\
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.ConfigurableHTTPProxy.command = [{chp!r}]
            c.ConfigurableHTTPProxy.pid_file = {str(self.tmp / "proxy.pid")!r}
            c.JupyterHub.db_url = {"sqlite:///" + str(self.tmp / "jupyterhub.sqlite")!r}
            c.JupyterHub.cookie_secret_file = {str(self.tmp / "cookie_secret")!r}
            c.JupyterHub.pid_file = {str(self.tmp / "jupyterhub.pid")!r}
            c.JupyterHub.authenticator_class = "dummy"
            c.Spawner.start_timeout = {SERVER_START_TIMEOUT}
            c.Spawner.http_timeout = {SERVER_START_TIMEOUT}
            # Answer spawn and stop requests at once (202): both users' servers
            # start side by side, and the test polls.
            c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0, "slow_stop_timeout": 0}}
            # JupyterHub gives each server a port by binding port 0 and letting it
            # go; two servers spawned together can get the same one (seen in CI: ada's
            # server could not bind, and the proxy sent ada's requests to bob's). This
            # hub never gives a port twice.
            import jupyterhub.spawner
            _random_port, _given = jupyterhub.spawner.random_port, set()
            def _new_port():
                port = _random_port()
                while port in _given:
                    port = _random_port()
                _given.add(port)
                return port
            jupyterhub.spawner.random_port = _new_port
            c.JupyterHub.services = [{{"name": {SERVICE!r}, "api_token": {self.token!r}}}]
            c.JupyterHub.load_roles = [{{
                "name": {SERVICE!r},
                "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"],
                "services": [{SERVICE!r}],
            }}]
            """)

    def start(self):
        config = self.write_config(find_chp())
        # None of the limits or hub settings of the shell running the tests.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HAMI_", "CUDA_", "JUPYTERHUB_")) and k != "LD_PRELOAD"}
        env.update({TAG_ENV: self.tag, "PYTHONUNBUFFERED": "1"})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "jupyterhub", "-f", str(config)],
                cwd=self.tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + HUB_START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"jupyterhub exited with {self.proc.returncode} at start-up\n"
                            f"{self.log_tail()}", pytrace=False)
            try:
                status, _ = self.request("GET", f"{self.url}/hub/api/", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyterhub did not answer on {self.url} within "
                            f"{HUB_START_TIMEOUT} s\n{self.log_tail()}", pytrace=False)
            time.sleep(0.2)

    # ---- talking to it ---------------------------------------------------------

    def log_tail(self, chars=8000):
        return log_tail(self.log_path, chars, "hub")

    def request(self, method, url, body=None, timeout=REQUEST_TIMEOUT):
        """``(status, parsed JSON or text)``; HTTP errors are returned, not raised."""
        return request_json(method, url, self.token, body, timeout)

    def api(self, method, path, body=None, expect=None):
        """The hub's REST API at ``/hub/api/<path>``; *expect*: allowed statuses."""
        status, reply = self.request(method, f"{self.url}/hub/api/{path}", body)
        if expect is not None and status not in expect:
            pytest.fail(f"{method} /hub/api/{path} answered {status}: {reply}\n{self.log_tail()}",
                        pytrace=False)
        return reply

    def server_api(self, user, method, path, body=None, expect=None):
        """A single-user server's REST API, through the proxy."""
        status, reply = self.request(method, f"{self.url}/user/{user}/api/{path}", body)
        if expect is not None and status not in expect:
            pytest.fail(f"{method} /user/{user}/api/{path} answered {status}: {reply}\n"
                        f"{self.log_tail()}", pytrace=False)
        return reply

    # ---- users and servers -------------------------------------------------------

    def spawn(self, user, options=None, expect=(201, 202)):
        """Create *user* and ask for their server (not waiting for it); the
        spawn request's ``(status, reply)``."""
        self.api("POST", f"users/{user}", expect={201, 409})  # 409: made already (an allowed user)
        self.users.append(user)
        status, reply = self.request("POST", f"{self.url}/hub/api/users/{user}/server",
                                     options or {})
        if status not in expect:
            pytest.fail(f"starting {user}'s server answered {status}: {reply}\n{self.log_tail()}",
                        pytrace=False)
        return status, reply

    def wait_spawn(self, user, timeout=SERVER_START_TIMEOUT):
        """Wait for *user*'s spawn to end: their server's model once it is
        ready, None when the spawn failed."""
        deadline = time.monotonic() + timeout
        while True:
            model = self.api("GET", f"users/{user}", expect={200})
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                return server
            if not server and not model.get("pending"):
                return None
            if time.monotonic() > deadline:
                pytest.fail(f"{user}'s spawn did not end within {timeout} s: {model}\n"
                            f"{self.log_tail()}", pytrace=False)
            time.sleep(0.25)

    def wait_ready(self, user, timeout=SERVER_START_TIMEOUT):
        server = self.wait_spawn(user, timeout)
        if server is None:
            pytest.fail(f"{user}'s server failed to start\n{self.log_tail()}", pytrace=False)
        return server

    def start_kernel(self, user, name="hami-python3"):
        return self.server_api(user, "POST", "kernels", {"name": name}, expect={201})["id"]

    def execute(self, user, kernel_id, code, timeout=CELL_TIMEOUT):
        """Run *code* in the kernel over its websocket, through the proxy."""
        from tornado.httpclient import HTTPClientError

        try:
            return asyncio.run(asyncio.wait_for(self._execute(user, kernel_id, code), timeout))
        except asyncio.TimeoutError:
            pytest.fail(f"{user}'s kernel {kernel_id} did not finish {code!r} within {timeout} s\n"
                        f"{self.log_tail()}", pytrace=False)
        except (HTTPClientError, OSError) as e:  # the websocket to the kernel did not open
            pytest.fail(f"cannot reach {user}'s kernel {kernel_id}: {e}\n{self.log_tail()}",
                        pytrace=False)

    async def _execute(self, user, kernel_id, code):
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        ws_url = f"ws://127.0.0.1:{self.port}/user/{user}/api/kernels/{kernel_id}/channels"
        # The server answers once the kernel replied to kernel_info: as long as the cell may take.
        conn = await websocket_connect(HTTPRequest(
            ws_url, headers={"Authorization": f"token {self.token}"},
            connect_timeout=CELL_TIMEOUT, request_timeout=CELL_TIMEOUT))
        try:
            return await run_over_websocket(conn, code, SERVICE, self.log_tail)
        finally:
            conn.close()

    # ---- teardown -----------------------------------------------------------------

    def stop(self):
        """Stop the servers, then the hub, then whatever of this hub is still
        alive. Returns ``[(pid, cmdline)]`` of processes that had to be killed
        after the hub had exited."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            for user in self.users:
                try:
                    self.request("DELETE", f"{self.url}/hub/api/users/{user}/server", timeout=5)
                except OSError:
                    pass
            deadline = time.monotonic() + STOP_TIMEOUT
            for user in self.users:
                while time.monotonic() < deadline:
                    try:
                        _, model = self.request("GET", f"{self.url}/hub/api/users/{user}", timeout=2)
                    except OSError:
                        break
                    if not isinstance(model, dict) or not model.get("servers"):
                        break
                    time.sleep(0.2)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        # The hub stops its proxy and servers on its way out; give stragglers a
        # moment, then end them.
        return end_tagged(TAG_ENV, self.tag, grace=5)


def _running(hub_class, tmp_path_factory):
    _require_jupyterhub()
    h = hub_class(tmp_path_factory.mktemp("hub"))
    try:
        h.start()
        yield h
    finally:
        left = h.stop()
    if left:
        pytest.fail("processes of the hub outlived it and were killed: "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left), pytrace=False)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from _running(Hub, tmp_path_factory)


class AdmittingHub(Hub):
    """The hub above with a size no one fits beside, and admission on (issue
    28, item 4), and an oversubscribed size, ``shared`` (8 GiB caps, 2 GiB
    guaranteed), whose kernels wait up to 30 s for GPU room (issue 28, items
    1-3). Its process reads no NVML (as a hub on a host without a driver):
    the GPU is the one its servers' environment shows (the simulated 16 GiB
    one, whatever GPU the machine running the tests has), read by the hub in
    a child process with that environment (issue 35, item 12)."""

    policy_lines = """\
        import hami_jupyter.gpus
        hami_jupyter.gpus.read_gpus = lambda: ([], "NVML is off in this test's hub")
        c.SlicePolicy.sizes = {**c.SlicePolicy.sizes, "whole": {"memory": "16g"},
                               "shared": {"memory": "8g", "guarantee": "2g"}}
        c.SlicePolicy.offer = {"*": ["small", "large", "whole", "shared"]}
        c.SlicePolicy.memory_oversubscription = 4.0
        c.Spawner.environment["HAMI_ROOM_WAIT"] = "30"
        """


@pytest.fixture(scope="module")
def admitting_hub(tmp_path_factory):
    """``hub`` with admission on: ``whole`` (16 GiB, kept whole) and
    ``shared`` (8 GiB, 2 GiB guaranteed) offered too."""
    yield from _running(AdmittingHub, tmp_path_factory)
