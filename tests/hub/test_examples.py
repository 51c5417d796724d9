"""The example configurations in examples/ load, and say what the README says."""

import grp
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from hami_jupyter.hub import SlicePolicy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_config(path, monkeypatch):
    """Execute a jupyterhub_config.py as JupyterHub would; return its Config."""
    real = grp.getgrnam
    monkeypatch.setattr(grp, "getgrnam", lambda name: SimpleNamespace(gr_gid=4242)
                        if name == "hami-admin" else real(name))
    c = Config()
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: c, "c": c})
    return c


def user(name, *groups):
    return SimpleNamespace(user=SimpleNamespace(name=name, groups=[SimpleNamespace(name=g) for g in groups]))


def test_single_host_example(monkeypatch):
    c = run_config(EXAMPLES / "jupyterhub_config.py", monkeypatch)
    policy = SlicePolicy(config=c)
    assert policy.size_of("alice").limits.memory_limit == 40 << 30
    assert policy.size_of("bob", ["ml-course"]).gpus == (1,)
    assert policy.size_of("carol").name == "small"
    assert callable(c.Spawner.pre_spawn_hook) and callable(c.Spawner.options_form)
    assert "Large: 24 GiB" in c.Spawner.options_form(user("dave", "research"))


def test_the_single_host_example_says_who_may_log_in(monkeypatch):
    """Issue 39: the hub warned "No allow config found" at every start."""
    from jupyterhub.auth import Authenticator

    c = run_config(EXAMPLES / "jupyterhub_config.py", monkeypatch)
    authenticator = Authenticator(config=c)
    assert authenticator.any_allow_config
    assert authenticator.allowed_users == {"alice", "bob", "carol"}


def test_the_examples_park_idle_kernels(monkeypatch):
    from traitlets.config.loader import KVArgParseConfigLoader

    from hami_jupyter.server.parking import HamiParking

    c = run_config(EXAMPLES / "jupyterhub_config.py", monkeypatch)
    # The single-user server reads its arguments as any Jupyter app's command line.
    parking = HamiParking(config=KVArgParseConfigLoader(argv=c.Spawner.args).load_config())
    assert parking.enabled and parking.idle_seconds == 900
    assert "--HamiParking.enabled=True" in (EXAMPLES / "z2jh-values.yaml").read_text()


def test_single_host_example_runs_servers_from_the_hubs_venv(monkeypatch):
    # LocalProcessSpawner finds `jupyterhub-singleuser` on PATH, which under
    # sudo or systemd lacks the hub's venv: the example names it by sys.prefix.
    c = run_config(EXAMPLES / "jupyterhub_config.py", monkeypatch)
    bin_dir = os.path.join(sys.prefix, "bin")
    assert c.Spawner.cmd == [os.path.join(bin_dir, "jupyterhub-singleuser")]
    assert c.Spawner.environment["PATH"].split(":")[0] == bin_dir
    if sys.prefix != sys.base_prefix:  # run from a venv, as the guide installs it
        assert os.access(c.Spawner.cmd[0], os.X_OK), f"{c.Spawner.cmd[0]} is not in this venv"
    assert c.JupyterHub.spawner_class == "jupyterhub.spawner.LocalProcessSpawner"
    assert c.SlicePolicy.admin_group == "hami-admin"


def test_z2jh_values_profiles_are_what_the_policy_produces(monkeypatch):
    yaml = pytest.importorskip("yaml")
    values = yaml.safe_load((EXAMPLES / "z2jh-values.yaml").read_text())
    c = Config()
    exec(values["hub"]["extraConfig"]["hami-slices"], {"c": c})
    produced = c.KubeSpawner.profile_list(user("dave", "research"))
    assert values["singleuser"]["profileList"] == produced


def _service(c, name="hami-hub"):
    (entry,) = [s for s in c.JupyterHub.services if s["name"] == name]
    return entry


def test_single_host_example_runs_the_hub_view(monkeypatch):
    from hami_jupyter.hubview.app import HamiHubService

    c = run_config(EXAMPLES / "jupyterhub_config.py", monkeypatch)
    entry = _service(c)
    assert os.path.basename(entry["command"][0]) == "hami-jupyter"
    assert entry["command"][1] == "hub-service"
    app = HamiHubService()
    app.initialize(entry["command"][2:])  # the command line the hub will run, as it parses it
    assert (app.slice_root, app.admin_groups, app.kubernetes) == ("/run/hami-jupyter",
                                                                  ["hami-admin"], False)
    assert app.proxy_url == "http://127.0.0.1:8000"  # JupyterHub's default bind_url
    assert "hami-admin" in _service(c, "hami-admin")["command"]  # the admin service stays
    assert "access:services!service=hami-hub" in c.Spawner.server_token_scopes
    assert c.Spawner.environment["HAMI_HUB_SERVICE_URL"] == \
        "http://127.0.0.1:8000/services/hami-hub/"
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert "delete:servers" in roles["hami-hub"]["scopes"]
    assert roles["hami-hub-admins"]["groups"] == ["hami-admin"]


def test_z2jh_values_run_the_hub_view_for_next_starts():
    from hami_jupyter.hubview.app import HamiHubService

    yaml = pytest.importorskip("yaml")
    values = yaml.safe_load((EXAMPLES / "z2jh-values.yaml").read_text())
    c = Config()
    c.KubeSpawner.environment = dict(values["singleuser"]["extraEnv"])  # as z2jh sets it
    exec(values["hub"]["extraConfig"]["hami-slices"], {"c": c})
    entry = _service(c)
    assert entry["url"] == "http://hub:10101"
    app = HamiHubService()
    app.initialize(entry["command"][2:])
    assert app.kubernetes and app.service_url == "http://0.0.0.0:10101"
    assert app.next_sizes_file == c.SlicePolicy.next_sizes_file
    assert app.sizes == ["small", "large"]
    assert c.KubeSpawner.environment["HAMI_HUB_SERVICE_URL"] == \
        "http://proxy-public/services/hami-hub/"
    assert values["singleuser"]["extraEnv"]["HAMI_NODE_NAME"]["valueFrom"]["fieldRef"] == \
        {"fieldPath": "spec.nodeName"}
    assert {p["port"] for p in values["hub"]["service"]["extraPorts"]} == {10101}
