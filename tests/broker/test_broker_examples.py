"""The broker's examples run the command this checkout has, with the settings docs/broker.md describes."""

import configparser
import shlex
from pathlib import Path

import yaml

from hami_jupyter.commands.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def parsed(argv):
    assert argv[0].endswith("hami-jupyter"), argv
    args = build_parser().parse_args(argv[1:])  # a usage error exits: the test fails
    assert args.command == "broker"
    return args


def test_the_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(EXAMPLES / "hami-broker.service")
    service = unit["Service"]
    assert service["User"] == "root" and service["Restart"] == "always"
    args = parsed(shlex.split(service["ExecStart"]))
    assert (args.root, args.min_idle_seconds, args.host_memory_reserve, args.headroom) == (
        "/run/hami-jupyter", 60, "2g", "0")
    assert "--headroom" in service["ExecStart"]  # set where an administrator sees it, off as by default
    assert args.root in service["ReadWritePaths"].split()


def test_the_kubernetes_daemonset_shares_the_node_folder_with_the_guard():
    docs = list(yaml.safe_load_all((EXAMPLES / "k8s" / "hami-broker-daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"]
    [container] = pod["containers"]
    args = parsed(container["command"])
    assert args.root == "/run/hami-jupyter" and args.min_idle_seconds == 60 and args.headroom == "0"
    assert "--headroom=0" in container["command"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == args.root]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    guard = list(yaml.safe_load_all((EXAMPLES / "k8s" / "hami-guard-daemonset.yaml").read_text()))
    [guard_ds] = [d for d in guard if d["kind"] == "DaemonSet"]
    assert volume["hostPath"]["path"] in [v["hostPath"]["path"] for v in guard_ds["spec"]["template"]["spec"]["volumes"]]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]  # hami-park's checkpoint calls need the driver
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and "SYS_PTRACE" in security["capabilities"]["add"]
