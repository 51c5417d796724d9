"""docs/single-host.md as an administrator follows it on Debian (issue 35).

Item 10: the venv step names the system's Python by its path: a plain
``python3`` was root's pyenv Python, whose venv links into /root, and the
guide's own check as ``nobody`` then failed "Permission denied".

Node.js (issue 35, item 15; issue 39, item 16): the guide, the README and
dev/hub-deps.sh name the Node.js the pinned proxy really needs, what its own
package says (20): the 22.12 they named came from its commander 15, which
says so for programs that ``require()`` it, while the proxy imports it; the
proxy ran the hub tests and a real hub on Node.js 20.20. dev/hub-deps.sh
checks it where it matters: the proxy it finds must start under the node on
PATH.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "single-host.md"
HUB_DEPS = REPO / "dev" / "hub-deps.sh"


def _version(text):
    return tuple(int(p) for p in text.split("."))


def _guide_node():
    """The Node.js the guide installs: NodeSource's major, and the least version it names."""
    guide = GUIDE.read_text()
    major = re.search(r"deb\.nodesource\.com/setup_(\d+)\.x", guide)
    least = re.search(r"needs Node\.js (\d+(?:\.\d+)?) or\s+newer", guide)
    assert major and least, "the guide names no Node.js to install"
    return int(major.group(1)), _version(least.group(1))


def test_the_venv_is_made_from_the_systems_python_by_its_path():
    step = GUIDE.read_text().split("## 2.")[1].split("## 3.")[0]
    commands = [line for line in step.splitlines() if " -m venv " in line]
    assert commands and all(line.startswith("/usr/bin/python3 -m venv /opt/jupyterhub")
                            for line in commands), commands


def _pinned_proxy():
    """The pinned proxy's package.json where dev/hub-deps.sh put it (skips when absent)."""
    pinned = re.search(r"hub_deps_chp_version=(\S+)", HUB_DEPS.read_text()).group(1)
    chp = REPO / "node_modules" / "configurable-http-proxy" / "package.json"
    if not chp.is_file() or json.loads(chp.read_text())["version"] != pinned:
        pytest.skip(f"configurable-http-proxy {pinned} is not installed here (dev/hub-deps.sh)")
    return json.loads(chp.read_text())


def test_every_page_names_the_node_the_pinned_proxy_says_it_needs():
    major, least = _guide_node()
    assert major >= least[0]
    package = _pinned_proxy()
    says = re.match(r"\s*>=?\s*v?(\d+(?:\.\d+)?)", package["engines"]["node"]).group(1)
    assert least == _version(says), f"the guide says Node.js {least}, the proxy's package {says}"
    said = ".".join(map(str, least))
    readme = (REPO / "README.md").read_text()
    assert f"Node.js {said}+" in readme and "22.12+" not in readme
    assert f"hub_deps_node_least={said}" in HUB_DEPS.read_text()


def test_hub_deps_checks_that_the_proxy_starts_under_this_node(tmp_path):
    _pinned_proxy()
    done = subprocess.run(["bash", str(HUB_DEPS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # A node too old for it: refused with what to do, before anything runs.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "node").write_text('#!/bin/sh\ncase "$1" in -p) echo 18;; *) echo v18.20.0;; esac\n')
    (fake / "node").chmod(0o755)
    old = subprocess.run(["bash", str(HUB_DEPS)], capture_output=True, text=True, timeout=120,
                         env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert old.returncode != 0 and "node v18.20.0 is too old" in old.stderr, old.stderr
    assert "Node.js >= 20" in old.stderr


def test_the_users_the_guide_adds_get_homes_only_they_may_enter():
    """Issue 39: `useradd -m` made 0755 homes on Debian 12 (its login.defs
    leaves HOME_MODE unset and UMASK at 022): every user read every other's
    notebooks. Every user the guide adds gets a 0700 home, as the root hub
    test's users do (tests/hub/unix_users.py, which checks it)."""
    step = GUIDE.read_text().split("## 5.")[1].split("## 6.")[0]
    adds = [line for line in step.splitlines() if line.startswith("useradd ")]
    assert adds and all(" -m -K HOME_MODE=0700 " in line for line in adds), adds
    assert "chmod 0700 /home/alice" in step
    users = (REPO / "tests" / "hub" / "unix_users.py").read_text()
    assert '"-K", "HOME_MODE=0700"' in users
