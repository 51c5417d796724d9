"""``hami-jupyter``: status, doctor and kernelspec install, on the simulated GPU.

Most tests call ``main([...])`` in-process and read what it printed; one
runs the installed command as a child process, as a user would.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_guard import seen, write_guard

from hami_jupyter.commands import doctor
from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.commands.cli import main
from hami_jupyter.commands.doctor import DRIVER_VERSION_FILE
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.slice.paths import list_slice_paths
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.status import slice_status

GiB = 1 << 30


def run(capsys, *argv):
    """``(exit status, stdout, stderr)`` of one in-process run."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make_slice(root, name, **configured):
    path = root / f"{name}.slice"
    ensure_slice(path, name, resolve_limits(configured, {}))
    return path


def checks_by_name(out):
    return {c["name"]: c for c in json.loads(out)}


# ---- status -------------------------------------------------------------------


def test_status_without_slices_says_where_it_looked(hami_env, capsys):
    code, out, err = run(capsys, "status")
    assert code == 0
    assert f"no slices under {hami_env.root}" in out
    assert err == ""

    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and json.loads(out) == []


def test_status_shows_a_slice_as_text_and_json(hami_env, capsys):
    path = make_slice(hami_env.root, "alice", memory_limit="1g", sm_limit="30")

    code, out, err = run(capsys, "status")
    assert code == 0 and err == ""
    assert f"hami slice 'alice'  ({path})" in out
    assert "each GPU gets: 1.0 GiB, SM share 30 % (hard)" in out

    code, out, _ = run(capsys, "status", "--json", "alice")
    assert code == 0
    [status] = json.loads(out)
    assert status["slice"] == "alice"
    assert status["path"] == str(path)
    assert status["default_limit"] == {"memory_limit": GiB, "sm_share": 30, "mode": "hard", "max_decoders": 0, "memory_guarantee": 0}
    assert status["gpus"] == [] and status["kernels"] == []


def test_status_says_whether_a_guard_runs(hami_env, capsys):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0
    assert json.loads(out)[0]["guard"] == {"running": False, "action": None, "written_unix": None,
                                           "error": None, "elsewhere": [], "parked": []}
    report = write_guard(hami_env.root, {}, action="kill", interval=5.0)
    code, out, _ = run(capsys, "status", "--json")
    assert json.loads(out)[0]["guard"] == {"running": True, "action": "kill",
                                           "written_unix": report["written_unix"], "error": None, "elsewhere": [], "parked": []}


def test_status_reports_a_corrupt_slice_and_shows_the_others(hami_env, capsys):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    make_slice(hami_env.root, "carol", memory_limit="2g")
    bad = hami_env.root / "bob.slice"
    bad.write_bytes(b"\xde\xad junk " * 1000)

    code, out, err = run(capsys, "status")
    assert code == 1
    assert "hami slice 'alice'" in out and "hami slice 'carol'" in out
    assert "bob" not in out
    assert f"hami-jupyter status: error: {bad}: not a slice file" in err
    assert "remove the file" in err  # the advice

    code, out, err = run(capsys, "status", "--json")
    assert code == 1
    assert [s["slice"] for s in json.loads(out)] == ["alice", "carol"]
    assert str(bad) in err


def test_status_of_a_missing_or_misnamed_slice(hami_env, capsys):
    code, out, err = run(capsys, "status", "nobody")
    assert code == 1
    assert f"slice 'nobody' does not exist ({hami_env.root / 'nobody.slice'})" in err

    code, out, err = run(capsys, "status", "no such name")
    assert code == 2
    assert "invalid slice name 'no such name'" in err


