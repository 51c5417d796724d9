"""HamiProvisioner: real kernels, started by real KernelManagers, in their slices.

Every kernel here is an ipykernel process under the preload library on the
simulated GPU (16 GiB, 64 MiB charged per CUDA context); allocations go
through ``hami_jupyter.driver_memory`` as PyTorch's would go through the driver.
"""

import getpass
import json
import logging
import os
import signal
import sys
import time

import pytest

from hami_jupyter import native
from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.provisioning.provisioner import SliceSetupError
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.change import set_memory_limit
from hami_jupyter.slice.create import create_limits_file, create_slice
from hami_jupyter.slice.status import slice_status

GiB = 1 << 30
MiB = 1 << 20
USER = getpass.getuser()

ALLOC = """
from hami_jupyter import driver_memory as cuda
cuda.init()
held = []
def grab(mib):
    try:
        held.append(cuda.DeviceBuffer(mib << 20))
        print("ok", mib)
    except cuda.CudaError as e:
        print("refused", mib, e.name)
"""


def kernel_env(kc, cell, *names):
    r = cell(kc, f"import os, json; print(json.dumps({{n: os.environ.get(n) for n in {list(names)!r}}}))")
    assert r.error is None, r.error
    return json.loads(r.stdout)


def total_seen(kc, cell):
    r = cell(kc, "from hami_jupyter import driver_memory as cuda; cuda.init(); print(cuda.mem_get_info()[1])")
    assert r.error is None, r.error
    return int(r.stdout)


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# ---- the launch -------------------------------------------------------------


def test_kernel_starts_under_the_preload_in_the_users_slice(hami_env, start_kernel, cell):
    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    env = kernel_env(kc, cell, "LD_PRELOAD", "HAMI_SLICE", "HAMI_KERNEL_ID")
    assert env["LD_PRELOAD"].split(":")[-1] == str(native.library_path())
    assert env["HAMI_SLICE"] == str(hami_env.root / f"{USER}.slice")
    assert env["HAMI_KERNEL_ID"] == km.kernel_id
    assert total_seen(kc, cell) == GiB

    r = cell(kc, ALLOC + "grab(512); grab(512)")
    assert r.stdout.split("\n")[:2] == ["ok 512", "refused 512 CUDA_ERROR_OUT_OF_MEMORY"]
    status = slice_status(env["HAMI_SLICE"])
    (kernel,) = status["kernels"]
    assert kernel["kernel_id"] == km.kernel_id
    assert (kernel["user"], kernel["kernelspec"]) == (USER, "hami-python3")
    assert kernel["memory_used"] == 512 * MiB + 64 * MiB  # the buffer and the context


def test_existing_ld_preload_is_kept_and_ours_appended(hami_env, start_kernel, cell):
    other = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.exists(other):
        pytest.skip("no libm at the Debian path on this machine")
    km, kc = start_kernel(env={"LD_PRELOAD": other})
    preload = kernel_env(kc, cell, "LD_PRELOAD")["LD_PRELOAD"]
    assert preload == f"{other}:{native.library_path()}"


# ---- where limits come from --------------------------------------------------

LAYERS = {
    "kernelspec": {"config": {"memory_limit": "1g"}},
    "server": {"server_config": {"memory_limit": "2g"}},
    "hub": {"env": {"HAMI_MEMORY_LIMIT": "3g"}},
    "hami": {"env": {"CUDA_DEVICE_MEMORY_LIMIT": "4g"}},
}


@pytest.mark.parametrize("top,expected", [
    ("kernelspec", 1 * GiB), ("server", 2 * GiB), ("hub", 3 * GiB), ("hami", 4 * GiB)])
