"""SlicePolicy: who gets which slice; the spawner form and KubeSpawner profiles."""

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from hami_jupyter.hub import PolicyError, SlicePolicy, kubespawner_profiles
from hami_jupyter.hub.spawner import options_form, options_from_form

GiB = 1 << 30


def policy(log=None, **settings):
    c = Config()
    c.SlicePolicy.sizes = {
        "small": {"memory": "4g", "sm": 25},
        "large": {"memory": "16g", "sm": 50, "mode": "elastic", "gpus": [0, 1],
                  "display_name": "Large <GPU> slice"},
        "tiny": {"memory": "1g"},
    }
    c.SlicePolicy.default = "small"
    c.SlicePolicy.groups = {"students": "tiny", "researchers": "large"}
    c.SlicePolicy.users = {"alice": {"memory": "8g", "sm": 30}}
    for k, v in settings.items():
        setattr(c.SlicePolicy, k, v)
    return SlicePolicy(config=c, **({"log": log} if log else {}))


def spawner(name, groups=(), options=None):
    return SimpleNamespace(user=SimpleNamespace(name=name, groups=[SimpleNamespace(name=g) for g in groups]),
                           user_options=options or {}, environment={}, log=SimpleNamespace(info=print))


def test_user_over_group_over_default():
    p = policy()
    alice = p.size_of("alice", ["researchers"])
    assert (alice.limits.memory_limit, alice.limits.sm_share) == (8 * GiB, 30)  # her own entry beats her group
    assert p.size_of("carol", ["researchers"]).name == "large"
    assert p.size_of("dave").name == "small"  # no entry, no group: the default


def test_first_group_in_written_order_wins():
    p = policy()
    # groups lists students before researchers: a member of both gets tiny.
    assert p.size_of("erin", ["researchers", "students"]).name == "tiny"


def test_no_default_means_no_slice():
    assert policy(default=None).size_of("dave") is None


def test_offered_sizes_and_choosing():
    p = policy(offer={"*": ["tiny"], "researchers": ["small", "large"]})
    assert [s.name for s in p.offered("carol", ["researchers"])] == ["large", "tiny", "small"]
    assert [s.name for s in p.offered("dave")] == ["small", "tiny"]
    assert p.choose("dave", [], "tiny").name == "tiny"
    assert p.choose("dave", [], None).name == "small"
    with pytest.raises(PolicyError, match="'large' is not offered to 'dave'"):
        p.choose("dave", [], "large")


@pytest.mark.parametrize("settings,words", [
    ({"sizes": {"x": {"memory": "4x"}}}, "slice size 'x' memory: memory limit '4x' is not a size"),
    ({"sizes": {"x": {"sm": 120}}}, "slice size 'x' sm: SM share 120"),
    ({"sizes": {"x": {"mode": "soft"}}}, "slice size 'x' mode: SM mode 'soft'"),
    # one grammar with the preload library: no spaces, ASCII digits, exact mode names
    ({"sizes": {"x": {"memory": " 4g"}}}, "slice size 'x' memory: memory limit ' 4g' is not a size"),
    ({"sizes": {"x": {"sm": "25 "}}}, "slice size 'x' sm: SM share '25 '"),
    ({"sizes": {"x": {"sm": "\u0665\u0660"}}}, "slice size 'x' sm: SM share '\u0665\u0660'"),
    ({"sizes": {"x": {"sm": True}}}, "slice size 'x' sm: SM share True"),
    ({"sizes": {"x": {"mode": "Elastic"}}}, "slice size 'x' mode: SM mode 'Elastic'"),
    ({"sizes": {"x": {"memroy": "4g"}}}, "unknown key(s) memroy"),
    ({"sizes": {"x": {"gpus": []}}}, "gpus must be a non-empty list"),
    ({"sizes": {"x": {"gpus": ["0"]}}}, "'0' is not a UUID"),
    ({"sizes": {"x": {"per_gpu": {0: {"memory": "-1g"}}}}}, "per_gpu[0] memory"),
    ({"default": "huge"}, "default: no slice size named 'huge'"),
    ({"groups": {"g": "medium"}}, "groups['g']: no slice size named 'medium'"),
    ({"offer": {"*": ["medium"]}}, "offer['*']: no slice size named 'medium'"),
])
def test_a_bad_policy_stops_the_hub_at_start_with_the_place_named(settings, words):
    base = {"sizes": {"small": {"memory": "4g"}}, "default": "small", "groups": {}, "users": {}}
    base.update(settings)
    with pytest.raises(PolicyError) as info:
        policy(**base)
    assert words in str(info.value)


def test_options_form_offers_sizes_escaped_own_first():
    p = policy(offer={"researchers": ["small"]})
    html = options_form(p)(spawner("carol", ["researchers"]))
    assert html.index('value="large" selected') < html.index('value="small"')
    assert "Large &lt;GPU&gt; slice" in html and "<GPU>" not in html
    assert options_form(p)(spawner("dave")) == ""  # one size: nothing to choose


