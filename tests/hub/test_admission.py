"""Issue 28, item 4: the hub admits a start only when each GPU has room for its slice.

Per GPU, over the slices of the servers that run and the one about to start:
the guarantees no more than the GPU's memory, the caps no more than
``memory_oversubscription`` times it. Real policy objects and real hub-made
slice files (``prepare_user_slice``), the GPUs given as NVML would; the
hook-level tests run JupyterHub's own objects (an in-memory hub database, its
``User`` and spawner) through the steps of a spawn, as test_refused_size.py
does. The end-to-end check is in test_refused_size.py.
"""

import os

import pytest
from traitlets.config import Config

from hami_jupyter import gpus as host
from hami_jupyter.admin import changes
from hami_jupyter.gpus import HostGpu
from hami_jupyter.hub import PolicyError, SlicePolicy
from hami_jupyter.hub.admission import AdmissionError
from hami_jupyter.hub.slice_files import prepare_user_slice
from hami_jupyter.slice.file import read_snapshot

GiB = 1 << 30
UUIDS = ["GPU-ad000000-0000-4000-8000-000000000000", "GPU-ad000000-0000-4000-8000-000000000001"]
ONE = [HostGpu(0, UUIDS[0], "Sim GPU", 16 * GiB)]
TWO = [*ONE, HostGpu(1, UUIDS[1], "Sim GPU", 16 * GiB)]
ME = (os.getuid(), os.getgid())

SIZES = {
    "shared": {"memory": "8g", "guarantee": "2g"},  # the issue's: 8 GiB caps, 2 GiB kept
    "big": {"memory": "12g", "guarantee": "12g"},
    "plain": {"memory": "8g"},  # no guarantee: the cap is kept whole
    "second": {"memory": "8g", "guarantee": "8g", "gpus": [1]},
    "first": {"memory": "12g", "guarantee": "12g", "gpus": [0]},
}


def policy(tmp_path, **settings):
    c = Config()
    c.SlicePolicy.sizes = SIZES
    c.SlicePolicy.default = "shared"
    c.SlicePolicy.offer = {"*": list(SIZES)}
    c.SlicePolicy.slice_root = str(tmp_path / "slices")
    for k, v in settings.items():
        setattr(c.SlicePolicy, k, v)
    return SlicePolicy(config=c)


def start(p, user, size_name=None, running=(), gpus=ONE):
    """What the hub does at *user*'s start: admit, then make the slice."""
    size = p.choose(user, [], size_name)
    p.admit(user, size, set(running), gpus)
    prepare_user_slice(user, size, *ME, p.slice_root, gpus=gpus)
    return size


def test_three_users_share_a_gpu_by_their_guarantees_and_a_fourth_big_one_is_refused(tmp_path):
    p = policy(tmp_path, memory_oversubscription=4.0)
    for user in ("ann", "ben", "cid"):  # 3 x 8 GiB caps on 16 GiB: 3 x 2 GiB kept, the rest lent
        start(p, user, running={"ann", "ben", "cid"} - {user})
    with pytest.raises(AdmissionError) as refused:
        start(p, "dee", "big", running={"ann", "ben", "cid"})
    message = str(refused.value)
    assert message.startswith(f"GPU 0 (Sim GPU {UUIDS[0]}) cannot guarantee slice 'dee' 12.0 GiB: "
                              "the guarantees there would come to 18.0 GiB of its 16.0 GiB "
                              "(guarantees: ann 2.0 GiB, ben 2.0 GiB, cid 2.0 GiB, dee 12.0 GiB)")
    assert "Pick a smaller size than 'big'" in message
    assert not (tmp_path / "slices" / "dee.slice").exists()  # refused before anything was made
    start(p, "dee", "shared", running={"ann", "ben", "cid"})  # 4 x 2 GiB kept, 32 GiB of caps: fits


def test_caps_beyond_the_oversubscription_are_refused_naming_the_guarantees(tmp_path):
    p = policy(tmp_path, memory_oversubscription=1.5)  # 24 GiB of caps on 16 GiB
    start(p, "ann")
    start(p, "ben", running={"ann"})
    start(p, "cid", running={"ann", "ben"})  # 3 x 8 = 24 GiB: exactly allowed
    with pytest.raises(AdmissionError) as refused:
        start(p, "dee", running={"ann", "ben", "cid"})
    assert (f"GPU 0 (Sim GPU {UUIDS[0]}) cannot take slice 'dee' with 8.0 GiB: the caps there "
            "would come to 32.0 GiB, more than 1.5 x its 16.0 GiB "
            "(SlicePolicy.memory_oversubscription) (caps: ann 8.0 GiB, ben 8.0 GiB, cid 8.0 GiB, "
            "dee 8.0 GiB; guarantees: ann 2.0 GiB, ben 2.0 GiB, cid 2.0 GiB, dee 2.0 GiB)"
            in str(refused.value))