def test_status_lists_the_hubs_slice_root_too(hami_env, capsys):
    """Your own slice root, and the hub's beside it when it exists: every slice
    you can read, as the help says."""
    code, out, _ = run(capsys, "status")
    assert code == 0 and out.startswith(f"no slices under {hami_env.root}:")  # no hub here
    hami_env.hub_root.mkdir()
    code, out, _ = run(capsys, "status")
    assert code == 0 and out.startswith(f"no slices under {hami_env.root} or {hami_env.hub_root}:")

    mine = make_slice(hami_env.root, "alice", memory_limit="1g")
    hubs = make_slice(hami_env.hub_root, "bob", memory_limit="2g")
    code, out, err = run(capsys, "status")
    assert code == 0 and err == ""
    assert f"hami slice 'alice'  ({mine})" in out and f"hami slice 'bob'  ({hubs})" in out
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and [s["path"] for s in json.loads(out)] == [str(mine), str(hubs)]
    code, out, _ = run(capsys, "status", "--json", "--root", str(hami_env.root))
    assert code == 0 and [s["path"] for s in json.loads(out)] == [str(mine)]  # that folder only

    code, out, _ = run(capsys, "status", "--help")
    assert "every slice you can read under your slice root" in " ".join(out.split())
    assert "and under the hub's, /run/hami-jupyter" in " ".join(out.split())


def write_bad_registry_entries(path):
    """Beside a good entry (this process), entries a user could write by hand."""
    d = kernel_registry.registry_dir(path)
    kernel_registry.register(path, kernel_registry.new_entry(path, "k-good", "alice", "hami-python3",
                                                             os.getpid()))
    base = {"user": "alice", "kernelspec": "hami-python3", "started_unix": 1.0, "slice": str(path)}
    for kernel_id, pid in (("k-huge", 99999999999), ("k-text", "123"), ("k-none", None)):
        (d / f"{kernel_id}.json").write_text(json.dumps({**base, "kernel_id": kernel_id, "pid": pid}))
    (d / "k-junk.json").write_text("{not json")


def test_status_survives_bad_registry_entries(hami_env, capsys, caplog):
    """A pid of 99999999999 once crashed root's status with OverflowError."""
    path = make_slice(hami_env.root, "alice", memory_limit="1g")
    write_bad_registry_entries(path)
    with caplog.at_level("WARNING", logger="hami_jupyter"):
        code, out, err = run(capsys, "status")
    assert code == 0 and "Traceback" not in err
    assert "k-good  (alice, hami-python3)" in out
    assert "k-huge" not in out and "k-text" not in out and "k-junk" not in out
    assert "pid 99999999999 is out of range" in caplog.text and "k-junk.json skipped" in caplog.text

    code, out, _ = run(capsys, "status", "--json", "alice")
    assert code == 0
    [status] = json.loads(out)
    assert [k["kernel_id"] for k in status["kernels"]] == ["k-good"]


def test_status_skips_slices_it_cannot_trust_and_shows_the_others(hami_env, capsys):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    loose = make_slice(hami_env.root, "bob", memory_limit="2g")
    loose.chmod(0o666)  # anyone could rewrite its limits
    os.mkfifo(hami_env.root / "pipe.slice")  # opening it would block
    code, out, err = run(capsys, "status")
    assert code == 0
    assert "hami slice 'alice'" in out and "bob" not in out and "pipe" not in out
    assert f"warning: skipped slice file {loose} is writable by every user (mode 666)" in err
    assert f"warning: skipped slice file {hami_env.root / 'pipe.slice'} is a FIFO (named pipe)" in err

    code, _, err = run(capsys, "status", "bob")  # named: an error, with the fix
    assert code == 1
    assert f"error: slice file {loose} is writable by every user (mode 666): refused; run chmod o-w" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to give the slice root to another user")
def test_status_refuses_a_slice_root_another_user_made(hami_env, capsys):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    os.chown(hami_env.root, 1001, 1001)
    code, out, err = run(capsys, "status")
    assert code == 0 and out == ""
    assert f"warning: skipped slice folder {hami_env.root} is owned by uid 1001, not by you" in err
    assert "HAMI_SLICE_ROOT" in err


def test_status_refuses_a_path_that_names_no_slice(hami_env, capsys):
    for ref in (f"{hami_env.root}/a b.slice", f"{hami_env.root}/x.slice.slice", f"{hami_env.root}/"):
        code, _, err = run(capsys, "status", ref)
        assert code == 2 and "invalid slice path" in err, ref


# ---- doctor -------------------------------------------------------------------