def test_options_from_form():
    parse = options_from_form(policy())
    assert parse({"slice_size": ["tiny"]}) == {"slice_size": "tiny"}
    assert parse({}) == {}
    with pytest.raises(PolicyError, match="unknown GPU slice size 'huge'"):
        parse({"slice_size": ["huge"]})


def test_kubespawner_profiles_set_environment_and_hami_resources():
    p = policy(offer={"researchers": ["small"]})
    profiles = kubespawner_profiles(p)(spawner("carol", ["researchers"]))
    assert [x["slug"] for x in profiles] == ["large", "small"]
    large, small = profiles
    assert large["default"] is True and "default" not in small
    assert large["kubespawner_override"]["extra_resource_limits"] == {
        "nvidia.com/gpu": "2", "nvidia.com/gpumem": "16384", "nvidia.com/gpucores": "50"}
    env = large["kubespawner_override"]["environment"]
    assert env == {"HAMI_SM_MODE": "elastic", "HAMI_SLICE_SIZE": "large",
                   "HAMI_MEMORY_LIMIT": str(16 * GiB), "HAMI_SM_LIMIT": "50"}
    plain = kubespawner_profiles(p, hami_resources=False)(spawner("dave"))
    assert "extra_resource_limits" not in plain[0]["kubespawner_override"]


# ---- group_source: JupyterHub groups, Unix groups, or both (issue 12, item 6) ----

import grp  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402

from hami_jupyter.hub.spawner import apply_user_options  # noqa: E402

# Its own logger: JupyterHub's set-up (imported by other tests) may stop the
# "traitlets" logger from propagating to pytest's capture.
LOG = logging.getLogger("hami_jupyter.tests.policy")

# A pretend host: gid -> group name; user -> (primary gid, supplementary gids).
UNIX_GROUPS = {5000: "bob", 5001: "researchers", 5002: "students", 5003: "video"}
UNIX_USERS = {"bob": (5000, [5001, 5003]), "dave": (5002, [])}


@pytest.fixture
def unix_host(monkeypatch):
    def getpwnam(name):
        if name not in UNIX_USERS:
            raise KeyError(name)
        return SimpleNamespace(pw_name=name, pw_gid=UNIX_USERS[name][0],
                               pw_uid=os.getuid(), pw_dir="/nonexistent")

    def getgrouplist(name, gid):
        return [gid, *UNIX_USERS[name][1]]

    def getgrgid(gid):
        if gid not in UNIX_GROUPS:
            raise KeyError(gid)
        return SimpleNamespace(gr_name=UNIX_GROUPS[gid], gr_gid=gid)

    def getgrnam(name):
        for gid, n in UNIX_GROUPS.items():
            if n == name:
                return SimpleNamespace(gr_name=n, gr_gid=gid)
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(os, "getgrouplist", getgrouplist)
    monkeypatch.setattr(grp, "getgrgid", getgrgid)
    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    monkeypatch.setattr(grp, "getgrall", lambda: [getgrgid(g) for g in UNIX_GROUPS])


def test_unix_groups_count_with_group_source_unix(unix_host):
    # bob is in the Unix group "researchers" (supplementary), in no JupyterHub group.
    assert policy().size_of("bob", policy().spawner_groups(spawner("bob"))).name == "small"
    p = policy(group_source="unix")
    assert p.groups_of("bob") == ["bob", "researchers", "video"]
    assert p.size_of("bob", p.spawner_groups(spawner("bob"))).name == "large"
    # the primary group counts too: dave's is "students"
    assert p.size_of("dave", p.spawner_groups(spawner("dave"))).name == "tiny"
    # JupyterHub groups do not count with "unix"
    assert p.size_of("carol", p.spawner_groups(spawner("carol", ["researchers"]))).name == "small"


def test_group_source_both(unix_host):
    p = policy(group_source="both")
    assert p.size_of("bob", p.spawner_groups(spawner("bob"))).name == "large"
    assert p.size_of("carol", p.spawner_groups(spawner("carol", ["researchers"]))).name == "large"
    # students is first in the policy's order: a JupyterHub group beats no Unix one
    assert p.size_of("bob", p.spawner_groups(spawner("bob", ["students"]))).name == "tiny"


def test_unix_groups_reach_the_spawner_hooks(unix_host):
    from tornado.web import HTTPError

    p = policy(group_source="unix", offer={"researchers": ["small"]})
    apply_user_options(p)(spawner("bob"), {"slice_size": "small"})  # offered through his Unix group
    assert 'value="large" selected' in options_form(p)(spawner("bob"))
    with pytest.raises(HTTPError, match="not offered to 'dave'"):
        apply_user_options(p)(spawner("dave"), {"slice_size": "large"})