def test_each_layer_reaches_the_slice(hami_env, start_kernel, cell, top, expected):
    # Every layer under the top one asks for more: the top one is the strictest.
    names = list(LAYERS)
    env, server, config = {}, {}, {}
    for layer in names[names.index(top):]:  # the top layer and every less specific one
        spec = LAYERS[layer]
        env.update(spec.get("env", {}))
        server.update(spec.get("server_config", {}))
        config.update(spec.get("config", {}))
    km, kc = start_kernel(env=env, server_config=server, **config)
    assert total_seen(kc, cell) == expected
    slice_file = kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"]
    # A kernelspec with limits of its own gets a slice of its own.
    want = f"{USER}-hami-python3.slice" if top == "kernelspec" else f"{USER}.slice"
    assert os.path.basename(slice_file) == want
    assert read_snapshot(slice_file).fallback_limit.memory_limit == expected


def test_hami_device_plugin_variables(hami_env, start_kernel, cell, tmp_path):
    shared = tmp_path / "vgpu" / "cache.slice"
    km, kc = start_kernel(env={"CUDA_DEVICE_MEMORY_LIMIT": "3000m", "CUDA_DEVICE_SM_LIMIT": "30",
                               "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(shared)})
    assert kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"] == str(shared)
    assert total_seen(kc, cell) == 3000 * MiB
    limit = read_snapshot(shared).devices[0].limit
    assert (limit.memory_limit, limit.sm_share) == (3000 * MiB, 30)


def test_sm_share_and_mode_reach_the_slice(hami_env, start_kernel, cell):
    km, kc = start_kernel(sm_limit=25, sm_mode="elastic")
    path = kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"]
    fallback = read_snapshot(path).fallback_limit
    assert (fallback.sm_share, fallback.mode, fallback.memory_limit) == (25, "elastic", 0)


@pytest.fixture
def kernelspec(hami_env, monkeypatch):
    """``kernelspec(name, env=None, config=None)``: write ``<name>/kernel.json`` as a
    user would (the hami provisioner named in its metadata) where Jupyter finds it."""
    data = hami_env.tmp / "jupyter-data"
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(hami_env.tmp / "runtime"))

    def write(name, env=None, config=None):
        folder = data / "kernels" / name
        folder.mkdir(parents=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name, "language": "python",
                "metadata": {"kernel_provisioner": {"provisioner_name": "hami-provisioner",
                                                    **({"config": config} if config else {})}}}
        if env is not None:
            spec["env"] = env
        (folder / "kernel.json").write_text(json.dumps(spec))
        return name

    return write


ASK = """
from hami_jupyter import driver_memory as cuda
cuda.init()
held = []
for mib in (3072, 1900, 100):
    try:
        held.append(cuda.DeviceBuffer(mib << 20))
        print("ok", mib)
    except cuda.CudaError as e:
        print("refused", mib)
"""


def test_kernelspec_env_limit_caps_the_kernel(hami_env, start_kernel, kernelspec, cell):
    # Issue 11, item 1: the limit in a kernelspec's "env" made no cap at all.
    name = kernelspec("gpu-2g", env={"CUDA_DEVICE_MEMORY_LIMIT": "2g"})
    km, kc = start_kernel(kernel_name=name)
    env = kernel_env(kc, cell, "HAMI_SLICE", "CUDA_DEVICE_MEMORY_LIMIT")
    assert read_snapshot(env["HAMI_SLICE"]).fallback_limit.memory_limit == 2 * GiB
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(2 * GiB)
    assert total_seen(kc, cell) == 2 * GiB
    # 3 GiB is refused; 1900 MiB + the 64 MiB context fit in 2 GiB, 100 MiB more do not.
    assert cell(kc, ASK).stdout.split() == ["refused", "3072", "ok", "1900", "refused", "100"]
    # Limits of its own: a slice of its own, like a kernelspec's provisioner config.
    assert os.path.basename(env["HAMI_SLICE"]) == f"{USER}-gpu-2g.slice"


@pytest.mark.parametrize("spec_env,spec_config,server_config,server_env,expected", [
    ({"CUDA_DEVICE_MEMORY_LIMIT": "2g"}, None, {"memory_limit": "4g"}, {}, 2 * GiB),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "2g"}, {"memory_limit": "1g"}, {}, {}, 1 * GiB),
    (None, None, {}, {"HAMI_MEMORY_LIMIT": "3g"}, 3 * GiB),
    # The other way round: a more specific place asking for more loosens nothing.
    ({"HAMI_MEMORY_LIMIT": "4g"}, None, {}, {"HAMI_MEMORY_LIMIT": "1g"}, 1 * GiB),
    (None, {"memory_limit": "8g"}, {"memory_limit": "2g"}, {}, 2 * GiB),
    (None, {"memory_limit": "8g"}, {}, {"CUDA_DEVICE_MEMORY_LIMIT": "1500m"}, 1500 * MiB),
], ids=["server-config-4g+spec-env-2g", "spec-config-1g+spec-env-2g", "server-env-3g",
        "spec-env-4g+hub-1g", "spec-config-8g+server-config-2g", "spec-config-8g+hami-1500m"])