def test_doctor_on_this_machine(hami_env, capsys):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    code, out, err = run(capsys, "doctor", "--json")
    checks = checks_by_name(out)
    driver = checks["NVIDIA driver"]
    if DRIVER_VERSION_FILE.exists():
        assert driver["status"] == "PASS"
    else:
        assert driver["status"] == "WARN"
        assert "simulated GPU" in driver["advice"]
        assert "the simulated GPU shows 1.0 GiB" in checks["preload library"]["detail"]
    assert checks["preload library"]["status"] == "PASS"
    assert checks["provisioner"]["status"] == "PASS"
    assert checks["kernelspecs"]["status"] == "PASS"
    assert "hami-python3" in checks["kernelspecs"]["detail"]
    assert checks["limit variables"]["status"] == "PASS"
    assert checks["slice root"]["status"] == "PASS"
    assert checks["guard"]["status"] == "WARN"  # no guard here: enforced only cooperatively
    assert checks['slice "alice"']["status"] == "PASS"
    assert "1.0 GiB" in checks['slice "alice"']["detail"]
    assert not [c for c in checks.values() if c["status"] == "FAIL"]
    assert code == 0

    code, out, _ = run(capsys, "doctor")
    assert code == 0
    assert "PASS  preload library" in out
    assert "0 failed" in out
    guard = next(x for x in out.splitlines() if x.startswith("WARN  guard"))
    assert f"no guard is running: no report {hami_env.root / 'guard.json'}" in guard
    assert "-> start it as root: `hami-jupyter agent`, the guard and the memory broker in one" in out


def test_doctor_labels_a_slice_named_root_apart_from_the_slice_root(hami_env, capsys):
    make_slice(hami_env.root, "root", memory_limit="1g")  # root's own slice, when root runs it
    code, out, _ = run(capsys, "doctor", "--json")
    names = [c["name"] for c in json.loads(out)]
    assert len(names) == len(set(names)), names
    checks = checks_by_name(out)
    assert checks["slice root"]["detail"] == f"{hami_env.root} (writable)"  # the folder
    assert checks['slice "root"']["detail"].startswith(f"{hami_env.root / 'root.slice'}: layout")


def test_doctor_guard_check(hami_env):
    path = make_slice(hami_env.root, "alice", memory_limit="1g")
    report_file = hami_env.root / "guard.json"

    check = doctor.check_guard()  # none: the caps hold only as far as every process cooperates
    assert (check.name, check.status) == ("guard", "WARN")
    assert check.detail == (f"no guard is running: no report {report_file}, so memory caps are "
                            "enforced only cooperatively, by the preload library in each process: "
                            "a process without it, or one that gets around it, is not held")
    assert check.advice == ("start it as root: `hami-jupyter agent`, the guard and the memory broker in one "
                            "(examples/hami-agent.service runs it under systemd; docs/guard.md)")

    report = write_guard(hami_env.root, {"alice": {"GPU-x": seen(3 << 30, 1 << 30, 1 << 30)}},
                         interval=0.5, action="kill", guard_pid=4242, host="gpu-node-1")
    check = doctor.check_guard(now=report["written_unix"] + 0.3)
    assert check.status == "PASS", check
    assert check.detail == (f"running (pid 4242 on gpu-node-1): action kill, a report every 0.5 s "
                            f"({report_file}, the last 0.3 s ago), 1 slice(s) seen; "
                            "over their cap now: alice")
    assert doctor.check_guard(path.parent, now=report["written_unix"] + 0.3) == check

    write_guard(hami_env.root, {}, errors=["GPU GPU-x: NVML: Unknown Error"])
    check = doctor.check_guard()
    assert check.status == "WARN" and check.detail.endswith("it cannot read: GPU GPU-x: NVML: Unknown Error")

    # Stopped writing: its process gone, or still there (stuck).
    report = write_guard(hami_env.root, {}, interval=0.5, guard_pid=99999999)
    check = doctor.check_guard(now=report["written_unix"] + 600)
    assert check.status == "WARN"
    assert check.detail.startswith(f"the guard stopped writing {report_file}: the last report is "
                                   "600 s old (it wrote every 0.5 s); its process 99999999 is gone. "
                                   "Until it writes again, memory caps are enforced only cooperatively")
    assert check.advice.startswith("restart it (systemctl restart hami-agent")
    report = write_guard(hami_env.root, {}, interval=0.5)  # this process: alive
    check = doctor.check_guard(now=report["written_unix"] + 600)
    assert f"its process {os.getpid()} still runs: stuck?" in check.detail

    report_file.write_text("[]")
    check = doctor.check_guard()
    assert check.status == "WARN" and "is not version 1" in check.detail


