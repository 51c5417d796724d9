"""SlicePolicy: who gets which slice; the spawner form and KubeSpawner profiles."""

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from hami_jupyter.hub import PolicyError, SlicePolicy, kubespawner_profiles
from hami_jupyter.hub.spawner import options_form, options_from_form

GiB = 1 << 30


def policy(**settings):
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
    return SlicePolicy(config=c)


def spawner(name, groups=(), options=None):
    return SimpleNamespace(user=SimpleNamespace(name=name, groups=[SimpleNamespace(name=g) for g in groups]),
                           user_options=options or {}, environment={}, log=SimpleNamespace(info=print))


def test_user_over_group_over_default():
    p = policy()
    alice = p.size_of("alice", ["researchers"])
    assert (alice.memory, alice.sm) == (8 * GiB, 30)  # her own entry beats her group
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