def test_strictest_memory_limit_wins(hami_env, start_kernel, kernelspec, cell,
                                     spec_env, spec_config, server_config, server_env, expected):
    name = kernelspec("sized", env=spec_env, config=spec_config)
    km, kc = start_kernel(kernel_name=name, env=server_env, server_config=server_config)
    env = kernel_env(kc, cell, "HAMI_SLICE", "CUDA_DEVICE_MEMORY_LIMIT", "HAMI_MEMORY_LIMIT")
    assert read_snapshot(env["HAMI_SLICE"]).fallback_limit.memory_limit == expected
    assert total_seen(kc, cell) == expected
    # The kernel's environment says what its slice enforces, in one variable.
    assert (env["CUDA_DEVICE_MEMORY_LIMIT"], env["HAMI_MEMORY_LIMIT"]) == (str(expected), None)


def test_strictest_sm_share_and_mode_win(hami_env, start_kernel, kernelspec, cell):
    name = kernelspec("fast", config={"sm_limit": 50, "sm_mode": "elastic"},
                      env={"CUDA_DEVICE_SM_LIMIT": "40"})
    km, kc = start_kernel(kernel_name=name, env={"HAMI_SM_LIMIT": "25", "HAMI_SM_MODE": "hard"})
    env = kernel_env(kc, cell, "HAMI_SLICE", "CUDA_DEVICE_SM_LIMIT", "HAMI_SM_MODE")
    fallback = read_snapshot(env["HAMI_SLICE"]).fallback_limit
    assert (fallback.sm_share, fallback.mode) == (25, "hard")
    assert (env["CUDA_DEVICE_SM_LIMIT"], env["HAMI_SM_MODE"]) == ("25", "hard")


def test_per_gpu_limit_never_loosens_the_limit_of_every_gpu():
    # A GPU's own value stands only where it is stricter than every GPU's.
    limits = resolve_limits({}, {}, layers=[
        ("kernelspec 'k' env", "env", {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g", "CUDA_DEVICE_MEMORY_LIMIT_1": "1g"}),
        ("server environment", "env", {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "CUDA_DEVICE_MEMORY_LIMIT_1": "512m"}),
    ])
    assert (limits.limits.memory_limit, limits.memory_per_gpu) == (2 * GiB, {1: 512 * MiB})
    assert limits.sources["CUDA_DEVICE_MEMORY_LIMIT_1"] == "CUDA_DEVICE_MEMORY_LIMIT_1 (server environment)"


def test_kernel_creating_its_slice_gets_the_strictest_per_gpu_variables(
        hami_env, start_kernel, kernelspec, cell):
    # Per-GPU limits: the kernel's preload library creates the slice from its environment.
    name = kernelspec("gpu0", env={"CUDA_DEVICE_MEMORY_LIMIT_0": "1g", "HAMI_MAX_DECODERS_0": "8",
                                   "HAMI_MAX_DECODERS_1": "1"})
    km, kc = start_kernel(kernel_name=name, env={"CUDA_DEVICE_MEMORY_LIMIT": "4g",
                                                 "HAMI_MAX_DECODERS": "2"})
    names = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0", "HAMI_MAX_DECODERS",
             "HAMI_MAX_DECODERS_0", "HAMI_MAX_DECODERS_1")
    assert kernel_env(kc, cell, *names) == dict(zip(names, (
        str(4 * GiB), str(GiB), "2", None, "1")))  # 8 decoders on GPU 0 would loosen it
    assert total_seen(kc, cell) == GiB


def test_malformed_kernelspec_env_limit_refuses_the_start(hami_env, start_kernel, kernelspec):
    name = kernelspec("bad", env={"CUDA_DEVICE_MEMORY_LIMIT": "2 gigs"})
    with pytest.raises(SliceSetupError) as info:
        # A stricter limit elsewhere does not excuse the malformed one.
        start_kernel(kernel_name=name, env={"HAMI_MEMORY_LIMIT": "1g"})
    message = str(info.value)
    for words in ("kernel was not started", "kernelspec 'bad' env", "CUDA_DEVICE_MEMORY_LIMIT",
                  "'2 gigs' is not a size"):
        assert words in message
    # Nothing started, nothing registered, and no connection file left behind.
    assert not list(hami_env.root.glob("*.kernels/*.json")) if hami_env.root.exists() else True
    assert not list((hami_env.tmp / "runtime").glob("kernel-*.json"))


def hami_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("hami-jupyter: kernel")]