def test_doctor_fails_on_a_bad_limit_variable(hami_env, capsys, monkeypatch):
    monkeypatch.setenv("HAMI_MEMORY_LIMIT", "4x")
    code, out, _ = run(capsys, "doctor")
    assert code == 1
    line = next(x for x in out.splitlines() if "limit variables" in x)
    assert line.startswith("FAIL")
    assert "HAMI_MEMORY_LIMIT: memory limit '4x' is not a size" in line
    assert "-> HAMI_MEMORY_LIMIT is set by this shell (or whatever started this process); correct or unset it" in out


def test_doctor_names_where_a_kernelspecs_bad_limit_really_comes_from(hami_env, capsys,
                                                                       monkeypatch):
    """A bad variable makes every HAMi kernelspec fail: the fix is the variable
    (and who set it), never the kernel.json, which is fine."""
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.setenv("HAMI_SM_LIMIT", "half")
    code, out, _ = run(capsys, "doctor", "--json")
    assert code == 1
    checks = checks_by_name(out)
    kernelspecs = checks["kernelspecs"]
    assert kernelspecs["status"] == "FAIL" and "HAMI_SM_LIMIT" in kernelspecs["detail"]
    assert kernelspecs["advice"].startswith(
        "the bad value is not in the kernel.json: it is the environment variable HAMI_SM_LIMIT, "
        "set by this shell (or whatever started this process); correct or unset it there")
    assert checks["limit variables"]["advice"].startswith(
        "HAMI_SM_LIMIT is set by this shell (or whatever started this process)")

    monkeypatch.setenv("JUPYTERHUB_USER", "alice")  # in a server the hub started
    kernelspecs = checks_by_name(run(capsys, "doctor", "--json")[1])["kernelspecs"]
    assert ("HAMI_SM_LIMIT, set by JupyterHub, which gave it to this server; fix it in the hub's "
            "configuration") in kernelspecs["advice"]


def test_doctor_names_the_kernel_json_or_the_server_config_with_the_bad_limit(
        hami_env, capsys, monkeypatch):
    prefix = hami_env.tmp / "prefix"
    assert run(capsys, "kernelspec", "install", "--name", "gpu", "--memory", "1g",
               "--prefix", str(prefix))[0] == 0
    spec_file = prefix / "share/jupyter/kernels/gpu/kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["metadata"]["kernel_provisioner"]["config"]["memory_limit"] = "lots"
    spec_file.write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    config_dir = hami_env.tmp / "jupyter-config"
    config_dir.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config_dir))
    kernelspecs = checks_by_name(run(capsys, "doctor", "--json")[1])["kernelspecs"]
    assert kernelspecs["status"] == "FAIL"
    assert kernelspecs["advice"].startswith(f"fix the value in {spec_file}, or rewrite it with "
                                            "`hami-jupyter kernelspec install --name gpu ...`")

    spec["metadata"]["kernel_provisioner"]["config"]["memory_limit"] = "1g"
    spec_file.write_text(json.dumps(spec))
    server_config = config_dir / "jupyter_server_config.json"
    server_config.write_text(json.dumps({"HamiProvisioner": {"sm_limit": "most"}}))
    kernelspecs = checks_by_name(run(capsys, "doctor", "--json")[1])["kernelspecs"]
    assert kernelspecs["status"] == "FAIL"
    assert kernelspecs["advice"].startswith(
        "the bad value is not in the kernel.json: it comes from c.HamiProvisioner in the Jupyter "
        f"server's configuration ({server_config}); fix it there")


