"""A refused slice size leaves nothing behind (issue 12, item 3).

JupyterHub keeps the user options of a start in its database
(``orm_spawner.user_options``) and reuses them for any later start that
names none. A size the policy refused must not be kept: otherwise every
later plain start is refused again ("no slice size named 'huge'") until
someone clears the options by hand.

The unit tests run JupyterHub's own objects (an in-memory hub database, a
``jupyterhub.user.User`` and the spawner it makes, configured by
``SlicePolicy.configure_spawner``) through the steps of ``User.spawn`` that
handle user options; the end-to-end test asks a real JupyterHub.

That hub (the conftest's ``admitting_hub``) is also the oversubscribed hub
of issue 28: its admission by guarantees is checked beside the refused
size, and its "shared" size (8 GiB caps, 2 GiB guaranteed) is where three
users lend one 16 GiB GPU to each other through the memory broker (the last
test; one hub start serves both).
"""

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from traitlets.config import Config

from hami_jupyter.hub import SlicePolicy
from hami_jupyter.slice.file import read_snapshot

jupyterhub = pytest.importorskip("jupyterhub")
from jupyterhub import orm  # noqa: E402
from jupyterhub.user import User  # noqa: E402
from jupyterhub.utils import maybe_future  # noqa: E402
from tornado.web import HTTPError  # noqa: E402

GiB = 1 << 30


def _policy(tmp_path, **settings):
    c = Config()
    c.SlicePolicy.sizes = {"small": {"memory": "1g", "sm": 25}, "large": {"memory": "2g", "sm": 50}}
    c.SlicePolicy.default = "small"
    c.SlicePolicy.offer = {"*": ["large"]}
    c.SlicePolicy.slice_root = str(tmp_path / "slices")
    for k, v in settings.items():
        setattr(c.SlicePolicy, k, v)
    SlicePolicy(config=c).configure_spawner(c)
    return c


class Hub:
    """A hub database and a user of it, as JupyterHub keeps them."""

    def __init__(self, tmp_path, config, name="zoe"):
        self.url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
        self.db = orm.new_session_factory(self.url)()
        self.config, self.name = config, name
        orm_user = orm.User(name=name)
        self.db.add(orm_user)
        self.db.commit()
        self.user = User(orm_user, settings={"config": config}, db=self.db)

    def kept_options(self):
        """user_options as a fresh connection reads them from the database."""
        db = orm.new_session_factory(self.url)()
        try:
            orm_user = db.query(orm.User).filter_by(name=self.name).one()
            return orm_user.orm_spawners[""].user_options
        finally:
            db.close()

    def start(self, options=None):
        """What ``User.spawn`` does with user options, up to the spawner's
        start: *options* None is a start naming none (the kept ones count)."""
        spawner = self.user.get_or_create_spawner("", "", replace_failed=True)
        # jupyterhub/user.py, User.spawn:
        if options is None:
            options = spawner.orm_spawner.user_options or {}
        else:
            spawner.orm_spawner.user_options = options
            self.db.commit()
        spawner.user_options = options

        async def steps():
            await spawner._run_apply_user_options(spawner.user_options)
            await maybe_future(spawner.run_pre_spawn_hook())

        asyncio.run(steps())
        return spawner


def test_a_refused_size_is_not_kept_and_a_plain_start_gets_the_default(tmp_path):
    hub = Hub(tmp_path, _policy(tmp_path))
    with pytest.raises(HTTPError) as info:
        hub.start({"slice_size": "huge"})
    assert not (hub.kept_options() or {}).get("slice_size"), hub.kept_options()
    assert info.value.status_code == 400
    assert "no slice size named 'huge'" in info.value.log_message
    assert "not kept" in info.value.log_message and "(small)" in info.value.log_message

    spawner = hub.start()  # no options: the kept ones, which no longer name 'huge'
    assert spawner.environment["HAMI_SLICE_SIZE"] == "small"
    assert read_snapshot(spawner.environment["HAMI_SLICE"]).fallback_limit.memory_limit == 1 * GiB


def test_a_kept_size_the_policy_no_longer_offers_is_refused_once(tmp_path):
    # zoe picked "large" while it was offered; the hub restarted with a policy
    # that offers it no more. Her next plain start is refused once, clearly,
    # and the one after it gets her own size.
    hub = Hub(tmp_path, _policy(tmp_path))
    assert hub.start({"slice_size": "large"}).environment["HAMI_SLICE_SIZE"] == "large"
    assert hub.kept_options() == {"slice_size": "large"}

    hub.user = User(hub.user.orm_user, settings={"config": _policy(tmp_path, offer={})}, db=hub.db)
    with pytest.raises(HTTPError) as info:
        hub.start()
    assert "'large' is not offered to 'zoe'" in info.value.log_message
    assert not (hub.kept_options() or {}).get("slice_size")
    assert hub.start().environment["HAMI_SLICE_SIZE"] == "small"


