"""The JupyterLab of the browser tests: :class:`Lab` (one server on loopback
with the simulated GPU, its kernelspecs and the prebuilt labextension) and
:func:`running_lab`, the generator the ``lab`` fixtures run. A module of its
own, so that a test module that needs a Lab of other options imports it by a
name no other folder's conftest shares."""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from local_servers import end_tagged, free_ports, log_tail, request_json

from hami_jupyter import native

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
# Marks every process of one run: the server, its kernels (they inherit the
# server's environment) and the browser (launched with it). Teardown finds
# leftovers by it.
TAG_ENV = "HAMI_BROWSER_E2E_TAG"


LAB_START_TIMEOUT = 30
REQUEST_TIMEOUT = 10
STOP_TIMEOUT = 15
REFRESH_RATE_MS = 500

# A kernel on two simulated GPUs (a state file of their own, 16 GiB each) in a
# slice of its own: what a slice over several GPUs shows.
TWO_GPU_KERNEL = "hami-two-gpus"
TWO_GPU_SLICE = "two-gpus"
TWO_GPU_UUIDS = ("GPU-7e0a0000-0000-4000-8000-000000000000", "GPU-7e0a0000-0000-4000-8000-000000000001")

LAB_EXTENSION = "hami-jupyter-labextension"
SETTINGS = {
    # The status bar item and panel poll as fast as they may, so the test is quick.
    f"{LAB_EXTENSION}/plugin": {"refreshRate": REFRESH_RATE_MS},
    # No "fetch Jupyter news?" toast over the page, and no requests outside.
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}

# ---- processes ----------------------------------------------------------------------------------


# ---- the server ---------------------------------------------------------------------------------