def test_guarantees_alone_mean_an_oversubscription_of_one(tmp_path):
    p = policy(tmp_path)  # a size has a guarantee: admission is on, caps up to 1 x the GPU
    assert p.checks_admission and p.oversubscription == 1.0
    start(p, "ann")
    start(p, "ben", running={"ann"})
    with pytest.raises(AdmissionError, match="more than 1 x its 16.0 GiB"):
        start(p, "cid", running={"ann", "ben"})


def test_a_policy_without_guarantees_admits_as_before(tmp_path):
    """No guarantee anywhere and no memory_oversubscription: the hub adds
    nothing up, as before guarantees existed (caps of 32 GiB on 16 GiB start)."""
    c = Config()
    c.SlicePolicy.sizes = {"plain": {"memory": "8g"}}
    c.SlicePolicy.default = "plain"
    c.SlicePolicy.slice_root = str(tmp_path / "slices")
    p = SlicePolicy(config=c)
    assert not p.checks_admission
    for user in ("ann", "ben", "cid", "dee"):
        start(p, user, running={"ann", "ben", "cid", "dee"} - {user})


def test_without_a_guarantee_a_slice_keeps_its_whole_cap(tmp_path):
    p = policy(tmp_path, memory_oversubscription=4.0)
    start(p, "ann", "plain")
    start(p, "ben", "plain", running={"ann"})  # 8 + 8 GiB kept: the GPU is full
    with pytest.raises(AdmissionError, match=r"guarantees: ann 8\.0 GiB, ben 8\.0 GiB, cid 2\.0 GiB"):
        start(p, "cid", running={"ann", "ben"})


def test_stopped_servers_slices_do_not_count(tmp_path):
    p = policy(tmp_path, memory_oversubscription=4.0)
    start(p, "ann", "big")
    with pytest.raises(AdmissionError):
        start(p, "ben", "plain", running={"ann"})
    start(p, "ben", "plain", running=set())  # ann's server stopped: her file stays, uncounted
    assert (tmp_path / "slices" / "ann.slice").exists()


def test_a_restart_replaces_the_users_own_slice_and_an_admins_limits_count(tmp_path):
    p = policy(tmp_path, memory_oversubscription=4.0)
    start(p, "ann", "big")
    start(p, "ann", "big", running={"ann"})  # her own 12 GiB are not counted twice
    # An administrator gave ben a 14 GiB guarantee; the hub keeps it at his restart.
    start(p, "ben", "plain")
    changes.apply_here(tmp_path / "slices" / "ben.slice", memory="14g", guarantee="14g",
                       overcommit=True, gpus=ONE)
    with pytest.raises(AdmissionError, match="cannot guarantee slice 'ben' 14.0 GiB"):
        start(p, "ben", "plain", running={"ann", "ben"})
    assert read_snapshot(tmp_path / "slices" / "ben.slice").fallback_limit.memory_guarantee == 14 * GiB


def test_a_size_counts_only_on_the_gpus_it_may_use(tmp_path):
    p = policy(tmp_path, memory_oversubscription=4.0)
    start(p, "ann", "second", gpus=TWO)  # GPU 1 only: 8 GiB kept there
    start(p, "ben", "second", running={"ann"}, gpus=TWO)  # GPU 1 is full now
    for size in ("second", "big"):  # "big" may use any GPU, so GPU 1 too
        with pytest.raises(AdmissionError) as refused:
            start(p, "cid", size, running={"ann", "ben"}, gpus=TWO)
        assert str(refused.value).startswith(f"GPU 1 (Sim GPU {UUIDS[1]}) cannot guarantee "
                                             "slice 'cid' ")
        assert "GPU 0 " not in str(refused.value)
    start(p, "cid", "first", running={"ann", "ben"}, gpus=TWO)  # GPU 0 only: ann and ben are not there


def test_without_nvml_the_gpus_the_slice_files_record_count(tmp_path):
    from live_slots import enter_gpu

    p = policy(tmp_path, memory_oversubscription=4.0)
    start(p, "ann", "big", gpus=[])  # no GPU known at all: nothing to check against
    start(p, "ben", "big", running={"ann"}, gpus=[])
    enter_gpu(tmp_path / "slices" / "ann.slice", 0, UUIDS[0], 16 * GiB)  # ann's kernel used it
    with pytest.raises(AdmissionError) as refused:
        start(p, "cid", "plain", running={"ann", "ben"}, gpus=[])
    assert str(refused.value).startswith(f"GPU {UUIDS[0]} cannot guarantee slice 'cid' 8.0 GiB: "
                                         "the guarantees there would come to 32.0 GiB")


