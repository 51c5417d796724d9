"""The hub makes each user's slice: who owns what, and what the user can do with it.

Needs root (CI runs as root): files are handed to user ``nobody`` and the
user's side is played by processes (and this process's effective ids)
switched to ``nobody``.
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from hami_jupyter import native
from hami_jupyter.hub.sizes import parse_size_spec
from hami_jupyter.gpus import HostGpu
from hami_jupyter.hub.slice_files import prepare_user_slice
from hami_jupyter.hub.spawner import EXTENSION_ARG, pre_spawn_hook
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.change import limits_writable, set_memory_limit

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another user")

GiB, MiB = 1 << 30, 1 << 20
NOBODY = 65534
OOM = 2
SIM_UUIDS = ["GPU-5a1f0000-0000-4000-8000-000000000000", "GPU-5a1f0000-0000-4000-8000-000000000001"]
GPUS = [HostGpu(i, u, memory_total=16 * GiB) for i, u in enumerate(SIM_UUIDS)]


@pytest.fixture
def world(tmp_path_factory):
    """A folder every user can reach, with copies of the native files in it
    (the checkout may sit where user nobody cannot look)."""
    base = Path(tempfile.mkdtemp(prefix="hami-hub-", dir="/tmp"))
    os.chmod(base, 0o755)
    bin_dir = base / "bin"
    (bin_dir / "sim").mkdir(parents=True)
    shutil.copy(native.library_path(), bin_dir / "libvgpu.so")
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        shutil.copy(native.sim_library_dir() / lib, bin_dir / "sim" / lib)
    shutil.copy(native.cudrive_path(), bin_dir / "cudrive")
    run_dir = base / "run"
    run_dir.mkdir(mode=0o777)
    os.chmod(run_dir, 0o777)  # the simulated GPU's state and schedule, shared by all
    yield SimpleNamespace(base=base, bin=bin_dir, run=run_dir, root=base / "slices")
    shutil.rmtree(base, ignore_errors=True)


def cudrive(world, slice_file, *ops, as_nobody=False):
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_PRELOAD": str(world.bin / "libvgpu.so"),
        "LD_LIBRARY_PATH": str(world.bin / "sim"),
        "HAMI_SIM_STATE": str(world.run / "sim-state"),
        "HAMI_SIM_DEVICES": "2",
        "HAMI_SCHEDULE_DIR": str(world.run),
        "HAMI_CONTEXT_OVERHEAD": "0",
        "HAMI_SLICE": str(slice_file),
    }
    ids = {"user": NOBODY, "group": NOBODY} if as_nobody else {}
    proc = subprocess.run([str(world.bin / "cudrive"), *ops], env=env, capture_output=True,
                          text=True, timeout=60, **ids)
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


class effective:
    """Run a block with this process's effective uid/gid switched (root only)."""

    def __init__(self, uid, gid):
        self.ids = (uid, gid)

    def __enter__(self):
        os.setegid(self.ids[1])
        os.seteuid(self.ids[0])

    def __exit__(self, *exc):
        os.seteuid(0)
        os.setegid(0)


def mode_owner(path):
    st = os.stat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


SMALL = parse_size_spec("small", {"memory": "1g", "sm": 25})


def test_files_and_owners(world):
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, world.root, gpus=GPUS)
    assert path == world.root / "alice.slice"
    assert mode_owner(world.root) == (0o755, 0, 0)
    assert mode_owner(world.root / "alice.limits") == (0o644, 0, 0)
    assert mode_owner(path) == (0o600, NOBODY, NOBODY)
    assert mode_owner(world.root / "alice.slice.kernels") == (0o700, NOBODY, NOBODY)


def test_the_users_processes_are_held_to_the_hubs_limits(world):
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, world.root, gpus=GPUS)
    out, err = cudrive(world, path, "init", "ctx", "0", "meminfo", "alloc", "1g", "alloc", "1",
                       as_nobody=True)
    ops = {o["op"]: o for o in out}
    assert ops["meminfo"]["total"] == GiB, (out, err)
    assert [o["rc"] for o in out if o["op"] == "alloc"] == [0, OOM], (out, err)
    assert read_snapshot(path).limits_file == str(world.root / "alice.limits")


def test_the_user_cannot_raise_their_limits(world):
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, world.root, gpus=GPUS)
    with effective(NOBODY, NOBODY):
        assert not limits_writable(path)
        with pytest.raises(PermissionError):
            set_memory_limit(path, None, 64 * GiB)
        assert read_snapshot(path).fallback_limit.memory_limit == GiB  # readable, unchanged


def test_only_root_writes_limits_so_every_change_is_audited(world):
    # The admin group reads usage and the audit log; its changes go through the
    # root admin service (tests/hub/test_admin_audit.py), never straight into
    # the limits file, where they would leave no line in the log.
    staff = 50
    path = prepare_user_slice("alice", SMALL, NOBODY, NOBODY, world.root, admin_group="staff", gpus=GPUS)
    assert mode_owner(world.root / "alice.limits") == (0o644, 0, staff)
    assert mode_owner(path) == (0o640, NOBODY, staff)  # admins see the usage
    assert mode_owner(world.root / "audit.log") == (0o640, 0, staff)  # admins read it, root writes it
    with effective(NOBODY, staff):
        assert not limits_writable(path)
        with pytest.raises(OSError):
            set_memory_limit(path, None, 2 * GiB)
    assert read_snapshot(path).fallback_limit.memory_limit == GiB