def test_other_user_options_are_left_alone(tmp_path):
    hub = Hub(tmp_path, _policy(tmp_path))
    with pytest.raises(HTTPError):
        hub.start({"slice_size": "huge", "image": "x"})
    assert hub.kept_options() == {"image": "x"}


def test_the_hook_alone_refuses_once_too(tmp_path):
    # A hub without apply_user_options (JupyterHub < 5.3): the pre-spawn hook
    # is the one that refuses, and it forgets the size all the same.
    c = _policy(tmp_path)
    del c.Spawner["apply_user_options"]
    hub = Hub(tmp_path, c)
    with pytest.raises(HTTPError) as info:
        hub.start({"slice_size": "huge"})
    assert info.value.status_code == 400
    assert not (hub.kept_options() or {}).get("slice_size")
    assert hub.start().environment["HAMI_SLICE_SIZE"] == "small"


def test_hub_group_names_reads_the_hub_database(tmp_path):
    # What SlicePolicy checks its group names against at the first spawn.
    from hami_jupyter.hub.policy import hub_group_names

    hub = Hub(tmp_path, _policy(tmp_path))
    hub.db.add(orm.Group(name="students"))
    hub.db.commit()
    assert hub_group_names(hub.user) == ["students"]
    assert hub_group_names(object()) is None


GPU_CELL = "from hami_jupyter import driver_memory as d\nd.init()\nprint(d.mem_get_info()[1])\n"


def _stop(hub, user, timeout=60):
    """Stop *user*'s server and wait until the hub lists none."""
    hub.api("DELETE", f"users/{user}/server", expect={202, 204})
    deadline = time.monotonic() + timeout
    while True:
        model = hub.api("GET", f"users/{user}", expect={200})
        if not (model.get("servers") or {}).get("") and not model.get("pending"):
            return
        assert time.monotonic() < deadline, f"{user}'s server did not stop: {model}\n{hub.log_tail()}"
        time.sleep(0.25)


@pytest.mark.slow
def test_a_hub_without_nvml_admits_by_the_gpu_its_servers_see(admitting_hub):
    """Issue 35, item 12: the hub's process has no NVML (conftest's AdmittingHub),
    its servers have the simulated GPU through Spawner.environment, as
    docs/single-host.md sets it up. Admission counts that GPU from the first
    start, before any kernel has used it: a slice that keeps all 16 GiB leaves
    no room for another's guarantee. (It logged "start is not checked" for
    every user, and both started.)"""
    hub = admitting_hub
    hub.spawn("una", {"slice_size": "whole"})
    hub.wait_ready("una")
    try:
        status, reply = hub.spawn("vic", {"slice_size": "small"}, expect=(201, 202, 400))
        assert status == 400, f"vic's start was admitted beside una's 16 GiB: {status} {reply}\n" \
                              f"{hub.log_tail()}"
        assert "cannot guarantee slice 'vic' 1.0 GiB: the guarantees there would come to 17.0 GiB " \
               "of its 16.0 GiB (guarantees: una 16.0 GiB, vic 1.0 GiB)" in str(reply), reply
        assert "start is not checked" not in hub.log_tail(200_000)
        # una's slice records the GPU her size may use, read the same way.
        assert read_snapshot(hub.slice_root / "una.slice").fallback_limit.memory_limit == 16 * GiB
    finally:
        _stop(hub, "una")


@pytest.mark.slow
def test_a_real_hub_forgets_a_refused_size(admitting_hub):
    # The `hub` fixture (conftest.py), admission on: "small" is the default,
    # "large" and "whole" offered.
    hub = admitting_hub
    status, reply = hub.spawn("yuki", {"slice_size": "huge"}, expect=(400,))
    assert "no slice size named 'huge'" in str(reply)
    assert hub.wait_spawn("yuki") is None
    # A plain start (no body at all: JupyterHub reuses the kept options).
    status, reply = hub.request("POST", f"{hub.url}/hub/api/users/yuki/server")
    assert status in (201, 202), f"{status}: {reply}\n{hub.log_tail()}"
    server = hub.wait_ready("yuki")
    assert not (server.get("user_options") or {}).get("slice_size"), server
    snap = read_snapshot(hub.slice_root / "yuki.slice")
    assert (snap.fallback_limit.memory_limit, snap.fallback_limit.sm_share) == (1 * GiB, 25)

    # Admission (issue 28, item 4): once yuki's kernel has used the 16 GiB GPU,
    # a slice that keeps all 16 GiB has no room beside her 1 GiB.
    kernel_id = hub.start_kernel("yuki")
    assert hub.execute("yuki", kernel_id, GPU_CELL).error is None
    status, reply = hub.spawn("zed", {"slice_size": "whole"}, expect=(400,))
    assert "cannot guarantee slice 'zed' 16.0 GiB: the guarantees there would come to 17.0 GiB " \
           "of its 16.0 GiB (guarantees: yuki 1.0 GiB, zed 16.0 GiB)" in str(reply), reply
    assert hub.wait_spawn("zed") is None
    assert not (hub.slice_root / "zed.slice").exists()


