"""End to end through a real JupyterHub: each user's kernel holds that user's limits.

alice spawns with her default size ("small": 1 GiB, SM 25 %, hard), bob
asks for "large" (2 GiB, SM 50 %, elastic) in his spawn options, as the
spawn form would. Both servers run at once; in each a ``hami-python3``
kernel, started through the server's REST API behind the proxy, must report
its own user's slice in ``%hami status --json`` and see its own cap as the
GPU's total memory through the driver (the preload library enforcing it).
A spawn asking for a size the policy does not have must start no server.
"""

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import TAG_ENV, Hub, _require_jupyterhub
from leftovers import marker_env
from unix_users import RUNUSER, UnixUsers, require_root_users, shared_tmpdir, user_python

from hami_jupyter import native
from hami_jupyter.slice.file import read_snapshot

GIB = 1 << 30

EXPECTED = {
    # user: (spawn options, memory limit, SM share, mode)
    "alice": ({}, 1 * GIB, 25, "hard"),
    "bob": ({"slice_size": "large"}, 2 * GIB, 50, "elastic"),
}

MEM_CHECK = (
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "print(d.mem_get_info()[1])\n"
)

pytestmark = pytest.mark.slow


def _status_json(result, where):
    assert result.error is None, f"{where}: %hami status --json failed: {result.error}"
    texts = result.text()
    assert len(texts) == 1, f"{where}: expected one text/plain output, got {result.outputs}"
    return json.loads(texts[0])


def test_each_user_kernel_holds_its_own_slice(hub):
    started = time.monotonic()
    for user, (options, *_) in EXPECTED.items():
        hub.spawn(user, options)
    for user in EXPECTED:
        hub.wait_ready(user)

    # The hub made each slice before the server started.
    for user, (_, memory, sm, mode) in EXPECTED.items():
        slice_file = hub.slice_root / f"{user}.slice"
        limits_file = hub.slice_root / f"{user}.limits"
        assert slice_file.is_file() and limits_file.is_file(), sorted(os.listdir(hub.slice_root))
        assert stat.S_IMODE(slice_file.stat().st_mode) == 0o600
        # The hub's, readable by all (no admin group): here the hub and the
        # servers are the same Unix user, SimpleLocalProcessSpawner's way.
        assert limits_file.stat().st_uid == os.getuid()
        assert stat.S_IMODE(limits_file.stat().st_mode) == 0o644
        snap = read_snapshot(slice_file)
        assert snap.limits_file == str(limits_file)
        fallback = snap.fallback_limit
        assert (fallback.memory_limit, fallback.sm_share) == (memory, sm)
        assert fallback.mode == mode

    kernels = {user: hub.start_kernel(user) for user in EXPECTED}
    assert kernels["alice"] != kernels["bob"]

    for user, (_, memory, sm, mode) in EXPECTED.items():
        kernel_id = kernels[user]
        where = f"{user}'s kernel {kernel_id}"

        # The driver, under the preload library, shows the slice's cap as the total.
        mem = hub.execute(user, kernel_id, MEM_CHECK)
        assert mem.error is None, f"{where}: {mem.error}\n{hub.log_tail()}"
        assert mem.stdout.split() == [str(memory)], f"{where}: stdout {mem.stdout!r}"

        status = _status_json(hub.execute(user, kernel_id, "%hami status --json"), where)
        assert status["slice"] == user, status
        assert status["path"] == str(hub.slice_root / f"{user}.slice"), status
        assert status["default_limit"] == {"memory_limit": memory, "sm_share": sm, "mode": mode, "max_decoders": 0, "memory_guarantee": 0}
        assert [g["memory_limit"] for g in status["gpus"]] == [memory], status["gpus"]
        listed = {k["kernel_id"]: k for k in status["kernels"]}
        assert kernel_id in listed, status["kernels"]
        assert listed[kernel_id]["processes"], f"{where}: no process of it in its slice: {status}"
        other = kernels["bob" if user == "alice" else "alice"]
        assert other not in listed, f"{where}: the other user's kernel is in this slice: {status}"

    assert time.monotonic() - started < 90


