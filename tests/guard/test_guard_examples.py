"""The guard's examples run the command this checkout has, with settings that do their job."""

import configparser
import shlex
from pathlib import Path

import yaml

from hami_jupyter.commands.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def parsed(argv):
    assert argv[0].endswith("hami-jupyter"), argv
    args = build_parser().parse_args(argv[1:])  # a usage error exits: the test fails
    assert args.command == "guard"
    return args


def test_the_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(EXAMPLES / "hami-guard.service")
    service = unit["Service"]
    assert service["User"] == "root" and service["Restart"] == "always"
    args = parsed(shlex.split(service["ExecStart"]))
    assert (args.root, args.interval, args.action) == ("/run/hami-jupyter", 0.5, "kill")
    assert args.root in service["ReadWritePaths"].split()


def test_the_kubernetes_daemonset():
    docs = list(yaml.safe_load_all((EXAMPLES / "k8s" / "hami-guard-daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"]
    [container] = pod["containers"]
    args = parsed(container["command"])
    assert args.action == "kill" and args.interval == 0.5
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == args.root]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/run/hami-jupyter"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and "KILL" in security["capabilities"]["add"]
