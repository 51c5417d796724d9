"""Under JupyterHub every kernel of the server runs in the hub's slice (issue 12, items 1-2).

The hub is played by hand here: the user's slice with a hub-owned limits file
(2 GiB, SM 30 %), and the server environment the spawner's pre_spawn_hook
gives (``HAMI_HUB_SLICE``, ``HAMI_SLICE``), with the size's limit variables
that hubs before issue 27 also put there.
Kernels are real ipykernel processes under the preload library on the
simulated GPU (16 GiB, 64 MiB per context).
"""

import getpass
import json
import logging
import os
import sys
from types import SimpleNamespace

import pytest
from test_provisioner import ASK, kernel_env, total_seen
from traitlets.config import Config, LoggingConfigurable

from hami_jupyter import native
from hami_jupyter.commands.cli import main
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.provisioning.provisioner import HamiProvisioner, SliceSetupError
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.create import create_limits_file, create_slice

GiB = 1 << 30
MiB = 1 << 20
USER = getpass.getuser()
APPLIES = "the hub's slice applies to every kernel of this server"
NESTED = "nested caps are not supported yet"


# A process the kernel starts, whose environment asks for 64 GiB, in the kernel's slice.
CHILD_ASKS_MORE = """
import os, subprocess, sys
code = "from hami_jupyter import driver_memory as c; c.init(); print(c.mem_get_info()[1]); c.DeviceBuffer(3 << 30)"
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "CUDA_DEVICE_MEMORY_LIMIT": "64g", "HAMI_MEMORY_LIMIT": "64g"})
print(child.stdout.split()[0], "CUDA_ERROR_OUT_OF_MEMORY" in child.stderr, child.returncode != 0)
"""


@pytest.fixture
def hub(hami_env, monkeypatch):
    """The user's hub-made slice (2 GiB, SM 30 %, hard; a limits file) and the
    server environment the hub gives; returns the slice's path."""
    path = hami_env.root / f"{USER}.slice"
    held = resolve_limits({"memory_limit": "2g", "sm_limit": 30}, {}).limits
    hami_env.root.mkdir(mode=0o755, parents=True)
    create_limits_file(path, held)  # first, as the hub makes them
    create_slice(path, USER, held)
    for k, v in {"HAMI_HUB_SLICE": str(path), "HAMI_SLICE": str(path),
                 "HAMI_MEMORY_LIMIT": str(2 * GiB), "HAMI_SM_LIMIT": "30", "HAMI_SM_MODE": "hard",
                 "JUPYTERHUB_USER": USER}.items():
        monkeypatch.setenv(k, v)
    return path


@pytest.fixture
def kernelspec(hami_env, monkeypatch):
    """``kernelspec(name, env=None, config=None, provisioner="hami-provisioner")``:
    write ``<name>/kernel.json`` where Jupyter finds it; *provisioner* None:
    no ``kernel_provisioner`` metadata at all (jupyter_client's plain python3)."""
    data = hami_env.tmp / "jupyter-data"
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(hami_env.tmp / "user-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(hami_env.tmp / "runtime"))

    def write(name, env=None, config=None, provisioner="hami-provisioner"):
        folder = data / "kernels" / name
        folder.mkdir(parents=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name, "language": "python", "metadata": {}}
        if provisioner is not None:
            spec["metadata"]["kernel_provisioner"] = {
                "provisioner_name": provisioner, **({"config": config} if config else {})}
        if env is not None:
            spec["env"] = env
        (folder / "kernel.json").write_text(json.dumps(spec))
        return name

    return write


def hub_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("hami-jupyter: kernel")]


# ---- (a) a kernelspec cannot leave the hub's slice or loosen its cap -------------