def test_a_size_nobody_offers_starts_no_server(hub):
    # "huge" is no size of the policy: the hub must refuse the spawn rather
    # than start a server without limits.
    status, reply = hub.spawn("mallory", {"slice_size": "huge"}, expect=(400,))
    assert "no slice size named 'huge'" in str(reply)
    assert hub.wait_spawn("mallory") is None, "a server started with a size nobody offers"
    assert not (hub.slice_root / "mallory.slice").exists()


# ---- real Unix users, the single-host example, a root hub ---------------------
#
# What docs/single-host.md sets up: a root JupyterHub with LocalProcessSpawner
# and examples/jupyterhub_config.py as it stands (its Spawner.cmd from
# sys.prefix, the hami-admin group), servers spawned as the Unix users alice
# and bob on the simulated GPU, whose one state file all users share.

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jupyterhub_config.py"


class RealUsersHub(Hub):
    """The example config, loaded unchanged, then pointed at loopback ports,
    a private database, the dummy authenticator and the simulated GPU (the
    guide's: *sim_devices* of *sim_memory* each)."""

    sim_devices, sim_memory = "2", "80g"

    def __init__(self, tmp, shared, python):
        super().__init__(tmp)
        self.python = python
        self.slice_root = shared / "slices"
        self.sim_state = shared / "sim" / "state"

    def make_sim_state(self):
        # One state for every user's processes: made once, by root, 0666
        # (the simulated GPU creates it with 0666 less the umask).
        self.sim_state.parent.mkdir(mode=0o755)
        env = native.sim_env(self.sim_state, base={"PATH": "/usr/bin:/bin"},
                             HAMI_SIM_DEVICES=self.sim_devices, HAMI_SIM_MEMORY=self.sim_memory,
                             HAMI_SIM_CONTEXT_BYTES="64m")
        old = os.umask(0)
        try:
            subprocess.run([str(native.simctl_path()), "--state", str(self.sim_state), "status"],
                           env=env, check=True, capture_output=True)
        finally:
            os.umask(old)

    def write_config(self, chp):
        self.make_sim_state()
        sim = native.sim_env(self.sim_state, base={}, HAMI_SIM_DEVICES=self.sim_devices,
                             HAMI_SIM_MEMORY=self.sim_memory, HAMI_SIM_CONTEXT_BYTES="64m")
        extra = {**sim, **marker_env(), TAG_ENV: self.tag, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        config = textwrap.dedent(f"""\
            # Written by tests/hub/test_jupyterhub_e2e.py: the example, then test plumbing.
            c = get_config()  # noqa: F821
            c.SlicePolicy.slice_root = {str(self.slice_root)!r}  # before the policy is built
            # The example runs in this file's namespace, on this same config
            # (load_subconfig would give it a config of its own, without slice_root).
            with open({str(EXAMPLE)!r}) as example:
                exec(compile(example.read(), {str(EXAMPLE)!r}, "exec"), {{"get_config": get_config}})  # noqa: F821
            """) + self.plumbing(chp) + textwrap.dedent(f"""\
            c.Spawner.environment.update({extra!r})
            """)
        path = self.tmp / "jupyterhub_config.py"
        path.write_text(config)
        return path


# alice's own Jupyter config turns hami-jupyter's server extension off (issue
# 27, item 3): her kernels must stay in her slice all the same.
EXTENSION_OFF = {"ServerApp": {"jpserver_extensions": {"hami_jupyter": False}}}


def disable_extension_in_config(user):
    """Write *user*'s ~/.jupyter/jupyter_server_config.json, hers, turning the
    extension off; returns what puts back the file that was there before."""
    pw = pwd.getpwnam(user)
    folder = Path(pw.pw_dir) / ".jupyter"
    path = folder / "jupyter_server_config.json"
    made_folder = not folder.exists()
    before = path.read_bytes() if path.exists() else None
    folder.mkdir(exist_ok=True)
    path.write_text(json.dumps(EXTENSION_OFF))
    for p in (folder, path):
        os.chown(p, pw.pw_uid, pw.pw_gid)

    def restore():
        if before is not None:
            path.write_bytes(before)
        elif made_folder:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    return restore


@pytest.fixture(scope="module")
def real_hub(tmp_path_factory):
    _require_jupyterhub()
    require_root_users()
    users = UnixUsers().create()
    restore_config = disable_extension_in_config("alice")
    shared = shared_tmpdir("hami-hub-e2e-")
    system_root = Path("/run/hami-jupyter")  # the example's default: the test must not touch it
    had_system_root = system_root.exists()
    h = None
    try:
        python, why = user_python(shared)
        if python is None:
            pytest.skip(why)
        h = RealUsersHub(tmp_path_factory.mktemp("realhub"), shared, python)
        h.start()
        yield h
    finally:
        left = h.stop() if h is not None else []
        restore_config()
        users.remove()
        subprocess.run(["rm", "-rf", str(shared)])
        touched = not had_system_root and system_root.exists()
        if touched:
            subprocess.run(["rm", "-rf", str(system_root)])
    assert not touched, f"the hub made slices in {system_root}, not in the test's slice root"
    if left:
        pytest.fail("processes of the hub outlived it and were killed: "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left), pytrace=False)