def test_unknown_unix_group_names_warn_at_start(unix_host, caplog):
    with caplog.at_level(logging.WARNING):
        policy(LOG, group_source="unix", groups={"researchers": "large", "reserchers": "tiny"})
    text = caplog.text
    assert "groups['reserchers']: no Unix group 'reserchers'" in text
    assert "'researchers'" not in text


def test_unknown_jupyterhub_group_names_warn_at_first_spawn(unix_host, caplog):
    pytest.importorskip("jupyterhub.orm")
    # The hub's database session, as far as the check reads it (the real
    # one: test_refused_size.py::test_hub_group_names_reads_the_hub_database).
    db = SimpleNamespace(query=lambda column: [("students",)])
    with caplog.at_level(logging.WARNING):
        p = policy(LOG)  # group_source "jupyterhub": nothing to check yet
        assert "no JupyterHub group" not in caplog.text
        user = SimpleNamespace(name="bob", groups=[], db=db)
        p.spawner_groups(SimpleNamespace(user=user))
    text = caplog.text
    # "researchers" is a Unix group here, not a JupyterHub one: say so, and how to mean it
    assert "groups['researchers']: no JupyterHub group is named 'researchers'" in text
    assert "there is a Unix group 'researchers'" in text and "group_source" in text
    assert "'students'" not in text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        p.spawner_groups(SimpleNamespace(user=user))
    assert "no JupyterHub group" not in caplog.text  # once, not at every spawn


def test_unknown_group_source_stops_the_hub():
    with pytest.raises(PolicyError, match="group_source: 'ldap' is not one of"):
        policy(group_source="ldap")


def test_an_administrators_next_size_beats_the_policy_until_cleared(tmp_path):
    """What the hub service stores on Kubernetes: the user's next start gets the
    picked size, first among their profiles; clearing it gives the policy's back."""
    from hami_jupyter.hub import next_sizes

    store = tmp_path / "next-sizes.json"
    p = policy(next_sizes_file=str(store))
    assert p.own_size("dave").name == "small"
    next_sizes.pick(store, "dave", "large", by="root", sizes=p.size_names)
    assert p.choose("dave").name == "large"
    profiles = kubespawner_profiles(p)(spawner("dave"))
    assert [(x["slug"], x.get("default", False)) for x in profiles][0] == ("large", True)
    assert p.size_of("dave").name == "small"  # the policy itself is unchanged
    with pytest.raises(next_sizes.NextSizesError, match="no slice size named 'huge'"):
        next_sizes.pick(store, "dave", "huge", by="root", sizes=p.size_names)
    next_sizes.pick(store, "dave", None, by="root")
    assert p.choose("dave").name == "small"
    store.write_text("{not json")  # damaged: no pick counts, no spawn is refused
    assert p.choose("dave").name == "small"


def test_a_written_out_own_size_picked_in_the_form_starts_with_it():
    # alice's own size is written out in users (no size name): the form offers
    # it first, and picking it must start her with it, not fail as unknown.
    p = policy(offer={"*": ["small"]})
    html = options_form(p)(spawner("alice"))
    assert 'value="small"' in html
    own = html[html.index("<option"):html.index("</option>")]
    assert "selected" in own
    value = own.split('value="')[1].split('"')[0]
    picked = options_from_form(p)({"slice_size": [value]} if value else {})
    size = p.choose("alice", (), picked.get("slice_size"))
    assert size.limits.memory_limit == 8 << 30 and size.limits.sm_share == 30


# ---- guarantees (issue 28, item 1) ------------------------------------------------

def test_a_sizes_guarantee_is_in_its_limits_and_its_form_text():
    p = policy(sizes={"lent": {"memory": "8g", "guarantee": "2g", "sm": 25},
                      "kept": {"memory": "4g"}},
               default="kept", groups={}, users={}, offer={"*": ["lent"]})
    lent = p.choose("dave", [], "lent")
    assert (lent.limits.memory_limit, lent.limits.memory_guarantee) == (8 * GiB, 2 * GiB)
    html = options_form(p)(spawner("dave"))
    assert "lent: memory 8.0 GiB (2.0 GiB guaranteed), SM 25 % (hard)" in html
    assert "kept: memory 4.0 GiB, SM unlimited" in html  # no guarantee: nothing more said


def test_kubespawner_profiles_say_a_guarantee_does_not_apply():
    p = policy(sizes={"lent": {"memory": "8g", "guarantee": "2g"}, "kept": {"memory": "4g"}},
               default="kept", groups={}, users={}, offer={"*": ["lent"]})
    kept, lent = kubespawner_profiles(p)(spawner("dave"))
    assert lent["description"] == ("memory 8.0 GiB, SM unlimited (its guarantee does not apply on "
                                   "Kubernetes: HAMi sets the whole memory cap aside for the pod)")
    assert lent["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpumem"] == "8192"
    assert kept["description"] == "memory 4.0 GiB, SM unlimited"