@pytest.mark.parametrize("spec,server_config", [
    # Issue 12: `kernelspec install --name big --memory 64g --slice /tmp/mine/big.slice`.
    ({"config": {"memory_limit": "64g", "slice": "/tmp/mine/big.slice"}}, None),
    ({"config": {"slice": "other"}}, None),
    ({"env": {"HAMI_SLICE": "/tmp/mine/big.slice"}}, None),
    ({"env": {"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine/cache.slice"}}, None),
    ({}, {"slice": "/tmp/mine/big.slice"}),
], ids=["spec-config-path", "spec-config-name", "spec-env-HAMI_SLICE", "spec-env-hami-cache",
        "server-config"])
def test_kernel_naming_another_slice_is_refused(hub, start_kernel, kernelspec, hami_env,
                                                spec, server_config):
    name = kernelspec("big", **spec)
    with pytest.raises(SliceSetupError) as info:
        start_kernel(kernel_name=name, server_config=server_config)
    message = str(info.value)
    assert "the kernel was not started" in message
    assert APPLIES in message and str(hub) in message
    assert sorted(p.name for p in hami_env.root.glob("*.slice")) == [f"{USER}.slice"]
    assert not (hami_env.tmp / "mine").exists() and not list(
        (hami_env.tmp / "runtime").glob("kernel-*.json"))


def test_kernel_naming_the_hubs_slice_runs_in_it(hub, start_kernel, kernelspec, cell):
    name = kernelspec("mine", config={"slice": USER})  # by name, under the slice root
    km, kc = start_kernel(kernel_name=name)
    assert kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"] == str(hub)


def test_kernel_asking_more_gets_the_hubs_cap(hub, start_kernel, kernelspec, cell, caplog):
    name = kernelspec("big", config={"memory_limit": "64g", "sm_limit": 90},
                      env={"CUDA_DEVICE_MEMORY_LIMIT": "64g"})
    km, kc = start_kernel(kernel_name=name)
    env = kernel_env(kc, cell, "HAMI_SLICE", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                     "HAMI_MEMORY_LIMIT")
    # No limit figures in its environment: the hub's limits file holds them, and
    # an administrator's live change would leave any figure here wrong (issue 27).
    assert env == {"HAMI_SLICE": str(hub), "CUDA_DEVICE_MEMORY_LIMIT": None,
                   "CUDA_DEVICE_SM_LIMIT": None, "HAMI_MEMORY_LIMIT": None}
    assert total_seen(kc, cell) == 2 * GiB
    # Above the hub's 2 GiB is refused; 1900 MiB + the 64 MiB context fit, 100 MiB more do not.
    assert cell(kc, ASK).stdout.split() == ["refused", "3072", "ok", "1900", "refused", "100"]
    (warning,) = hub_warnings(caplog)
    assert "memory 64.0 GiB" in warning and APPLIES in warning and "memory 2.0 GiB" in warning
    # The preload library holds to the hub's limits file whatever a process's environment asks.
    assert cell(kc, CHILD_ASKS_MORE).stdout.split() == [str(2 * GiB), "True", "True"]
    assert read_snapshot(hub).fallback_limit.memory_limit == 2 * GiB


@pytest.mark.parametrize("spec,server_config", [
    ({"config": {"memory_limit": "1g"}}, None),
    ({"env": {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}}, None),
    ({}, {"memory_limit": "1g"}),
], ids=["spec-config-memory", "spec-env-memory", "server-config-memory"])
def test_kernel_asking_a_smaller_memory_cap_gets_it_nested(hub, start_kernel, kernelspec, cell,
                                                           spec, server_config):
    name = kernelspec("small", **spec)
    km, kc = start_kernel(kernel_name=name, server_config=server_config)
    env = kernel_env(kc, cell, "HAMI_SLICE", "HAMI_PROCESS_MEMORY_LIMIT")
    assert env == {"HAMI_SLICE": str(hub), "HAMI_PROCESS_MEMORY_LIMIT": str(GiB)}
    assert total_seen(kc, cell) == GiB
    # 1 GiB less the 64 MiB context: 3072 and 1900 MiB are refused, 100 MiB fits.
    assert cell(kc, ASK).stdout.split() == ["refused", "3072", "refused", "1900", "ok", "100"]
    # The hub's slice is left as it was: the cap is the kernel's processes' own.
    fallback = read_snapshot(hub).fallback_limit
    assert (fallback.memory_limit, fallback.sm_share) == (2 * GiB, 30)