REAL = {
    # user: memory cap in the example (alice has her own size; bob gets "small")
    "alice": (40 * GIB, 60, "hard"),
    "bob": (8 * GIB, 20, "elastic"),
}


def test_real_users_kernels_land_in_the_hubs_slices(real_hub):
    hub = real_hub
    assert stat.S_IMODE(hub.sim_state.stat().st_mode) == 0o666
    for user in REAL:
        hub.spawn(user)
    for user in REAL:
        hub.wait_ready(user)
    admin_gid = grp.getgrnam("hami-admin").gr_gid
    for user, (memory, sm, mode) in REAL.items():
        pw = pwd.getpwnam(user)
        slice_file = hub.slice_root / f"{user}.slice"
        limits_file = hub.slice_root / f"{user}.limits"
        st = slice_file.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (pw.pw_uid, admin_gid, 0o640)
        st = limits_file.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, admin_gid, 0o644)

        kernel_id = hub.start_kernel(user)
        where = f"{user}'s kernel {kernel_id}"
        who = hub.execute(user, kernel_id, "import os; print(os.getuid())")
        assert who.error is None and who.stdout.split() == [str(pw.pw_uid)], f"{where}: {who}"
        mem = hub.execute(user, kernel_id, MEM_CHECK)
        assert mem.error is None, f"{where}: {mem.error}\n{hub.log_tail()}"
        assert mem.stdout.split() == [str(memory)], f"{where}: stdout {mem.stdout!r}"
        status = _status_json(hub.execute(user, kernel_id, "%hami status --json"), where)
        assert status["path"] == str(slice_file), status
        assert status["default_limit"] == {"memory_limit": memory, "sm_share": sm, "mode": mode, "max_decoders": 0, "memory_guarantee": 0}
        listed = {k["kernel_id"]: k for k in status["kernels"]}
        assert listed.get(kernel_id, {}).get("processes"), f"{where}: not in its slice: {status}"
    # Both users' processes met on the one simulated GPU.
    assert json.loads(subprocess.run(
        [str(native.simctl_path()), "--state", str(hub.sim_state), "status"],
        capture_output=True, text=True, check=True).stdout)


# Run by the user in their own kernel: the escape issue 12 found, then two
# kernelspecs written by hand, as any user may.
ESCAPE = (
    "import subprocess, sys\n"
    "r = subprocess.run([sys.executable, '-m', 'hami_jupyter', 'kernelspec', 'install', '--user',\n"
    "                    '--name', 'big', '--memory', '64g', '--slice', '/tmp/mine/big.slice'],\n"
    "                   capture_output=True, text=True)\n"
    "print(r.returncode)\n"
    "print(r.stderr.replace(chr(10), ' '))\n"
)
# What a kernel's own process says of the preload library and its slice.
ENV_CHECK = (
    "import os\n"
    "print(os.environ.get('LD_PRELOAD', ''))\n"
    "print(os.environ.get('HAMI_SLICE', ''))\n"
    "print(any(l.rstrip().endswith('/libvgpu.so') for l in open('/proc/self/maps')))\n"
)
HAND_MADE = (
    "import json, pathlib, sys\n"
    "base = pathlib.Path.home() / '.local/share/jupyter/kernels'\n"
    "for name, env, prov in [('plain64', {'CUDA_DEVICE_MEMORY_LIMIT': '64g'}, 'local-provisioner'),\n"
    "                        ('elsewhere', {'HAMI_SLICE': '/tmp/mine/big.slice'}, None)]:\n"
    "    d = base / name\n"
    "    d.mkdir(parents=True, exist_ok=True)\n"
    "    spec = {'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],\n"
    "            'display_name': name, 'language': 'python', 'env': env}\n"
    "    if prov:\n"
    "        spec['metadata'] = {'kernel_provisioner': {'provisioner_name': prov}}\n"
    "    (d / 'kernel.json').write_text(json.dumps(spec))\n"
)