def test_per_gpu_limits_name_gpus_before_any_process_met_them(world):
    size = parse_size_spec("mixed", {"memory": "1g", "per_gpu": {1: {"memory": "512m"}}})
    path = prepare_user_slice("bob", size, 0, 0, world.root, gpus=GPUS)
    snap = read_snapshot(path)
    assert [(d.uuid, d.limit.memory_limit) for d in snap.devices] == [(SIM_UUIDS[1], 512 * MiB)]
    out, err = cudrive(world, path, "init", "ctx", "1", "meminfo", "ctx", "0", "meminfo")
    assert [o["total"] for o in out if o["op"] == "meminfo"] == [512 * MiB, GiB], (out, err)


def test_preparing_again_changes_limits_and_keeps_usage(world):
    path = prepare_user_slice("alice", SMALL, 0, 0, world.root, gpus=GPUS)
    cudrive(world, path, "init", "ctx", "0", "alloc", "256m", "hold")  # exits: slot freed
    larger = parse_size_spec("large", {"memory": "2g", "sm": 50, "mode": "elastic"})
    assert prepare_user_slice("alice", larger, 0, 0, world.root, gpus=GPUS) == path
    snap = read_snapshot(path)
    fallback = snap.fallback_limit
    assert (fallback.memory_limit, fallback.sm_share, fallback.mode) == (2 * GiB, 50, "elastic")
    assert snap.devices[0].memory_peak == 256 * MiB  # the same usage file


def test_pre_spawn_hook_sets_the_servers_environment(world):
    from traitlets.config import Config

    from hami_jupyter.hub import SlicePolicy

    c = Config()
    c.SlicePolicy.sizes = {"small": {"memory": "1g", "sm": 25}}
    c.SlicePolicy.default = "small"
    c.SlicePolicy.slice_root = str(world.root)
    spawner = SimpleNamespace(user=SimpleNamespace(name="no-such-unix-user", groups=[]),
                              user_options={}, environment={"LD_PRELOAD": "/opt/other.so"},
                              args=["--HamiParking.enabled=True"],
                              log=SimpleNamespace(info=lambda *a: None))
    hook = pre_spawn_hook(SlicePolicy(config=c))
    hook(spawner)
    env = spawner.environment
    assert env["HAMI_SLICE"] == env["HAMI_HUB_SLICE"] == str(world.root / "no-such-unix-user.slice")
    # No limit figures, which an administrator's live change would leave wrong:
    # the limits file holds them (issue 27, item 4).
    assert not {"HAMI_MEMORY_LIMIT", "HAMI_SM_LIMIT", "HAMI_SM_MODE"} & set(env), env
    # The library and the extension in force whatever the user's config says
    # (issue 27, item 3), once however often the server starts.
    hook(spawner)
    assert env["LD_PRELOAD"] == f"/opt/other.so:{native.library_path()}"
    assert spawner.args == ["--HamiParking.enabled=True", EXTENSION_ARG]
    # No Unix user of that name: the server runs as the hub's user, who owns the usage file.
    assert mode_owner(env["HAMI_SLICE"])[1] == os.getuid()


def test_the_servers_kernels_ask_the_broker_of_the_hubs_slice_root(world):
    """A hub whose slice root is not the default one: its kernels must ask
    the broker that runs on that root (``hami-jupyter broker --root``), not
    the library's default socket, where none listens (issue 28)."""
    from traitlets.config import Config

    from hami_jupyter.hub import SlicePolicy

    def started(root, environment=None):
        c = Config()
        c.SlicePolicy.sizes = {"shared": {"memory": "8g", "guarantee": "2g"}}
        c.SlicePolicy.default = "shared"
        c.SlicePolicy.slice_root = str(root)
        warned = []
        spawner = SimpleNamespace(user=SimpleNamespace(name="no-such-unix-user", groups=[]),
                                  user_options={}, environment=dict(environment or {}), args=[],
                                  log=SimpleNamespace(info=lambda *a: None,
                                                      warning=lambda *a: warned.append(a[0] % a[1:])))
        pre_spawn_hook(SlicePolicy(config=c))(spawner)
        return spawner.environment, warned

    env, warned = started(world.root)
    assert env["HAMI_BROKER_SOCKET"] == str(world.root / "broker.sock") and not warned
    # An administrator's own socket is kept.
    env, _ = started(world.root, {"HAMI_BROKER_SOCKET": "/srv/broker/room.sock"})
    assert env["HAMI_BROKER_SOCKET"] == "/srv/broker/room.sock"
    # A root too deep for a socket's path: the library's default, and a warning
    # (a setting the library refuses would disable CUDA in every kernel).
    deep = world.base / ("d" * 100)
    env, warned = started(deep)
    assert "HAMI_BROKER_SOCKET" not in env and env["HAMI_SLICE"].startswith(str(deep))
    assert len(warned) == 1 and "longer than a Unix socket path may be" in warned[0], warned