@pytest.mark.parametrize("spec,words", [
    ({"config": {"sm_limit": 10}}, ["SM 10 %"]),
    ({"env": {"CUDA_DEVICE_MEMORY_LIMIT_0": "512m"}}, ["GPU 0: memory 512.0 MiB"]),
], ids=["spec-config-sm", "spec-env-one-gpu"])
def test_kernel_asking_a_limit_that_cannot_nest_is_refused(hub, start_kernel, kernelspec, spec, words):
    name = kernelspec("small", **spec)
    with pytest.raises(SliceSetupError) as info:
        start_kernel(kernel_name=name)
    message = str(info.value)
    assert NESTED in message and str(hub) in message and "memory 2.0 GiB, SM 30 % (hard)" in message
    for w in words:
        assert w in message
    fallback = read_snapshot(hub).fallback_limit
    assert (fallback.memory_limit, fallback.sm_share) == (2 * GiB, 30)


def test_kernel_asking_the_hubs_own_limits_starts(hub, start_kernel, kernelspec, cell, caplog):
    name = kernelspec("same", config={"memory_limit": "2g", "sm_limit": 30})
    km, kc = start_kernel(kernel_name=name)
    assert kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"] == str(hub)
    assert hub_warnings(caplog) == []


def test_missing_hub_slice_refuses_the_kernel(hub, start_kernel):
    hub.unlink()
    with pytest.raises(SliceSetupError, match="the hub's slice .* does not exist"):
        start_kernel()
    assert not hub.exists()


# ---- (b) every kernelspec goes through hami-provisioner under the hub --------------


@pytest.fixture
def server_extension(monkeypatch):
    """``load()``: the server extension's load on a stand-in server app (its log
    is ``app.log``); jupyter_client's own provisioner factory comes back after."""
    from jupyter_client.provisioning import KernelProvisionerFactory

    from hami_jupyter.server import _load_jupyter_server_extension, metrics

    monkeypatch.setattr(metrics.COLLECTOR, "serverapp", getattr(metrics.COLLECTOR, "serverapp", None))

    def load():
        app = LoggingConfigurable(config=Config())
        app.log = logging.getLogger("hami-test-server")
        app.web_app = SimpleNamespace(settings={"base_url": "/"}, add_handlers=lambda *a: None)
        _load_jupyter_server_extension(app)
        return app

    yield load
    factory = KernelProvisionerFactory._instance
    if factory is not None:  # the next test's KernelManager makes a fresh one
        type(factory).clear_instance()


@pytest.mark.parametrize("provisioner", [None, "local-provisioner"],
                         ids=["no-provisioner-metadata", "local-provisioner"])
def test_every_kernelspec_runs_in_the_hubs_slice(hub, server_extension, start_kernel, kernelspec,
                                                 cell, caplog, provisioner):
    caplog.set_level(logging.INFO)
    name = kernelspec("python3", provisioner=provisioner)
    server_extension()
    km, kc = start_kernel(kernel_name=name)
    env = kernel_env(kc, cell, "LD_PRELOAD", "HAMI_SLICE")
    assert (env["LD_PRELOAD"] or "").split(":")[-1] == str(native.library_path())
    assert env["LD_PRELOAD"].endswith("/libvgpu.so")
    assert env["HAMI_SLICE"] == str(hub)
    assert isinstance(km.provisioner, HamiProvisioner)
    assert total_seen(kc, cell) == 2 * GiB
    # The server said so at startup.
    assert any("every kernel runs in it" in r.getMessage() and str(hub) in r.getMessage()
               for r in caplog.records)