def test_no_kernelspec_leaves_the_hubs_slice(real_hub):
    """Issue 12, items 1 and 2, as alice would try them on her own server."""
    hub, user = real_hub, "alice"
    memory = REAL[user][0]
    if user not in hub.users:
        hub.spawn(user)
    hub.wait_ready(user)
    kernel_id = hub.start_kernel(user)
    out = hub.execute(user, kernel_id, ESCAPE)
    assert out.error is None, out.error
    rc, _, why = out.stdout.partition("\n")
    assert rc.strip() != "0" and "hub" in why, f"kernelspec install --slice was not refused: {out.stdout}"
    assert hub.execute(user, kernel_id, HAND_MADE).error is None
    for name in ("python3", "plain64"):  # no provisioner named, and local-provisioner with 64g in env
        kid = hub.start_kernel(user, name)
        env = hub.execute(user, kid, ENV_CHECK)
        assert env.error is None, f"kernelspec {name}: {env.error}"
        preload, slice_var, mapped = env.stdout.splitlines()
        assert "libvgpu.so" in preload and mapped == "True", f"kernelspec {name}: no preload: {env.stdout}"
        assert slice_var == str(hub.slice_root / f"{user}.slice"), f"kernelspec {name}: {env.stdout}"
        mem = hub.execute(user, kid, MEM_CHECK)
        assert mem.error is None and mem.stdout.split() == [str(memory)], f"kernelspec {name}: {mem}"
        status = _status_json(hub.execute(user, kid, "%load_ext hami_jupyter.magic\n%hami status --json"), name)
        assert status["path"] == str(hub.slice_root / f"{user}.slice"), status
    status, reply = hub.request("POST", f"{hub.url}/user/{user}/api/kernels", {"name": "elsewhere"})
    assert status >= 400, f"a kernelspec naming another slice started: {status} {reply}"


# ---- issue 27: enforcement never destroys a user's work ----------------------------
#
# On the root hub above, with a real guard and the root admin service beside it
# (the example starts the admin service as a hub service; this hub's services
# are the test's, so the test starts it), alice's config turning the extension
# off (see real_hub):
# 1. an administrator shrinks alice's slice below what her kernel holds: the
#    kernel lives, its next cell runs, every figure shows the new cap;
# 2. a process of hers without the preload library passes the cap: the guard
#    parks it (its data kept), carol (hami-admin, not root) raises the cap and
#    resumes it through the admin service, and its bytes hash the same;
# 3. no process is ended more than once; the kernel is never acted on.

HOLD = (
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "held = d.DeviceBuffer(2 << 30)\n"
    "print(held.nbytes)\n"
)
FIGURES = (
    "import json, os\n"
    "print(json.dumps({'ppid': os.getppid(), 'env': {k: v for k, v in os.environ.items()\n"
    "                                                 if k.endswith(('MEMORY_LIMIT', 'SM_LIMIT', 'SM_MODE'))}}))\n"
)
# A process started from the kernel without the preload library (a bypass),
# holding 1.5 GiB and 4 MiB of random bytes it can hash again on request.
BYPASS = (
    "import os, subprocess, sys\n"
    "code = '''\n"
    "import hashlib, os, sys\n"
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "big = d.DeviceBuffer(1536 << 20)\n"
    "data = os.urandom(4 << 20)\n"
    "big.write(data)\n"
    "print(os.getpid(), hashlib.sha256(data).hexdigest(), flush=True)\n"
    "for line in sys.stdin:\n"
    "    print(hashlib.sha256(big.read(len(data))).hexdigest(), flush=True)\n"
    "'''\n"
    "env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}\n"
    "bypass = subprocess.Popen([sys.executable, '-c', code], env=env, text=True,\n"
    "                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "print(bypass.stdout.readline().strip())\n"
)
BYPASS_HASH = (
    "bypass.stdin.write('hash\\n'); bypass.stdin.flush()\n"
    "print(bypass.stdout.readline().strip())\n"
)


