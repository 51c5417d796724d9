"""The node agent's examples run the command this checkout has, with the settings its docs describe.

One systemd unit and one DaemonSet run the agent, the guard and the broker
in one (issue 33); the guard parks by default, as docs/guard.md says (issue
35, item 13: the unit ran ``--action kill``).
"""

import configparser
import shlex
from pathlib import Path

import yaml

from hami_jupyter.commands.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def parsed(argv):
    assert argv[0].endswith("hami-jupyter"), argv
    args = build_parser().parse_args(argv[1:])  # a usage error exits: the test fails
    assert args.command == "agent"
    return args


def test_one_unit_runs_the_agent_and_the_guard_parks():
    assert not list(EXAMPLES.glob("hami-guard*")) and not list(EXAMPLES.glob("hami-broker*"))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(EXAMPLES / "hami-agent.service")
    service = unit["Service"]
    assert service["User"] == "root" and service["Restart"] == "always"
    args = parsed(shlex.split(service["ExecStart"]))
    assert (args.root, args.interval, args.action) == ("/run/hami-jupyter", 0.5, "park")
    assert (args.min_idle_seconds, args.host_memory_reserve, args.headroom) == (60, "2g", "0")
    assert "--headroom" in service["ExecStart"]  # set where an administrator sees it, off as by default
    assert args.root in service["ReadWritePaths"].split()
    # Without a GPU, the simulated one's two variables, commented out (docs/single-host.md).
    text = (EXAMPLES / "hami-agent.service").read_text()
    assert "#Environment=LD_LIBRARY_PATH=" in text and "#Environment=HAMI_SIM_STATE=" in text


def test_one_daemonset_runs_the_agent():
    assert not list((EXAMPLES / "k8s").glob("hami-guard*")) and not list((EXAMPLES / "k8s").glob("hami-broker*"))
    docs = list(yaml.safe_load_all((EXAMPLES / "k8s" / "hami-agent-daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"]
    [container] = pod["containers"]
    args = parsed(container["command"])
    assert (args.root, args.action, args.interval) == ("/run/hami-jupyter", "park", 0.5)
    assert args.min_idle_seconds == 60 and "--headroom=0" in container["command"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == args.root]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/run/hami-jupyter"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]  # hami-park's checkpoint calls need the driver
    security = container["securityContext"]
    added = set(security["capabilities"]["add"])
    assert security["runAsUser"] == 0 and {"KILL", "SYS_PTRACE", "DAC_READ_SEARCH", "DAC_OVERRIDE"} <= added
