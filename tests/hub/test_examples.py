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