def test_live_slice_keeps_its_limits_and_the_kernel_is_told(hami_env, start_kernel, cell, caplog):
    caplog.set_level(logging.INFO)
    env = {"HAMI_MEMORY_LIMIT": "1g"}
    path = hami_env.root / f"{USER}.slice"
    km_a, kc_a = start_kernel(env=env)
    cell(kc_a, ALLOC + "grab(10)")  # a live process of the slice
    assert hami_warnings(caplog) == []
    set_memory_limit(path, None, 3 * GiB)  # an admin resizes the running slice
    km_b, kc_b = start_kernel(env=env)
    (warning,) = hami_warnings(caplog)
    assert "asked for memory 1.0 GiB" in warning and "holds memory 3.0 GiB" in warning
    assert str(path) in warning and "running" in warning
    # The kernel's environment agrees with what its slice enforces.
    assert kernel_env(kc_b, cell, "CUDA_DEVICE_MEMORY_LIMIT")["CUDA_DEVICE_MEMORY_LIMIT"] == str(3 * GiB)
    assert total_seen(kc_b, cell) == 3 * GiB


def test_hub_limits_file_is_in_force(hami_env, start_kernel, cell, caplog):
    path = hami_env.root / f"{USER}.slice"
    held = resolve_limits({"memory_limit": "2g", "sm_limit": 30}, {}).limits
    create_slice(path, USER, held)
    create_limits_file(path, held)
    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    (warning,) = hami_warnings(caplog)
    assert "asked for memory 1.0 GiB, SM unlimited" in warning
    assert "holds memory 2.0 GiB, SM 30 % (hard)" in warning and "the hub owns its limits" in warning
    env = kernel_env(kc, cell, "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")
    assert env == {"CUDA_DEVICE_MEMORY_LIMIT": str(2 * GiB), "CUDA_DEVICE_SM_LIMIT": "30"}
    assert total_seen(kc, cell) == 2 * GiB


# ---- bad limits never start a kernel ----------------------------------------