@pytest.mark.parametrize("name, value, words", [
    ("CUDA_DEVICE_MEMORY_LIMIT_01", "1g", "CUDA_DEVICE_MEMORY_LIMIT_01: set for a GPU"),
    ("CUDA_DEVICE_SM_LIMIT_16", "25", "CUDA_DEVICE_SM_LIMIT_16: set for a GPU"),
    ("HAMI_MAX_DECODERS_x", "2", "HAMI_MAX_DECODERS_x: set for a GPU"),
    ("CUDA_DEVICE_MEMORY_LIMIT", " 4g", "memory limit ' 4g' is not a size"),
    ("CUDA_DEVICE_SM_LIMIT", "\u0665\u0660", "SM share '\u0665\u0660' is not a whole percent"),
    ("HAMI_SM_MODE", "Hard", "SM mode 'Hard' is not one of hard, elastic"),
])
def test_doctor_reads_limit_variables_as_the_preload_library_does(hami_env, capsys, monkeypatch,
                                                                   name, value, words):
    """What the library would refuse (CUDA disabled) is a failed check here, never ignored."""
    monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "doctor", "--json")
    assert code == 1
    check = checks_by_name(out)["limit variables"]
    assert check["status"] == "FAIL" and words in check["detail"]


def test_doctor_fails_on_a_corrupt_or_missing_slice(hami_env, capsys):
    (hami_env.root).mkdir()
    (hami_env.root / "bob.slice").write_bytes(b"junk")
    code, out, _ = run(capsys, "doctor", "--json", "--slice", "bob")
    assert code == 1
    bob = checks_by_name(out)['slice "bob"']
    assert bob["status"] == "FAIL" and "truncated slice file" in bob["detail"]

    code, out, _ = run(capsys, "doctor", "--json", "--slice", "nobody")
    assert code == 1
    assert "does not exist" in checks_by_name(out)['slice "nobody"']["detail"]


# ---- kernelspec ---------------------------------------------------------------


def test_kernelspec_install_writes_limits_and_starts_a_kernel_in_them(
        hami_env, capsys, monkeypatch, start_kernel, cell):
    prefix = hami_env.tmp / "prefix"
    code, out, err = run(capsys, "kernelspec", "install", "--name", "gpu-small",
                         "--memory", "1g", "--sm", "25", "--prefix", str(prefix))
    assert code == 0, err
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "gpu-small"
    assert f"installed kernelspec 'gpu-small' (Python 3 (HAMi vGPU, 1.0 GiB, SM 25 %)) in {spec_dir}" in out
    # --prefix is not where Jupyter looks by default: the command says so.
    assert f"add {prefix / 'share' / 'jupyter'} to JUPYTER_PATH" in out
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["argv"][-1] == "--ext=hami_jupyter.magic"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "hami-provisioner",
        "config": {"memory_limit": "1g", "sm_limit": 25},
    }

    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    code, out, _ = run(capsys, "kernelspec", "list")
    assert code == 0
    assert "gpu-small  Python 3 (HAMi vGPU, 1.0 GiB, SM 25 %)" in out
    assert ("its kernels get: memory 1.0 GiB (from memory_limit (kernelspec)), "
            "SM 25 % (hard; from sm_limit (kernelspec))") in out

    _, kc = start_kernel("gpu-small")
    [path] = list_slice_paths(hami_env.root)
    assert path.name.endswith("-gpu-small.slice")  # a kernelspec with limits: a slice of its own
    assert slice_status(path)["default_limit"] == {"memory_limit": GiB, "sm_share": 25, "mode": "hard", "max_decoders": 0, "memory_guarantee": 0}
    result = cell(kc, "from hami_jupyter import driver_memory as d\n"
                      "d.init()\n"
                      "print(d.mem_get_info()[1])")
    assert result.error is None, result.error
    assert int(result.stdout) == GiB