class RootHelpers:
    """The guard and the admin service, as root, on the simulated GPU; ended at teardown."""

    def __init__(self, hub, tmp):
        self.hub, self.procs = hub, []
        self.env = native.sim_env(hub.sim_state, base={"PATH": "/usr/bin:/bin"},
                                  PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        self.tmp = tmp

    def start(self, name, *args):
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen([self.hub.python, "-m", "hami_jupyter", *args], env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, log))
        return proc

    def log(self, name):
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self):
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()


def wait_report(root, guard, predicate, what, timeout=20):
    from hami_jupyter.slice.guard_report import read_report

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert guard.poll() is None, f"the guard exited while waiting for {what}"
        try:
            last = read_report(root)
        except Exception:  # being replaced right now
            last = None
        if last and last.get("guard_pid") == guard.pid and predicate(last):
            return last
        time.sleep(0.1)
    pytest.fail(f"{what} not in the guard's report within {timeout} s: {json.dumps(last)[:3000]}")


def alice_gpu(report):
    gpus = ((report.get("slices") or {}).get("alice") or {}).get("gpus") or {}
    return next(iter(gpus.values()), {})


def metric(text, name, slice_name):
    for line in text.splitlines():
        if line.startswith(name + "{") and f'slice="{slice_name}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_enforcement_keeps_work_under_the_root_hub(real_hub, tmp_path):
    from hami_jupyter import audit

    hub, user = real_hub, "alice"
    root = hub.slice_root
    if user not in hub.users:
        hub.spawn(user)
    hub.wait_ready(user)
    helpers = RootHelpers(hub, tmp_path)
    try:
        guard = helpers.start("guard", "guard", "--root", str(root))
        helpers.start("admin-service", "admin-service", "--root", str(root),
                      "--admin-group", "hami-admin")
        kernel_id = hub.start_kernel(user)
        held = hub.execute(user, kernel_id, HOLD)
        assert held.error is None and held.stdout.split() == [str(2 * GIB)], held
        wait_report(root, guard, lambda r: (alice_gpu(r).get("real_bytes") or 0) >= 2 * GIB,
                    "alice's kernel holding 2 GiB")

        # 1. An administrator shrinks her slice below what the kernel holds.
        shrink = subprocess.run([hub.python, "-m", "hami_jupyter", "slice", "set", user,
                                 "--memory", "1g", "--root", str(root)], env=helpers.env,
                                capture_output=True, text=True, timeout=60)
        assert shrink.returncode == 0, shrink.stdout + shrink.stderr
        report = wait_report(root, guard, lambda r: alice_gpu(r).get("state") == "held",
                             "alice's slice held over its lowered cap")
        again = hub.execute(user, kernel_id, "print(held.nbytes, 6 * 7)")
        assert again.error is None and again.stdout.split() == [str(2 * GIB), "42"], again

        # Every figure shows the cap in force (issue 27, item 4).
        status = _status_json(hub.execute(user, kernel_id, "%hami status --json"), "alice")
        gpu = next(g for g in status["gpus"] if g["index"] == 0)  # where the kernel holds 2 GiB
        assert gpu["over_cap_since"] is not None, gpu
        assert {g["memory_limit"] for g in status["gpus"]} == {GIB}, status["gpus"]
        _, body = hub.request("GET", f"{hub.url}/user/{user}/hami/v1/kernels/{kernel_id}")
        assert isinstance(body, dict), f"no hami/v1 REST API on alice's server: {body!r:.300}"
        assert body["memory_limit"] == GIB and {g["memory_limit"] for g in body["gpus"]} == {GIB}, body
        _, slices = hub.request("GET", f"{hub.url}/user/{user}/hami/v1/slices")
        mine = next(s for s in slices["slices"] if s["slice"] == user)
        assert {g["memory_limit"] for g in mine["gpus"]} == {GIB}, mine
        _, metrics = hub.request("GET", f"{hub.url}/user/{user}/metrics")
        assert metric(metrics, "hami_slice_memory_limit_bytes", user) == GIB, metrics[:3000]
        figures = json.loads(hub.execute(user, kernel_id, FIGURES).stdout)
        assert figures["env"] == {}, f"limit figures in the kernel's environment: {figures}"
        server_env = Path(f"/proc/{figures['ppid']}/environ").read_bytes().split(b"\0")
        assert not [v for v in server_env if v.startswith((b"HAMI_MEMORY_LIMIT=", b"HAMI_SM_LIMIT="))], \
            "limit figures in the server's environment"

        # 2. A bypass passes the cap: parked, not ended; its data kept.
        started = hub.execute(user, kernel_id, BYPASS)
        assert started.error is None, started
        pid_text, digest = started.stdout.split()
        pid = int(pid_text)
        report = wait_report(root, guard, lambda r: any(p["pid"] == pid for p in r.get("parked") or []),
                             "the bypass parked")
        assert os.path.exists(f"/proc/{pid}"), "the parked bypass is gone"
        # carol (hami-admin, not root) raises the cap and resumes it, through the admin service.
        raise_cap = subprocess.run([hub.python, "-m", "hami_jupyter", "slice", "set", user,
                                    "--memory", "40g", "--root", str(root)], env=helpers.env,
                                   capture_output=True, text=True, timeout=60)
        assert raise_cap.returncode == 0, raise_cap.stdout + raise_cap.stderr
        resume = subprocess.run([RUNUSER, "-u", "carol", "--", hub.python, "-m", "hami_jupyter", "guard",
                                 "--root", str(root), "--resume", str(pid)],
                                env={"PATH": "/usr/bin:/bin", "HOME": "/home/carol"}, cwd="/",
                                capture_output=True, text=True, timeout=120)
        assert resume.returncode == 0, f"{resume.stdout}{resume.stderr}\n{helpers.log('admin-service')}"
        assert "runs again" in resume.stdout
        back = hub.execute(user, kernel_id, BYPASS_HASH)
        assert back.error is None and back.stdout.split() == [digest], "the bypass's data changed"

        # 3. Nobody ended twice, the kernel never acted on; who did what is in the log.
        report = wait_report(root, guard, lambda r: not any(p["pid"] == pid for p in r.get("parked") or []),
                             "the resumed bypass off the parked list")
        acted = [a.get("pid") for a in report.get("actions") or [] if a.get("action") in ("kill", "park")]
        assert len(acted) == len(set(acted)) and acted == [pid], report.get("actions")
        records = audit.read_records(audit.default_path(root))
        guard_records = [(r["action"], r.get("pid"), r.get("who")) for r in records
                         if r["action"].startswith("guard-")]
        assert guard_records == [("guard-park", pid, "hami-jupyter guard"),
                                 ("guard-resume", pid, "carol")], guard_records
        assert hub.execute(user, kernel_id, "print(held.nbytes)").stdout.split() == [str(2 * GIB)]
        # Done: the bypass ends (its stdin closes) and the kernel goes, so the hub stops at once.
        hub.execute(user, kernel_id, "bypass.stdin.close(); print(bypass.wait(30))")
        hub.server_api(user, "DELETE", f"kernels/{kernel_id}", expect={204})
    finally:
        helpers.stop()