@pytest.mark.parametrize("kwargs,words", [
    ({"config": {"memory_limit": "4x"}}, ["memory limit '4x' is not a size", "kernelspec"]),
    ({"config": {"memory_limit": "0"}}, ["would refuse every allocation"]),
    ({"config": {"sm_limit": 150}}, ["SM share 150", "1-99; 0 or 100: no share"]),
    ({"config": {"sm_mode": "soft"}}, ["SM mode 'soft'", "hard, elastic"]),
    ({"env": {"HAMI_MEMORY_LIMIT": "lots"}}, ["HAMI_MEMORY_LIMIT", "not a size"]),
    ({"env": {"CUDA_DEVICE_SM_LIMIT_1": "-5"}}, ["CUDA_DEVICE_SM_LIMIT_1"]),
    ({"env": {"HAMI_SLICE": "two words"}}, ["invalid slice name 'two words'"]),
])
def test_bad_limits_stop_the_kernel_with_a_clear_message(hami_env, start_kernel, kwargs, words):
    with pytest.raises(SliceSetupError) as info:
        start_kernel(env=kwargs.get("env"), **kwargs.get("config", {}))
    for w in words:
        assert w in str(info.value)
    # Nothing started, nothing registered.
    assert not list(hami_env.root.glob("*.kernels/*.json")) if hami_env.root.exists() else True


def test_corrupt_slice_file_stops_the_kernel(hami_env, start_kernel):
    hami_env.root.mkdir(parents=True)
    (hami_env.root / f"{USER}.slice").write_bytes(b"not a slice" * 100)
    with pytest.raises(SliceSetupError, match="cannot prepare slice file .*not a slice file"):
        start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})


# ---- one slice, many kernels; restart, shutdown, death ------------------------


def test_two_kernels_of_one_user_share_the_slice(hami_env, start_kernel, cell):
    env = {"HAMI_MEMORY_LIMIT": "1g"}
    km_a, kc_a = start_kernel(env=env)
    km_b, kc_b = start_kernel(env=env)
    assert cell(kc_a, ALLOC + "grab(600)").stdout.strip() == "ok 600"
    r = cell(kc_b, ALLOC + "grab(600); grab(200)")
    # 600 + 64 (A's context) + 64 (B's) leaves 296 MiB of the 1 GiB.
    assert r.stdout.split("\n")[:2] == ["refused 600 CUDA_ERROR_OUT_OF_MEMORY", "ok 200"]
    status = slice_status(hami_env.root / f"{USER}.slice")
    by_id = {k["kernel_id"]: k["memory_used"] for k in status["kernels"]}
    assert by_id == {km_a.kernel_id: 664 * MiB, km_b.kernel_id: 264 * MiB}
    assert status["gpus"][0]["memory_used"] == 928 * MiB


def test_restart_keeps_the_slice_and_frees_the_old_process(hami_env, start_kernel, cell):
    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    path = hami_env.root / f"{USER}.slice"
    assert cell(kc, ALLOC + "grab(900)").stdout.strip() == "ok 900"
    km.restart_kernel(now=True)
    kc.wait_for_ready(timeout=60)
    assert kernel_env(kc, cell, "HAMI_SLICE")["HAMI_SLICE"] == str(path)
    assert [k.kernel_id for k in kernel_registry.kernels(path)] == [km.kernel_id]
    # The restarted kernel has the whole cap again: the old process's 964 MiB are gone.
    assert cell(kc, ALLOC + "grab(900)").stdout.strip() == "ok 900"


def test_shutdown_unregisters_the_kernel_and_frees_its_slot(hami_env, start_kernel, cell):
    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    path = hami_env.root / f"{USER}.slice"
    cell(kc, ALLOC + "grab(100)")
    assert len(read_snapshot(path).slots) == 1
    kc.stop_channels()
    km.shutdown_kernel()
    assert kernel_registry.kernels(path, include_dead=True) == []
    snap = read_snapshot(path)
    assert (snap.slots, snap.stale_slots) == ((), ())
    assert snap.devices[0].memory_used == 0


def test_killed_kernel_is_reclaimed(hami_env, start_kernel, cell):
    env = {"HAMI_MEMORY_LIMIT": "1g"}
    km, kc = start_kernel(env=env)
    path = hami_env.root / f"{USER}.slice"
    cell(kc, ALLOC + "grab(800)")
    os.kill(km.provisioner.pid, signal.SIGKILL)
    assert wait_until(lambda: not km.is_alive())
    status = slice_status(path)
    # The dead process's memory no longer shows as used, and its kernel is gone.
    assert (status["gpus"][0]["memory_used"], status["kernels"], status["dead_processes"]) == (0, [], 1)
    # A new kernel gets the whole cap: its first charge at the cap reclaims the dead slot.
    km2, kc2 = start_kernel(env=env)
    assert cell(kc2, ALLOC + "grab(900)").stdout.strip() == "ok 900"
    assert wait_until(lambda: read_snapshot(path).stale_slots == ())