def test_hami_kernelspecs_carry_a_logo(hami_env, capsys):
    """Issue 35, item 9: the launcher showed a generic icon for "Python 3 (HAMi
    vGPU)". The shipped kernelspec and those `kernelspec install` writes carry
    the chip as logo-svg and PNG logos, which Jupyter serves as the spec's resources."""
    from types import SimpleNamespace

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_server.services.kernelspecs.handlers import kernelspec_model

    shipped = Path(__file__).resolve().parents[2] / "share" / "jupyter" / "kernels"
    found = KernelSpecManager(kernel_dirs=[str(shipped)]).get_all_specs()["hami-python3"]
    # What the server's GET api/kernelspecs answers, whose logo the launcher shows.
    model = kernelspec_model(SimpleNamespace(base_url="/"), "hami-python3", found["spec"],
                             found["resource_dir"])
    assert {"logo-svg", "logo-32x32", "logo-64x64"} <= set(model["resources"]), model
    folder = Path(found["resource_dir"])
    assert (folder / "logo-64x64.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "logo-svg.svg").read_text().startswith("<svg")

    prefix = hami_env.tmp / "prefix"
    code, _, err = run(capsys, "kernelspec", "install", "--name", "gpu-small", "--memory", "1g",
                       "--prefix", str(prefix))
    assert code == 0, err
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "gpu-small"
    assert {p.name for p in spec_dir.iterdir()} >= {"kernel.json", "logo-svg.svg", "logo-64x64.png"}


@pytest.mark.parametrize("args, message", [
    (["--memory", "4x"], "--memory: memory limit '4x' is not a size"),
    (["--memory", "0"], "--memory: a memory limit of 0 would refuse every allocation"),
    (["--sm", "150"], "--sm: SM share '150' is not a whole percent of each GPU (1-99; 0 or 100: no share)"),
    (["--sm", "half"], "--sm: SM share 'half' is not a whole percent"),
    (["--sm", " 25"], "--sm: SM share ' 25' is not a whole percent"),
    (["--sm", "\u0665\u0660"], "--sm: SM share '\u0665\u0660' is not a whole percent"),
    (["--memory", "4g "], "--memory: memory limit '4g ' is not a size"),
    (["--mode", "Elastic"], "--mode: SM mode 'Elastic' is not one of hard, elastic"),
    (["--mode", "soft"], "--mode: SM mode 'soft' is not one of hard, elastic"),
    (["--slice", "a b"], "--slice: invalid slice name 'a b'"),
    (["--slice", "/srv/slices/a b.slice"], "--slice: invalid slice path '/srv/slices/a b.slice'"),
    (["--name", "../up"], "--name: '../up' is not a kernelspec name"),
    (["--name", "with space"], "--name: 'with space' is not a kernelspec name"),
])
def test_kernelspec_install_refuses_bad_values_and_writes_nothing(hami_env, capsys, args, message):
    prefix = hami_env.tmp / "prefix"
    argv = ["kernelspec", "install", "--prefix", str(prefix)] + args
    if "--name" not in args:
        argv += ["--name", "gpu-small"]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert f"hami-jupyter kernelspec install: error: {message}" in err
    assert "Traceback" not in err and out == ""
    assert not prefix.exists()


def test_kernelspec_install_reports_every_bad_value_at_once(hami_env, capsys):
    prefix = hami_env.tmp / "prefix"
    code, out, err = run(capsys, "kernelspec", "install", "--name", "bad!", "--memory", "4x",
                         "--sm", "150", "--mode", "soft", "--prefix", str(prefix))
    assert code == 2 and out == "" and not prefix.exists()
    lines = err.splitlines()
    assert [line.split(": error: ")[1].split(":")[0] for line in lines] == [
        "--name", "--memory", "--sm", "--mode"], err


def test_kernelspec_list_says_what_applies_where_the_kernelspec_is_silent(
        hami_env, capsys, monkeypatch):
    """A kernelspec that sets only memory: its kernels get the SM share of the
    server's configuration and of the environment, or none, and the list says which."""
    prefix = hami_env.tmp / "prefix"
    assert run(capsys, "kernelspec", "install", "--name", "mem-only", "--memory", "2g",
               "--prefix", str(prefix))[0] == 0
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    config_dir = hami_env.tmp / "jupyter-config"
    config_dir.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config_dir))

    def listed():
        code, out, _ = run(capsys, "kernelspec", "list")
        assert code == 0
        return next(line for line in out.splitlines()[out.splitlines().index(
            next(x for x in out.splitlines() if x.startswith("mem-only"))) + 1:])

    assert listed() == "  its kernels get: memory 2.0 GiB (from memory_limit (kernelspec)), SM unlimited"
    monkeypatch.setenv("HAMI_SM_LIMIT", "40")
    assert listed().endswith("SM 40 % (hard; from HAMI_SM_LIMIT (this environment))")
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(
        {"HamiProvisioner": {"sm_limit": 30, "memory_limit": "1g"}}))
    assert listed() == ("  its kernels get: memory 1.0 GiB (from memory_limit (server config)), "
                        "SM 30 % (hard; from sm_limit (server config))")