def test_a_jupyter_server_without_the_extension_refuses_the_kernel(hub, hami_env):
    """Issue 27, item 3: under the hub, a Jupyter server where the extension is
    not in force (a user's config turned it off) would start other kernelspecs
    outside the slice; the provisioner says so rather than start one."""
    import asyncio

    from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

    km = ServerKernelManager(kernel_name="hami-python3")
    with pytest.raises(SliceSetupError) as info:
        asyncio.run(km.start_kernel(env=dict(os.environ)))
    message = str(info.value)
    assert "the kernel was not started" in message and str(hub) in message
    assert "server extension is not in force" in message and '"hami_jupyter": false' in message
    assert not km.has_kernel


def test_without_the_hub_kernelspecs_keep_their_provisioner(hami_env, server_extension,
                                                            start_kernel, kernelspec, cell):
    name = kernelspec("python3", provisioner=None)
    server_extension()
    km, kc = start_kernel(kernel_name=name)
    assert not isinstance(km.provisioner, HamiProvisioner)
    assert kernel_env(kc, cell, "LD_PRELOAD")["LD_PRELOAD"] is None


# ---- (c) `hami-jupyter kernelspec install` under the hub -------------------------


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args,words", [
    # The command, as alice ran it.
    (["--memory", "64g", "--slice", "/tmp/mine/big.slice", "--user"],
     ["--slice:", "cannot name another slice", APPLIES]),
    (["--slice", "other", "--user"], ["--slice:", APPLIES]),
    (["--memory", "64g", "--user"], ["--memory: memory 64.0 GiB is more than the hub's slice holds",
                                     "memory 2.0 GiB", APPLIES]),
    (["--sm", "90", "--user"], ["--sm: SM 90 % is more than", APPLIES]),
    (["--sm", "10", "--user"], ["--sm: SM 10 % is stricter than", NESTED]),
], ids=["issue-command", "slice-name", "more-memory", "more-sm", "less-sm"])
def test_kernelspec_install_under_the_hub_refuses(hub, kernelspec, hami_env, capsys, args, words):
    code, out, err = run(capsys, "kernelspec", "install", "--name", "big", *args)
    assert code == 2 and out == ""
    assert "hami-jupyter kernelspec install: error: " in err and "Traceback" not in err
    for w in words:
        assert w in err
    assert not (hami_env.tmp / "user-data").exists()  # nothing written


def test_kernelspec_install_under_the_hub_may_repeat_its_limits(hub, kernelspec, hami_env, capsys):
    code, out, err = run(capsys, "kernelspec", "install", "--name", "same", "--memory", "2g",
                         "--slice", str(hub), "--user")
    assert code == 0, err
    assert (hami_env.tmp / "user-data" / "kernels" / "same" / "kernel.json").exists()


def test_kernelspec_install_under_the_hub_may_ask_a_smaller_memory_cap(hub, kernelspec, hami_env, capsys):
    code, out, err = run(capsys, "kernelspec", "install", "--name", "small", "--memory", "1g", "--user")
    assert code == 0, err
    spec = json.loads((hami_env.tmp / "user-data" / "kernels" / "small" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["memory_limit"] in ("1g", GiB, str(GiB))


def test_kernelspec_list_under_the_hub_shows_the_limits_in_force(hub, kernelspec, hami_env):
    """Issue 27, item 4: after an administrator's change, what `hami-jupyter
    kernelspec list` says a kernel gets is the slice's cap in force, not a
    figure of the server's environment from its start."""
    from hami_jupyter.provisioning.kernelspec import describe_config
    from hami_jupyter.slice.change import set_memory_limit

    set_memory_limit(hub, None, GiB)  # the administrator's shrink, 2 GiB -> 1 GiB
    text = describe_config({})
    assert text.startswith(f"memory 1.0 GiB (from memory_limit (the hub's slice {hub}, in force))"), text
    assert "SM 30 % (hard" in text and "this environment" not in text