def test_a_kernel_that_died_comes_back_when_its_port_was_taken(hami_env, start_kernel, cell):
    """A kernel that dies while another process takes one of its ports (any
    program's outgoing connection may land on a port a kernel left free) is
    restarted on new ports. On its old ports every automatic restart would
    fail to bind, and Jupyter Server would drop the kernel after five."""
    import socket

    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    old = km.get_connection_info()
    os.kill(km.provisioner.pid, signal.SIGKILL)
    assert wait_until(lambda: not km.is_alive())  # as the kernel restarter sees it
    taker = socket.socket()
    taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old connections' TIME_WAIT
    try:
        taker.bind((old["ip"], old["shell_port"]))
        taker.listen()
        kc.stop_channels()
        km.restart_kernel(now=True, newports=True)  # what the restarter does next
        kc = km._test_client = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=30)  # on its old ports the kernel exits at once
        assert cell(kc, ALLOC + "grab(100)").stdout.strip() == "ok 100"
    finally:
        taker.close()
    # A restart the user asks for keeps the ports: clients that know them stay valid.
    ports = km.ports
    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=60)
    assert km.ports == ports


def test_live_slice_keeps_limits_changed_while_it_runs(hami_env, start_kernel, cell):
    env = {"HAMI_MEMORY_LIMIT": "1g"}
    path = hami_env.root / f"{USER}.slice"
    km_a, kc_a = start_kernel(env=env)
    cell(kc_a, ALLOC + "grab(10)")
    set_memory_limit(path, None, 2 * GiB)  # an admin resizes the running slice
    km_b, kc_b = start_kernel(env=env)
    assert total_seen(kc_b, cell) == 2 * GiB  # not put back to 1 GiB by the new kernel
    for km, kc in ((km_a, kc_a), (km_b, kc_b)):
        kc.stop_channels()
        km.shutdown_kernel()
    # Idle again: the next kernel brings the configured limit back.
    km_c, kc_c = start_kernel(env=env)
    assert total_seen(kc_c, cell) == GiB


def test_provisioner_info_round_trips_the_slice(hami_env, start_kernel):
    import asyncio

    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    info = asyncio.run(km.provisioner.get_provisioner_info())
    assert info["hami_slice"] == str(hami_env.root / f"{USER}.slice")


def test_a_server_the_hub_did_not_start_never_puts_kernels_in_the_hubs_folder(tmp_path, monkeypatch):
    """Issue 39: once /run/hami-jupyter existed, a root JupyterLab started on the
    host by hand put its kernels' slices there, among the hub users'. Only a
    server the hub started (HAMI_HUB_SLICE) runs kernels in the hub's folder;
    any other uses HAMI_SLICE_ROOT, else the user's own folder."""
    from hami_jupyter.provisioning.provisioner import HamiProvisioner
    from hami_jupyter.slice import paths

    hub_root = tmp_path / "run-hami-jupyter"
    hub_root.mkdir()
    monkeypatch.setattr(paths, "HUB_ROOT", hub_root)
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "JUPYTERHUB_USER": "root"}
    assert paths.default_root(env) == hub_root  # what the host's tools read stays the hub's
    path = HamiProvisioner().resolve_slice(env)
    assert path == tmp_path / "xdg" / "hami-jupyter" / "root.slice"
    explicit = HamiProvisioner().resolve_slice(dict(env, HAMI_SLICE_ROOT=str(tmp_path / "mine")))
    assert explicit == tmp_path / "mine" / "root.slice"
    hub = hub_root / "alice.slice"
    assert HamiProvisioner().resolve_slice(env, hub=hub) == hub