def test_kernelspec_install_default_display_name_and_mode(hami_env, capsys):
    prefix = hami_env.tmp / "prefix"
    code, _, err = run(capsys, "kernelspec", "install", "--name", "GPU-Half", "--memory", "8g",
                       "--sm", "50", "--mode", "elastic", "--slice", "team", "--prefix", str(prefix))
    assert code == 0, err
    spec = json.loads((prefix / "share/jupyter/kernels/gpu-half/kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (HAMi vGPU, 8.0 GiB, SM 50 % elastic)"
    assert spec["metadata"]["kernel_provisioner"]["config"] == {
        "memory_limit": "8g", "sm_limit": 50, "sm_mode": "elastic", "slice": "team"}


# ---- usage and the installed command -------------------------------------------


def test_usage_errors_exit_2(hami_env, capsys):
    assert run(capsys)[0] == 2
    assert run(capsys, "kernelspec")[0] == 2
    code, _, err = run(capsys, "kernelspec", "install", "--name", "x", "--user", "--prefix", "/tmp")
    assert code == 2 and "not allowed with argument --user" in err
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert all(c in out for c in ("status", "doctor", "kernelspec", "demo"))


def _commands():
    script = Path(sys.executable).parent / "hami-jupyter"
    commands = [[sys.executable, "-m", "hami_jupyter"]]
    if script.exists():
        commands.append([str(script)])
    return commands


@pytest.mark.parametrize("command", _commands(), ids=lambda c: Path(c[-1]).name)
def test_installed_command(hami_env, command):
    make_slice(hami_env.root, "alice", memory_limit="1g")
    proc = subprocess.run(command + ["status", "--json"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    [status] = json.loads(proc.stdout)
    assert status["slice"] == "alice" and status["default_limit"]["memory_limit"] == GiB

    proc = subprocess.run(command + ["kernelspec", "install", "--name", "x", "--memory", "4x",
                                     "--prefix", str(hami_env.tmp / "prefix")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "--memory: memory limit '4x' is not a size" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- without the optional extras ------------------------------------------------

# Runs the command as a user without JupyterHub or KubeSpawner would: importing
# them fails as it does where they are not installed.
WITHOUT_EXTRAS = """
import contextlib, io, json, sys, traceback

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jupyterhub", "kubespawner"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from hami_jupyter.commands.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code or 0
        except BaseException:
            traceback.print_exc()
            code = "raised"
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(results))
"""


def without_extras(*commands):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, json.dumps(commands)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def every_command():
    """Every command and subcommand of ``hami-jupyter``, as argument lists."""
    from hami_jupyter.commands.cli import build_parser

    def walk(parser, prefix):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [prefix]
        return [found for name, sub in subs[0].choices.items() for found in walk(sub, prefix + [name])]

    return walk(build_parser(with_demo_options=True), [])


def test_every_help_works_without_the_optional_extras(hami_env):
    commands = every_command()
    assert ["hub-service"] in commands and ["slice", "reset"] in commands
    for r in without_extras(*[c + ["--help"] for c in commands]):
        assert r["code"] == 0 and "Traceback" not in r["err"], r
        assert r["out"].strip(), r  # the help itself


def test_a_command_whose_extra_is_missing_names_the_extra(hami_env):
    [r] = without_extras(["hub-service"])
    assert r["code"] == 1 and r["out"] == "", r
    assert r["err"] == ("hami-jupyter hub-service: error: this command needs jupyterhub, which is "
                        "not installed here: pip install 'hami-jupyter[hub]'\n"), r