# ---- issue 28: three users lend one GPU through the memory broker -------------------
#
# ada, ben and cleo start with the "shared" size: 8 GiB caps (24 GiB in all) on
# the one 16 GiB simulated GPU, 2 GiB of each guaranteed; the hub admits them
# (memory_oversubscription). A memory broker runs as root on the hub's slice
# root, parking kernels idle for 2 s. ada and ben each hold 6 GiB with known
# bytes; cleo's cell then takes all her cap leaves beside her context, which
# the GPU has no room for.

BROKER_MIN_IDLE_S = 2
ROOM_CELL_TIMEOUT = 60  # a cell that waits for room: well above the 2 s idle rule, below HAMI_ROOM_WAIT's 30 s
CONTEXT = 64 << 20  # HAMI_SIM_CONTEXT_BYTES of the hub's simulated GPU

HOLD = (
    "import hashlib, os\n"
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "held = d.DeviceBuffer(6 << 30)\n"
    "data = os.urandom(4 << 20)\n"
    "held.write(data)\n"
    "print(hashlib.sha256(data).hexdigest())\n"
)
CHECK = "print(hashlib.sha256(held.read(len(data))).hexdigest())\n"
WHOLE_CAP = (
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    f"big = d.DeviceBuffer((8 << 30) - {CONTEXT})\n"
    "print(big.nbytes)\n"
)
OVER_CAP = (
    "try:\n"
    "    d.DeviceBuffer(1 << 20)\n"
    "except d.CudaError as e:\n"
    "    print(e.name)\n"
)
WAITING = "now (cuMemAlloc): waiting up to 30 s while the memory broker parks idle kernels of this GPU"