# ---- issue 33: a hub user cannot freeze another user's kernel through the root agent ------
#
# On the root hub above, with the agent's memory broker as root beside it: bob's
# kernel holds 3 GiB; alice, in her own kernel, writes into her own slice file
# a slot naming bob's kernel (PID namespace 0, idle for an hour, a heartbeat,
# its lock held, her slice's counter raised above its guarantee), and asks the
# agent's socket for the room bob's kernel would make. bob's kernel must not be
# parked, frozen or slowed: his next cell runs at once.

FORGE = """
import ctypes, fcntl, os, socket, threading, time
from hami_jupyter import driver_memory as d
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import (DEVICES_OFFSET, HAMI_SLOT_LIVE, HamiSliceDevice, HamiSlot,
                                       slot_offset)
from hami_jupyter.slice.locks import F_OFD_SETLK, flock_bytes
d.init()
path = os.environ["HAMI_SLICE"]
snap = read_snapshot(path)
[dev] = [x.index for x in snap.devices if x.uuid == {uuid!r}]
index = max(set(range(256)) - {{s.index for s in snap.slots}})
forged = HamiSlot()
forged.state, forged.pid, forged.pid_ns = HAMI_SLOT_LIVE, {victim}, 0
forged.memory_used[dev] = 3 << 30
now = time.time_ns()
forged.started_unix_ns, forged.gpu_active_unix_ns, forged.active_unix_ns = now - 7200 * 10**9, now - 3600 * 10**9, now
forged.kernel_id = b"k-forged"
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, bytes(forged), slot_offset(index))
fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, slot_offset(index)))
at = DEVICES_OFFSET + dev * ctypes.sizeof(HamiSliceDevice) + HamiSliceDevice.memory_used.offset
os.pwrite(fd, (10 << 30).to_bytes(8, "little"), at)

def beat():
    while True:
        os.pwrite(fd, time.time_ns().to_bytes(8, "little"), slot_offset(index) + HamiSlot.active_unix_ns.offset)
        time.sleep(0.5)

threading.Thread(target=beat, daemon=True).start()
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(os.environ["HAMI_BROKER_SOCKET"])
conn.sendall(f"ROOM {uuid} {ask} {{time.time_ns()}}\\n".encode())
lines = conn.makefile("rb").read().decode().splitlines()
print(lines[-1])
"""


