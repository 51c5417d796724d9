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
"""

import asyncio

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
