"""A hostile hub user against the root agent, on a real root JupyterHub (issue 39).

The guide's set-up (docs/single-host.md: the example config, real Unix users
alice, bob and carol, the agent as root) on a simulated GPU shrunk to one
device of 16 GiB, as the issue's run had it, so that the memory broker has to
act. An administrator (root) gives alice a 4 GiB cap and lets bob and carol
lend (8 GiB caps, 1 GiB guaranteed); bob's kernel holds 5 GiB and sits idle.
alice then tries, from her own kernel, what the issue's rows say she did:

- row 1: makes her slice file writable by everyone and starts a 5 GiB
  bypass: it is parked by the guard (her cap is her limits file's), and
  carol's 6 GiB then needs no park of bob's kernel;
- row 3: ``hami-park hold`` (and ``restore``, ``state``) of bob's kernel:
  refused; bob's next cell runs at once;
- row 4: connect, send a request, close, in a loop: one audit record;
- row 5: ``HAMI_CONTEXT_OVERHEAD=1g`` in a process of hers under the library,
  and a bypass 170 MiB past her cap: parked (the tolerance is the guard's);
- row 6: zeroes her slice's counter under a kernel holding 1 GiB: it comes
  back to what the driver says;
- row 7: reads guard.json and broker.json: not hers to read; her own view
  names her processes only, and her ``%hami status`` still shows the guard's
  figures; carol (an administrator) reads them whole.

Each fails on 802aae2. Needs root (CI runs as root), like the other root hub tests.
"""

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import _require_jupyterhub
from test_jupyterhub_e2e import RealUsersHub, RootHelpers, _status_json, wait_report
from unix_users import USERS, UnixUsers, require_root_users, shared_tmpdir, user_python

from hami_jupyter import audit, native

GIB = 1 << 30
pytestmark = pytest.mark.slow


class HostileHub(RealUsersHub):
    """The guide's hub on one simulated GPU of 16 GiB."""

    sim_devices, sim_memory = "1", "16g"