def test_a_slot_alice_forges_freezes_no_kernel_of_bobs(real_hub, tmp_path):
    hub = real_hub
    root = hub.slice_root
    for user in ("alice", "bob"):
        if user not in hub.users:
            hub.spawn(user)
    for user in ("alice", "bob"):
        hub.wait_ready(user)
    helpers = RootHelpers(hub, tmp_path)
    filler = None
    try:
        # Lent memory in alice's slice (an administrator's guarantee below her cap);
        # bob's slice keeps all it holds (no guarantee: the cap is his guarantee).
        lend = subprocess.run([hub.python, "-m", "hami_jupyter", "slice", "set", "alice", "--guarantee", "1g",
                               "--root", str(root)], env=helpers.env, capture_output=True, text=True, timeout=60)
        assert lend.returncode == 0, lend.stdout + lend.stderr
        agent = helpers.start("agent", "broker", "--root", str(root))
        bob_kernel = hub.start_kernel("bob")
        held = hub.execute("bob", bob_kernel, HOLD.replace("2 << 30", "3 << 30") + "import os; print(os.getpid())")
        assert held.error is None, held
        bob_bytes, bob_pid = map(int, held.stdout.split())
        uuid = next(d.uuid for d in read_snapshot(root / "bob.slice").devices if d.memory_used)
        # The GPU full but for what bob's kernel would make: root's process holds 40 GiB.
        filler = subprocess.Popen([hub.python, "-c", "from hami_jupyter import driver_memory as d; d.init(); "
                                   "b = d.DeviceBuffer(40 << 30); print('held', flush=True); input()"],
                                  env=helpers.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert filler.stdout.readline().strip() == "held"
        status = json.loads(subprocess.run([str(native.simctl_path()), "--state", str(hub.sim_state), "status"],
                                           capture_output=True, text=True, check=True).stdout)
        gpu0 = next(dv for dv in status["devices"] if dv["uuid"] == uuid)
        ask = gpu0["total"] - gpu0["used"] + 2 * GIB  # bob's 3 GiB would cover it
        assert ask <= 40 * GIB, ask  # within alice's cap: a request the agent may serve
        time.sleep(1)  # the agent has its socket
        assert agent.poll() is None, helpers.log("agent")
        alice_kernel = hub.start_kernel("alice")
        out = hub.execute("alice", alice_kernel, FORGE.format(uuid=uuid, victim=bob_pid, ask=ask), timeout=90)
        assert out.error is None, out
        assert out.stdout.strip().startswith("NO "), out.stdout
        # bob's kernel: on the GPU, its next cell at once, nothing parked.
        state = subprocess.run([str(native.park_tool_path()), "state", str(bob_pid)], env=helpers.env,
                               capture_output=True, text=True, timeout=60)
        assert state.stdout.strip() == "ok running", state.stdout + state.stderr
        again = hub.execute("bob", bob_kernel, "print(held.nbytes)", timeout=20)
        assert again.error is None and again.stdout.split() == [str(bob_bytes)], again
        from hami_jupyter import audit

        assert not [r for r in audit.read_records(audit.default_path(root)) if r["action"] == "broker-park"]
        hub.server_api("alice", "DELETE", f"kernels/{alice_kernel}", expect={204})
        hub.server_api("bob", "DELETE", f"kernels/{bob_kernel}", expect={204})
    finally:
        if filler is not None:
            filler.kill()
            filler.wait()
        helpers.stop()