def test_a_size_picked_for_the_next_start_is_the_one_admitted(tmp_path):
    from hami_jupyter.hub import next_sizes

    picks = tmp_path / "next.json"
    p = policy(tmp_path, memory_oversubscription=4.0, next_sizes_file=str(picks))
    start(p, "ann", "big")
    start(p, "ben", running={"ann"})  # his own size, "shared": 2 GiB kept
    next_sizes.pick(picks, "ben", "big", by="ada")  # an administrator's pick for his next start
    with pytest.raises(AdmissionError, match="cannot guarantee slice 'ben' 12.0 GiB"):
        start(p, "ben", running={"ann", "ben"})


def test_the_hub_writes_the_guarantee_and_the_gpus_a_size_may_use(tmp_path):
    from hami_jupyter.admin import marks

    p = policy(tmp_path, memory_oversubscription=4.0)
    path = prepare_user_slice("ann", p.choose("ann", [], "second"), *ME, p.slice_root, gpus=TWO)
    limits = read_snapshot(path).fallback_limit
    assert (limits.memory_limit, limits.memory_guarantee) == (8 * GiB, 8 * GiB)
    assert marks.policy_limits(path)["gpus"] == [UUIDS[1]]
    path = prepare_user_slice("ben", p.choose("ben", [], "shared"), *ME, p.slice_root, gpus=TWO)
    assert read_snapshot(path).fallback_limit.memory_guarantee == 2 * GiB
    assert marks.policy_limits(path)["gpus"] is None  # any GPU


def test_the_policy_checks_its_guarantees_and_oversubscription(tmp_path):
    with pytest.raises(PolicyError, match="memory_oversubscription: 0.5 is below 1.0"):
        policy(tmp_path, memory_oversubscription=0.5)
    with pytest.raises(PolicyError, match="slice size 'x': a memory guarantee of 9.0 GiB is above "
                                          "the memory limit of 8.0 GiB"):
        policy(tmp_path, sizes={"x": {"memory": "8g", "guarantee": "9g"}}, offer={}, default="x")
    with pytest.raises(PolicyError, match=r"per_gpu\[0\]: a memory guarantee of 2.0 GiB is above"):
        policy(tmp_path, sizes={"x": {"memory": "8g", "guarantee": "2g",
                                      "per_gpu": {0: {"memory": "1g"}}}}, offer={}, default="x")
    with pytest.raises(PolicyError, match="guarantee: memory guarantee '2x' is not a size"):
        policy(tmp_path, sizes={"x": {"guarantee": "2x"}}, offer={}, default="x")


# ---- in the hub: its database says who runs; a refusal is a 400 ------------------------------

jupyterhub = pytest.importorskip("jupyterhub")
from jupyterhub import orm  # noqa: E402
from tornado.web import HTTPError  # noqa: E402

from test_refused_size import Hub  # noqa: E402


def hub_config(tmp_path):
    c = Config()
    c.SlicePolicy.sizes = SIZES
    c.SlicePolicy.default = "shared"
    c.SlicePolicy.offer = {"*": list(SIZES)}
    c.SlicePolicy.slice_root = str(tmp_path / "slices")
    c.SlicePolicy.memory_oversubscription = 4.0
    SlicePolicy(config=c).configure_spawner(c)
    return c


def add_user(hub, name):
    """Another user of the same hub database, as JupyterHub's User."""
    from jupyterhub.user import User

    orm_user = orm.User(name=name)
    hub.db.add(orm_user)
    hub.db.commit()
    return User(orm_user, settings={"config": hub.config}, db=hub.db)


def running(hub, user):
    """Mark *user*'s default server started, as User.spawn does before the hook."""
    spawner = user.get_or_create_spawner("", "", replace_failed=True)
    spawner.orm_spawner.server = orm.Server(base_url=f"/user/{user.name}/")
    hub.db.commit()


def as_user(hub, user):
    """*hub* (test_refused_size.Hub) acting for *user* (a JupyterHub User of its database)."""
    hub.user, hub.name = user, user.name
    return hub


def test_the_hook_counts_the_servers_the_hub_runs_and_refuses_with_a_400(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "read_gpus", lambda: (ONE, None))
    hub = Hub(tmp_path, hub_config(tmp_path), name="zoe")
    zoe, yan = hub.user, add_user(hub, "yan")
    as_user(hub, yan).start({"slice_size": "big"})  # yan: 12 GiB kept
    running(hub, yan)
    with pytest.raises(HTTPError) as refused:
        as_user(hub, zoe).start({"slice_size": "plain"})  # zoe: 8 GiB kept; 20 > 16
    assert refused.value.status_code == 400
    assert "cannot guarantee slice 'zoe' 8.0 GiB" in refused.value.log_message
    assert "guarantees: yan 12.0 GiB, zoe 8.0 GiB" in refused.value.log_message
    assert hub.kept_options() == {"slice_size": "plain"}  # her size is hers: kept for later
    # yan's server stops: the hub's database no longer lists it, and zoe starts.
    yan.get_or_create_spawner("", "").orm_spawner.server = None
    hub.db.commit()
    assert hub.start().environment["HAMI_SLICE_SIZE"] == "plain"
