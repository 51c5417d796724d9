"""docs/single-host.md as an administrator follows it on Debian (issue 35).

Item 10: the venv step names the system's Python by its path: a plain
``python3`` was root's pyenv Python, whose venv links into /root, and the
guide's own check as ``nobody`` then failed "Permission denied".

Item 15: the Node.js the guide installs satisfies what the proxy it pins
(dev/hub-deps.sh's configurable-http-proxy) needs, dependencies included: 5.3.0
says Node.js 20, but its commander 15 needs 22.12 and npm warned on 20.
"""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "single-host.md"


def _version(text):
    return tuple(int(p) for p in text.split("."))


def _guide_node():
    """The Node.js the guide installs: NodeSource's major, and the least version it names."""
    guide = GUIDE.read_text()
    major = re.search(r"deb\.nodesource\.com/setup_(\d+)\.x", guide)
    least = re.search(r"needs Node\.js (\d+\.\d+) or\s+newer", guide)
    assert major and least, "the guide names no Node.js to install"
    return int(major.group(1)), _version(least.group(1))


def test_the_venv_is_made_from_the_systems_python_by_its_path():
    step = GUIDE.read_text().split("## 2.")[1].split("## 3.")[0]
    commands = [line for line in step.splitlines() if " -m venv " in line]
    assert commands and all(line.startswith("/usr/bin/python3 -m venv /opt/jupyterhub")
                            for line in commands), commands


def test_the_node_the_guide_installs_runs_the_proxy_it_pins():
    major, least = _guide_node()
    assert major >= least[0]
    # What the pinned proxy needs, read from its installed packages where dev/hub-deps.sh put them.
    pinned = re.search(r"hub_deps_chp_version=(\S+)", (REPO / "dev" / "hub-deps.sh").read_text()).group(1)
    modules = REPO / "node_modules"
    chp = modules / "configurable-http-proxy" / "package.json"
    if not chp.is_file() or json.loads(chp.read_text())["version"] != pinned:
        pytest.skip(f"configurable-http-proxy {pinned} is not installed here (dev/hub-deps.sh)")
    needed = (0, 0)
    for package in modules.glob("**/package.json"):
        try:
            engines = json.loads(package.read_text()).get("engines") or {}
        except (ValueError, AttributeError):
            continue
        found = re.match(r"\s*>=?\s*v?(\d+(?:\.\d+)?)", str(engines.get("node", "")))
        if found:
            needed = max(needed, _version(found.group(1))[:2] + (0,) * (2 - len(found.group(1).split("."))))
    assert least >= needed[:2], f"the guide installs Node.js {least}, the proxy's packages need {needed}"
    # The README and the hub test's installer say the same.
    said = f"{least[0]}.{least[1]}"
    assert f"Node.js {said}" in (REPO / "README.md").read_text()
    assert f"Node.js >= {said}" in (REPO / "dev" / "hub-deps.sh").read_text()