class Lab:
    def __init__(self, tmp, tag, kernel_stderr=False):
        self.tmp = tmp
        self.tag = tag
        # True: the kernels forward what their processes write to stderr (the preload
        # library's lines) to the notebook, as they do outside pytest; ipykernel does
        # not while PYTEST_CURRENT_TEST is in its environment.
        self.kernel_stderr = kernel_stderr
        self.root = tmp / "root"
        self.slice_root = tmp / "slices"
        self.settings_dir = tmp / "lab-settings"
        self.log_path = tmp / "jupyterlab.log"
        self.token = secrets.token_hex(24)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    # ---- start ----------------------------------------------------------------------

    def environment(self):
        # None of the limits, slices or Jupyter folders of the shell running the tests.
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("HAMI_", "CUDA_", "JUPYTER", "JPY_", "IPYTHON"))
                and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")
                and not (self.kernel_stderr and k.startswith("PYTEST_"))}
        env = native.sim_env(self.tmp / "sim-state", base=base,
                             HAMI_SIM_DEVICES="1", HAMI_SIM_MEMORY="16g",
                             HAMI_SIM_CONTEXT_BYTES="64m")
        share = Path(sys.prefix) / "share" / "jupyter"
        env.update({
            TAG_ENV: self.tag,
            "HAMI_MEMORY_LIMIT": "1g",
            "HAMI_SM_LIMIT": "25",
            "HAMI_SLICE_ROOT": str(self.slice_root),
            "JUPYTER_CONFIG_DIR": str(self.tmp / "config"),
            "JUPYTER_DATA_DIR": str(self.tmp / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
            "JUPYTER_PATH": str(share),
            "JUPYTERLAB_SETTINGS_DIR": str(self.settings_dir),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.tmp / "lab-workspaces"),
            "IPYTHONDIR": str(self.tmp / "ipython"),
            # The kernelspecs run "python": this environment's.
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PYTHONUNBUFFERED": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        })
        return env

    def write_settings(self):
        for plugin, values in SETTINGS.items():
            path = self.settings_dir / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values, indent=2))

    def write_two_gpu_kernelspec(self):
        """TWO_GPU_KERNEL in the server's data folder: hami-python3's, with the
        simulated GPU's two devices and the slice named in its env."""
        share = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "hami-python3"
        spec = json.loads((share / "kernel.json").read_text())
        spec["display_name"] = "Python 3 (HAMi vGPU, two GPUs)"
        # UUIDs of their own: the server's NVML (the one-device simulated GPU)
        # must not take them for its GPU 0 (the panel's whole GPU reads it).
        spec["env"] = {"HAMI_SIM_STATE": str(self.tmp / "sim-two-gpus" / "state"),
                       "HAMI_SIM_DEVICES": "2", "HAMI_SIM_MEMORY": "16g",
                       "HAMI_SIM_UUIDS": ",".join(TWO_GPU_UUIDS),
                       "HAMI_SIM_CONTEXT_BYTES": "64m", "HAMI_SLICE": TWO_GPU_SLICE}
        folder = self.tmp / "data" / "kernels" / TWO_GPU_KERNEL
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.json").write_text(json.dumps(spec, indent=1))

    def start(self):
        for folder in (self.root, self.slice_root, self.tmp / "config", self.tmp / "data",
                       self.tmp / "runtime", self.tmp / "lab-workspaces", self.tmp / "sim-two-gpus"):
            folder.mkdir(parents=True, exist_ok=True)
        self.write_settings()
        self.write_two_gpu_kernelspec()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}",
               # window.jupyterapp: the tests switch the theme by JupyterLab's own
               # command, without a reload that would lose the notebooks' outputs.
               "--LabApp.expose_app_in_browser=True"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.tmp, env=self.environment(),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + LAB_START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"jupyterlab exited with {self.proc.returncode} at start-up\n"
                            f"{self.log_tail()}", pytrace=False)
            try:
                status, _ = self.request("GET", "api/status", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyterlab did not answer on {self.url} within "
                            f"{LAB_START_TIMEOUT} s\n{self.log_tail()}", pytrace=False)
            time.sleep(0.2)
        self.check_setup()

    def check_setup(self):
        """The server found the kernelspecs, the labextension, the server
        extension and the settings file: else every later failure would be a riddle."""
        specs = self.api("GET", "api/kernelspecs")["kernelspecs"]
        for name in ("hami-python3", "python3", TWO_GPU_KERNEL):
            if name not in specs:
                pytest.fail(f"the server has no {name} kernelspec (it has {sorted(specs)}); "
                            f"JUPYTER_PATH={Path(sys.prefix) / 'share' / 'jupyter'}\n"
                            f"{self.log_tail()}", pytrace=False)
        status, page = self.request("GET", "lab")
        if status != 200 or LAB_EXTENSION not in str(page):
            pytest.fail(f"GET /lab answered {status} without {LAB_EXTENSION} in its page "
                        f"config: is the labextension built and installed "
                        f"(`jupyter labextension list`)?\n{self.log_tail()}", pytrace=False)
        self.api("GET", "hami/v1/slices")  # the server extension answers
        plugin = self.api("GET", f"lab/api/settings/{LAB_EXTENSION}:plugin")
        if plugin.get("settings", {}).get("refreshRate") != REFRESH_RATE_MS:
            pytest.fail(f"the settings file did not take: {plugin.get('raw')!r}", pytrace=False)

    # ---- talking to it ----------------------------------------------------------------

    def log_tail(self, chars=6000):
        return log_tail(self.log_path, chars, "jupyterlab")

    def request(self, method, path, body=None, timeout=REQUEST_TIMEOUT):
        """``(status, parsed JSON or text)`` of ``{url}/{path}``; HTTP errors are
        returned, not raised."""
        return request_json(method, f"{self.url}/{path}", self.token, body, timeout)

    def api(self, method, path, body=None, expect=(200,)):
        status, reply = self.request(method, path, body)
        if status not in expect:
            pytest.fail(f"{method} /{path} answered {status}: {reply}\n{self.log_tail()}",
                        pytrace=False)
        return reply

    def url_for(self, page, workspace=None):
        """The address of a JupyterLab page (``tree/x.ipynb``) in *workspace*, with the token."""
        prefix = f"lab/workspaces/{workspace}" if workspace else "lab"
        quoted = urllib.parse.quote(page)
        return f"{self.url}/{prefix}/{quoted}?token={self.token}"

    def write_notebook(self, name, kernel, display_name, sources=()):
        """A notebook with code cells *sources* and *kernel*'s kernelspec, in the root folder."""
        cells = [{"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "source": source,
                  "outputs": [], "execution_count": None}
                 for i, source in enumerate(sources)]
        notebook = {
            "cells": cells,
            "metadata": {
                "kernelspec": {"name": kernel, "display_name": display_name,
                               "language": "python"},
                "language_info": {"name": "python"},
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(notebook, indent=1))
        return name

    def session_kernel(self, path, timeout=30):
        """The id of the kernel JupyterLab started for notebook *path*, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for session in self.api("GET", "api/sessions"):
                if session.get("path") == path and session.get("kernel"):
                    return session["kernel"]["id"]
            if time.monotonic() > deadline:
                pytest.fail(f"no kernel session for {path} within {timeout} s\n{self.log_tail()}",
                            pytrace=False)
            time.sleep(0.2)

    def kernel(self, kernel_id):
        return self.api("GET", f"api/kernels/{kernel_id}")

    def wait_kernel_state(self, kernel_id, state="idle", timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            model = self.kernel(kernel_id)
            if model.get("execution_state") == state:
                return model
            if time.monotonic() > deadline:
                pytest.fail(f"kernel {kernel_id} not {state} within {timeout} s: {model}\n"
                            f"{self.log_tail()}", pytrace=False)
            time.sleep(0.2)

    def slice_status(self, kernel_id):
        return self.api("GET", f"hami/v1/kernels/{kernel_id}")

    # ---- teardown ------------------------------------------------------------------------

    def stop(self):
        """Stop the server, then whatever of this run is still alive. Returns
        ``[(pid, cmdline)]`` of processes that had to be ended after the server
        had exited."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            # The server shuts its kernels down on SIGTERM.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return end_tagged(TAG_ENV, self.tag, grace=5)


def running_lab(run_tag, tmp_path_factory, **options):
    """A started Lab (*options*: Lab's), stopped after; fails the run if any of its
    processes outlived the server. A generator for the ``lab`` fixtures."""
    server = Lab(tmp_path_factory.mktemp("jupyterlab"), run_tag, **options)
    try:
        server.start()
        yield server
    finally:
        left = server.stop()
    if left:
        pytest.fail("processes of the JupyterLab run outlived the server and were ended: "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left), pytrace=False)