class RootBroker:
    """``hami-jupyter broker`` as root on the hub's slice root, on its simulated GPU."""

    def __init__(self, hub, log_path):
        self.root, self.log_path = hub.slice_root, log_path
        env = hub.sim_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "broker", "--root", str(self.root),
                                      "--min-idle-seconds", str(BROKER_MIN_IDLE_S)],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self):
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_started(self, timeout=30):
        from hami_jupyter.slice.broker_report import read_report

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the broker exited:\n{self.log()}"
            try:
                report = read_report(self.root)
            except Exception:  # not written yet, or being replaced
                report = None
            if report and report.get("broker_pid") == self.proc.pid and report.get("running"):
                return
            time.sleep(0.1)
        pytest.fail(f"the broker did not start within {timeout} s:\n{self.log()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _hami_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("hami:")]


def _told(result):
    """What a cell showed, short enough for a failure message."""
    error = f"{result.error.get('ename')}: {result.error.get('evalue')}" if result.error else None
    return f"error {error}; stdout {result.stdout!r}; stderr {result.stderr!r}"


def _kernel_body(hub, user, kernel_id):
    status, body = hub.request("GET", f"{hub.url}/user/{user}/hami/v1/kernels/{kernel_id}")
    assert status == 200 and isinstance(body, dict), f"{user}'s hami/v1 kernel answer: {status} {body!r:.500}"
    return body["kernel"]


def _settled_kernel(hub, user, kernel_id, timeout=15):
    """A kernel's body once a park or resume of it has finished: the parked
    process's own parking thread moves it from "parking" to "parked" at its
    next tick, which can come after the agent has answered the requester."""
    deadline = time.monotonic() + timeout
    body = _kernel_body(hub, user, kernel_id)
    while body["park_state"] in ("parking", "resuming") and time.monotonic() < deadline:
        time.sleep(0.1)
        body = _kernel_body(hub, user, kernel_id)
    return body


@pytest.mark.slow
def test_three_users_lend_one_gpu_through_the_memory_broker(admitting_hub, tmp_path):
    from hami_jupyter import audit

    hub = admitting_hub

    users = ("ada", "ben", "cleo")
    for user in users:
        hub.spawn(user, {"slice_size": "shared"})
    for user in users:
        hub.wait_ready(user)
    root = hub.slice_root
    for user in users:
        limit = read_snapshot(root / f"{user}.slice").fallback_limit
        assert (limit.memory_limit, limit.memory_guarantee) == (8 * GiB, 2 * GiB), limit
    broker = RootBroker(hub, tmp_path / "broker.log")
    try:
        broker.wait_started()
        # One at a time, each answering before the next starts: three servers
        # picking kernel ports at the same instant can pick the same one.
        kernels = {}
        for user in users:
            kernels[user] = hub.start_kernel(user)
            assert hub.execute(user, kernels[user], "1").error is None

        # ada's kernel, then ben's, hold 6 GiB each, with bytes to find again: the GPU is full.
        digests, within = {}, []  # within: every cell of a user within her cap
        for user in ("ada", "ben"):
            held = hub.execute(user, kernels[user], HOLD)
            assert held.error is None and not _hami_lines(held), f"{user}: {_told(held)}"
            digests[user] = held.stdout.strip()
            within.append(held)

        # cleo's cell, within her cap, waits while the broker parks the idlest kernel: ada's.
        whole = hub.execute("cleo", kernels["cleo"], WHOLE_CAP, timeout=ROOM_CELL_TIMEOUT)
        within.append(whole)
        assert whole.error is None, f"cleo's cell within her cap failed: {_told(whole)}\n{broker.log()}"
        assert whole.stdout.split() == [str(8 * GiB - CONTEXT)], _told(whole)
        said = _hami_lines(whole)  # what her notebook says: what it waits for, once, and that
        # the broker could park nobody yet (ada's kernel had just run), once, if it came to that
        assert f"GPU 0 has no room for 7.9 GiB {WAITING}" in said[0], said
        assert len(said) == 1 or (len(said) == 2 and "asking again every second" in said[1]), said
        ada = _settled_kernel(hub, "ada", kernels["ada"])
        assert (ada["park_state"], ada["park_reason"]) == ("parked", "room"), ada
        assert _kernel_body(hub, "ben", kernels["ben"])["park_state"] == "running"  # no more than needed

        # ada reads why in %hami status, from another notebook of hers (a cell of
        # the parked kernel itself brings it back first).
        status = hub.execute("ada", hub.start_kernel("ada"), "%hami status")
        assert status.error is None and not _hami_lines(status), _told(status)
        assert "parked to make room for another user's work" in "\n".join(status.text()), status.text()

        # Over her cap, cleo gets the library's ordinary refusal at once: no wait, no broker asked.
        asked = len(audit.read_records(audit.default_path(root)))
        over = hub.execute("cleo", kernels["cleo"], OVER_CAP)
        assert over.stdout.split() == ["CUDA_ERROR_OUT_OF_MEMORY"], _told(over)
        refusal = _hami_lines(over)  # one refusal: its plain words, then the technical line
        assert any("out of memory on GPU 0: cuMemAlloc asked for 1.0 MiB; slice \"cleo\" has 8.0 GiB of its 8.0 GiB cap"
                   in line for line in refusal), refusal
        assert not any("waiting" in line or "broker" in line for line in refusal), refusal
        assert len(audit.read_records(audit.default_path(root))) == asked

        # ada's next cell brings her kernel back: it says why it was parked, waits
        # for room in turn (ben's kernel, now the idlest, is parked for it), and
        # finds her bytes intact.
        back = hub.execute("ada", kernels["ada"], CHECK, timeout=ROOM_CELL_TIMEOUT)
        within.append(back)
        assert back.error is None, f"{_told(back)}\n{broker.log()}"
        note, restored, digest = back.stdout.splitlines()
        assert note == ("hami: this kernel's GPU memory was parked in host memory to make room for another "
                        "user's work; bringing it back waits for free memory on the GPU"), back.stdout
        assert restored.startswith("hami: GPU memory restored: 6.1 GiB in "), back.stdout
        assert digest == digests["ada"], "ada's bytes changed while her kernel was parked"
        ada = _kernel_body(hub, "ada", kernels["ada"])
        ben = _settled_kernel(hub, "ben", kernels["ben"])
        assert ada["park_state"] == "running" and (ben["park_state"], ben["park_reason"]) == ("parked", "room")
        assert _kernel_body(hub, "cleo", kernels["cleo"])["park_state"] == "running"

        # The broker's decisions are in the administrators' audit log, its chain intact.
        records = audit.read_records(audit.default_path(root))
        parks = [(r["kernel"], r["requester"]["kernel"]) for r in records if r["action"] == "broker-park"]
        assert parks == [(kernels["ada"], kernels["cleo"]), (kernels["ben"], kernels["ada"])], parks
        served = [r["requester"]["kernel"] for r in records if r["action"] == "broker-served"]
        assert served == [kernels["cleo"], kernels["ada"]], served
        verify = subprocess.run([sys.executable, "-m", "hami_jupyter", "audit", "verify", "--root", str(root)],
                                capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0 and ": intact (" in verify.stdout, verify.stdout + verify.stderr

        # No user within her cap ever saw an out-of-memory error.
        for result in within:
            assert result.error is None and "out of memory" not in result.stderr, _told(result)
            assert "OUT_OF_MEMORY" not in result.stdout, _told(result)
    finally:
        broker.stop()