def _root_run(hub, env, *args):
    done = subprocess.run([hub.python, "-m", "hami_jupyter", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# Run in a kernel: hold SIZE on the GPU under the library, idle; its pid.
HOLD = (
    "import os\n"
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "held = d.DeviceBuffer({size})\n"
    "print(os.getpid(), held.nbytes)\n"
)
# Run in a kernel: a process of the user's, ENV changed, holding SIZE until its stdin closes; its pid.
HELPER = (
    "import os, subprocess, sys\n"
    "code = 'from hami_jupyter import driver_memory as d; import sys; d.init(); b = d.DeviceBuffer({size}); "
    "print(\"held\", flush=True); sys.stdin.read()'\n"
    "env = dict(os.environ)\n"
    "{env}\n"
    "{name} = subprocess.Popen([sys.executable, '-c', code], env=env, text=True, stdin=subprocess.PIPE,\n"
    "                          stdout=subprocess.PIPE)\n"
    "assert {name}.stdout.readline().strip() == 'held'\n"
    "print({name}.pid)\n"
)
WITHOUT_LIBRARY = "env.pop('LD_PRELOAD', None)"


def helper(name, size, env=WITHOUT_LIBRARY):
    return HELPER.format(name=name, size=size, env=env)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """The hub, every user's server, the agent as root, the sizes above, bob's idle 5 GiB kernel."""
    _require_jupyterhub()
    require_root_users()
    users = UnixUsers().create()
    shared = shared_tmpdir("hami-hostile-")
    system_root = Path("/run/hami-jupyter")
    had_system_root = system_root.exists()
    hub = helpers = None
    tmp = tmp_path_factory.mktemp("hostile")
    try:
        python, why = user_python(shared)
        if python is None:
            pytest.skip(why)
        hub = HostileHub(tmp, shared, python)
        hub.start()
        for user in USERS:
            hub.spawn(user)
        for user in USERS:
            hub.wait_ready(user)
        helpers = RootHelpers(hub, tmp)
        root = hub.slice_root
        _root_run(hub, helpers.env, "slice", "set", "alice", "--memory", "4g", "--root", str(root))
        for user in ("bob", "carol"):
            _root_run(hub, helpers.env, "slice", "set", user, "--guarantee", "1g", "--root", str(root))
        agent = helpers.start("agent", "agent", "--root", str(root), "--min-idle-seconds", "1",
                              "--host-memory-reserve", "0")
        wait_report(root, agent, lambda r: True, "the agent's first report", timeout=60)
        bob = hub.start_kernel("bob")
        out = hub.execute("bob", bob, HOLD.format(size=5 * GIB))
        assert out.error is None, out
        bob_pid = int(out.stdout.split()[0])
        yield SimpleNamespace(hub=hub, helpers=helpers, agent=agent, root=root, bob=bob, bob_pid=bob_pid)
    finally:
        if helpers is not None:
            helpers.stop()
        left = hub.stop() if hub is not None else []
        users.remove()
        subprocess.run(["rm", "-rf", str(shared)])
        if not had_system_root and system_root.exists():
            subprocess.run(["rm", "-rf", str(system_root)])
    if left:
        pytest.fail("processes of the hub outlived it and were killed: "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left), pytrace=False)


def kernel(node, user):
    """A new kernel of *user*'s with CUDA started (so it holds a slot); its id."""
    kid = node.hub.start_kernel(user)
    out = node.hub.execute(user, kid, "from hami_jupyter import driver_memory as d\nd.init()\nprint('ok')")
    assert out.error is None and out.stdout.strip() == "ok", out
    return kid


def driver_state(node, pid):
    done = subprocess.run([str(native.park_tool_path()), "state", str(pid)], env=node.helpers.env,
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


def bob_runs_at_once(node):
    assert driver_state(node, node.bob_pid) == "ok running"
    again = node.hub.execute("bob", node.bob, "print(held.nbytes)", timeout=20)
    assert again.error is None and again.stdout.split() == [str(5 * GIB)], again


def records(node, action, **match):
    return [r for r in audit.read_records(audit.default_path(node.root))
            if r["action"] == action and all(r.get(k) == v for k, v in match.items())]


# ---- row 7: the reports name no one else's processes -----------------------------------------

READ_REPORTS = """
import json, os
from hami_jupyter.slice.broker_report import read_report as broker
from hami_jupyter.slice.guard_report import read_report as guard
root = os.path.dirname(os.environ["HAMI_SLICE"])
opened = []
for name in ("guard.json", "broker.json"):
    try:
        open(os.path.join(root, name)).read()
        opened.append(name)
    except PermissionError:
        pass
print(json.dumps({"opened": opened, "guard": guard(root), "broker": broker(root)}))
"""


def test_alice_reads_her_own_part_of_the_reports_and_an_administrator_all(node):
    alice = kernel(node, "alice")
    out = node.hub.execute("alice", alice, READ_REPORTS)
    assert out.error is None, out
    seen = json.loads(out.stdout)
    assert seen["opened"] == [], f"alice opened {seen['opened']}: every user's processes are in them"
    assert sorted(seen["guard"]["slices"]) == ["alice"] and not seen["guard"]["stale"]
    assert seen["broker"] is not None and not seen["broker"]["stale"]
    text = json.dumps(seen)
    assert str(node.bob_pid) not in text and node.bob not in text, "bob's kernel in alice's view"
    # Her own views keep working: the guard's figures in her %hami status.
    status = _status_json(node.hub.execute("alice", alice, "%hami status --json"), "alice")
    assert status["guard"]["running"] and status["gpus"][0]["memory_real"] is not None, status
    # carol (hami-admin) reads them whole.
    carol = kernel(node, "carol")
    whole = json.loads(node.hub.execute("carol", carol, READ_REPORTS).stdout)
    assert whole["opened"] == ["guard.json", "broker.json"]
    assert {"alice", "bob", "carol"} <= set(whole["guard"]["slices"])
    for user, kid in (("alice", alice), ("carol", carol)):
        node.hub.server_api(user, "DELETE", f"kernels/{kid}", expect={204})


# ---- row 3: hami-park acts for the target's owner or root only ----------------------------

PARK_BOB = """
import os, subprocess
from hami_jupyter import native
env = {{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}}
for verb in ("hold", "restore", "recover", "state"):
    r = subprocess.run([str(native.park_tool_path()), verb, "{pid}"], env=env, capture_output=True, text=True)
    print(verb, r.returncode, r.stdout.strip())
"""


def test_alice_cannot_freeze_bobs_kernel_with_hami_park(node):
    alice = node.hub.start_kernel("alice")
    try:
        out = node.hub.execute("alice", alice, PARK_BOB.format(pid=node.bob_pid))
        assert out.error is None, out
        for line in out.stdout.splitlines():
            verb, rc, answer = line.split(" ", 2)
            assert rc == "1" and answer.startswith("error 800 ") and "belongs to uid" in answer, line
        bob_runs_at_once(node)
    finally:
        if driver_state(node, node.bob_pid) != "ok running":  # 802aae2: bring bob back for what follows
            subprocess.run([str(native.park_tool_path()), "restore", str(node.bob_pid)], env=node.helpers.env,
                           capture_output=True, timeout=120)
        node.hub.server_api("alice", "DELETE", f"kernels/{alice}", expect={204})


# ---- row 4: a connect, send, close loop fills no log -------------------------------------

CHURN = """
import os, socket, time
from hami_jupyter.slice.file import read_snapshot
uuid = read_snapshot(os.environ["HAMI_SLICE"]).devices[0].uuid
n, end = 0, time.monotonic() + 5
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.environ["HAMI_BROKER_SOCKET"])
        s.sendall(f"ROOM {uuid} 1048576 {time.time_ns()}\\n".encode())
        n += 1
    except OSError:
        time.sleep(0.01)
    finally:
        s.close()
print(n)
"""


def test_alices_requests_that_go_away_leave_one_record(node):
    alice = kernel(node, "alice")
    uid = int(node.hub.execute("alice", alice, "import os; print(os.getuid())").stdout)
    out = node.hub.execute("alice", alice, CHURN, timeout=60)
    assert out.error is None and int(out.stdout) > 20, out
    time.sleep(3)  # what the agent still had to read of the loop
    dropped = records(node, "broker-dropped", uid=uid)
    assert len(dropped) <= 1, f"{len(dropped)} broker-dropped records for {out.stdout.strip()} requests"
    log = (node.helpers.tmp / "agent.log").read_text(errors="replace")
    assert log.count("went away before it was served") <= 1
    node.hub.server_api("alice", "DELETE", f"kernels/{alice}", expect={204})


# ---- row 6: a zeroed counter comes back to the driver's figures ------------------------------

ZERO = """
import ctypes, os, time
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.layout import DEVICES_OFFSET, HamiSliceDevice
path = os.environ["HAMI_SLICE"]
[dev] = [x.index for x in read_snapshot(path).devices if x.memory_used]
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, (0).to_bytes(8, "little"),
          DEVICES_OFFSET + dev * ctypes.sizeof(HamiSliceDevice) + HamiSliceDevice.memory_used.offset)
os.close(fd)
before = read_snapshot(path).devices[0].memory_used
deadline = time.monotonic() + 10
while read_snapshot(path).devices[0].memory_used < held.nbytes and time.monotonic() < deadline:
    time.sleep(0.2)
print(before, read_snapshot(path).devices[0].memory_used)
"""


def test_a_counter_alice_zeroed_comes_back(node):
    alice = node.hub.start_kernel("alice")
    out = node.hub.execute("alice", alice, HOLD.format(size=GIB))
    assert out.error is None, out
    out = node.hub.execute("alice", alice, ZERO, timeout=30)
    assert out.error is None, out
    before, after = map(int, out.stdout.split())
    assert before < GIB <= after, f"the slice's counter said {before}, then {after}, with 1 GiB held"
    node.hub.server_api("alice", "DELETE", f"kernels/{alice}", expect={204})


# ---- row 5: what alice sets in her environment moves no tolerance ----------------------------


def test_a_context_overhead_alice_sets_hides_no_bypass(node):
    alice = kernel(node, "alice")
    try:
        claims = helper("claims", GIB, "env['HAMI_CONTEXT_OVERHEAD'] = '1g'")  # under the library
        out = node.hub.execute("alice", alice, claims)
        assert out.error is None, out
        # 1 GiB + 3100 MiB + three contexts of 64 MiB: 170 MiB past her 4 GiB cap and 64 MiB.
        out = node.hub.execute("alice", alice, helper("bypass", 3100 << 20))
        assert out.error is None, out
        pid = int(out.stdout)
        wait_report(node.root, node.agent, lambda r: any(p["pid"] == pid for p in r.get("parked") or []),
                    "alice's bypass parked", timeout=30)
        [park] = records(node, "guard-park", pid=pid)
        assert park["tolerance_bytes"] == 64 << 20
    finally:
        node.hub.execute("alice", alice, "for p in ('claims', 'bypass'):\n"
                                         "    if p in globals(): globals()[p].kill(); globals()[p].wait()")
        node.hub.server_api("alice", "DELETE", f"kernels/{alice}", expect={204})


# ---- row 1: a slice file alice broke holds her to her cap, and bob is not parked for her -----

BREAK = """
import os, stat
os.chmod(os.environ["HAMI_SLICE"], 0o646)  # writable by every user
print(oct(stat.S_IMODE(os.stat(os.environ["HAMI_SLICE"]).st_mode)))
"""
MEND = "import os; os.chmod(os.environ['HAMI_SLICE'], 0o640)"


def test_alice_breaking_her_slice_file_keeps_her_to_her_cap_and_bobs_kernel_on_the_gpu(node):
    alice = kernel(node, "alice")
    carol = None
    try:
        out = node.hub.execute("alice", alice, BREAK)
        assert out.error is None and out.stdout.strip() == "0o646", out
        out = node.hub.execute("alice", alice, helper("bypass", 5 * GIB))
        assert out.error is None, out
        pid = int(out.stdout)
        report = wait_report(node.root, node.agent,
                             lambda r: any(p["pid"] == pid for p in r.get("parked") or []),
                             "alice's bypass parked by the guard", timeout=30)
        [park] = [p for p in report["parked"] if p["pid"] == pid]
        assert park["slice"] == "alice" and park["preload"] is False
        assert report["slices"]["alice"]["unreadable"], report["slices"]["alice"]
        assert not any(u["pid"] == pid for u in report["unattributed"])
        # carol's 6 GiB: room enough now, bob's kernel (within his cap) stays on the GPU.
        carol = kernel(node, "carol")
        got = node.hub.execute("carol", carol, HOLD.format(size=6 * GIB), timeout=60)
        assert got.error is None, got
        assert not records(node, "broker-park"), records(node, "broker-park")
        bob_runs_at_once(node)
    finally:
        node.hub.execute("alice", alice, MEND + "\nif 'bypass' in globals(): bypass.kill(); bypass.wait()")
        node.hub.server_api("alice", "DELETE", f"kernels/{alice}", expect={204})
        if carol is not None:
            node.hub.server_api("carol", "DELETE", f"kernels/{carol}", expect={204})
