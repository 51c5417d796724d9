"""The profiles of ``kubespawner_profiles(policy)`` through the real KubeSpawner.

Each test builds a ``kubespawner.KubeSpawner`` for a user (a stand-in for
JupyterHub's ``User``: name, id, url, groups) and the hub (JupyterHub's own
``Hub`` object), sets the user options a spawn request would carry (a posted
form through KubeSpawner's ``options_from_form``, or a REST body as is), then
does what KubeSpawner's start does before it talks to the API server:
``load_user_options()`` (the profile list, a callable here, evaluated for the
user; the picked profile's ``kubespawner_override`` applied) and
``get_pod_manifest()``. Nothing reaches a cluster: the kubeconfig these tests
hand KubeSpawner points at a closed port on loopback, so any API call would
fail the test.

Without jupyterhub-kubespawner installed the tests are skipped, unless
``HAMI_REQUIRE_KUBESPAWNER`` is set (dev/test.sh sets it): then they fail,
so CI can never skip them silently.
"""

import asyncio
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from hami_jupyter.hub import PolicyError, SlicePolicy, kubespawner_profiles

REQUIRE_ENV = "HAMI_REQUIRE_KUBESPAWNER"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GiB = 1 << 30

# A cluster nobody serves: port 9 (discard) on loopback, nothing listens there.
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:9"}
users:
- name: nobody
  user: {token: not-a-token}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
"""

SIZES = {
    "small": {"memory": "4g", "sm": 25, "display_name": "Small: 4 GiB, a quarter of a GPU"},
    "large": {"memory": "16g", "sm": 50, "mode": "elastic"},
    "pair": {"memory": "20g", "gpus": [0, 1], "description": "two GPUs, 20 GiB each"},
    "course": {"memory": "2g", "sm": 10},
}


def make_config(**policy):
    """A hub config with the test policy (*policy* overrides its settings);
    ``c.KubeSpawner.profile_list`` set as the docs say."""
    c = Config()
    c.SlicePolicy.sizes = SIZES
    c.SlicePolicy.default = "small"
    c.SlicePolicy.groups = {"ml-course": "course", "research": "large"}
    c.SlicePolicy.users = {"alice": {"memory": "8g", "sm": 30}}
    c.SlicePolicy.offer = {"research": ["small", "pair"]}
    for key, value in policy.items():
        setattr(c.SlicePolicy, key, value)
    c.KubeSpawner.profile_list = kubespawner_profiles(SlicePolicy(config=c))
    return c


class HubUser:
    """What KubeSpawner and JupyterHub's Spawner read of a jupyterhub.user.User."""

    def __init__(self, name, groups=()):
        self.name = name
        self.id = 1
        self.groups = [SimpleNamespace(name=g) for g in groups]

    @property
    def escaped_name(self):
        return self.name

    @property
    def url(self):
        return f"/user/{self.name}/"


@pytest.fixture
def KubeSpawner(tmp_path, monkeypatch):
    """The KubeSpawner class, with a kubeconfig for a cluster that is not there."""
    try:
        from kubespawner import KubeSpawner
    except ImportError as e:
        why = (f"the KubeSpawner tests need jupyterhub-kubespawner "
               f"(`pip install -e '.[test]'`): {e}")
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{why}, and {REQUIRE_ENV} is set", pytrace=False)
        pytest.skip(why)
    from kubernetes_asyncio.config import kube_config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    # The client read $KUBECONFIG when it was imported; this is where it keeps it.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    # Not the cluster these tests might run in, either.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return KubeSpawner


def spawner_for(KubeSpawner, config, user):
    from jupyterhub.objects import Hub

    return KubeSpawner(config=config, user=user, hub=Hub(base_url="/hub/"),
                       api_token="not-a-token", oauth_client_id="not-a-client")


def start(KubeSpawner, config, user, options=None, form=None):
    """KubeSpawner's start for *user* up to the pod it would create: the
    spawn request's options (*options* as a REST body, or *form* as posted),
    ``load_user_options()``, ``get_pod_manifest()``. Returns the spawner and
    the pod as the API server would receive it (a dict)."""

    async def run():
        spawner = spawner_for(KubeSpawner, config, user)
        spawner.user_options = spawner.options_from_form(form) if form is not None else (options or {})
        await spawner.load_user_options()
        pod = await spawner.get_pod_manifest()
        return spawner, spawner.api.api_client.sanitize_for_serialization(pod)

    return asyncio.run(run())


def notebook_container(pod):
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    return container


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def hami_env(container):
    return {k: v for k, v in env_of(container).items() if k.startswith("HAMI_")}


class ProfileForm(HTMLParser):
    """The choices of KubeSpawner's profile form: (slug, checked) of each
    ``profile`` radio button; the text of each heading (a profile's
    display_name) and paragraph (its description), as a browser shows it."""

    def __init__(self, text):
        super().__init__()
        self.choices, self.headings, self.paragraphs = [], [], []
        self._text = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("name") == "profile":
            self.choices.append((attrs.get("value"), "checked" in attrs))
        # A tag inside a heading or paragraph (markup in a name) ends the text
        # that test compares.
        self._text = {"h3": self.headings, "p": self.paragraphs}.get(tag)
        if self._text is not None:
            self._text.append("")

    def handle_endtag(self, tag):
        self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text[-1] += data


def options_form(KubeSpawner, config, user):
    """The spawn page's form for *user*, as JupyterHub gets it from KubeSpawner."""

    async def run():
        return await spawner_for(KubeSpawner, config, user).get_options_form()

    return ProfileForm(asyncio.run(run()))


# ---- each profile, as the pod that HAMi and the provisioner read ------------

# (user, groups, options) -> the HAMI_* environment and the container's
# limits that pod must have, written out from the policy above.
CASES = {
    "own size of a group (no pick)": (
        "dave", ["research"], {},
        {"HAMI_MEMORY_LIMIT": str(16 * GiB), "HAMI_SM_LIMIT": "50", "HAMI_SM_MODE": "elastic",
         "HAMI_SLICE_SIZE": "large"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16384", "nvidia.com/gpucores": "50"}),
    "an offered size picked": (
        "dave", ["research"], {"profile": "small"},
        {"HAMI_MEMORY_LIMIT": str(4 * GiB), "HAMI_SM_LIMIT": "25", "HAMI_SM_MODE": "hard",
         "HAMI_SLICE_SIZE": "small"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "25"}),
    "two GPUs, no SM share": (
        "dave", ["research"], {"profile": "pair"},
        {"HAMI_MEMORY_LIMIT": str(20 * GiB), "HAMI_SM_MODE": "hard", "HAMI_SLICE_SIZE": "pair"},
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20480"}),
    "another group's own size": (
        "carol", ["ml-course"], {},
        {"HAMI_MEMORY_LIMIT": str(2 * GiB), "HAMI_SM_LIMIT": "10", "HAMI_SM_MODE": "hard",
         "HAMI_SLICE_SIZE": "course"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048", "nvidia.com/gpucores": "10"}),
    "the default, picked by name": (
        "erin", [], {"profile": "small"},
        {"HAMI_MEMORY_LIMIT": str(4 * GiB), "HAMI_SM_LIMIT": "25", "HAMI_SM_MODE": "hard",
         "HAMI_SLICE_SIZE": "small"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "25"}),
    "a user's own size, written out": (
        "alice", ["research"], {},
        {"HAMI_MEMORY_LIMIT": str(8 * GiB), "HAMI_SM_LIMIT": "30", "HAMI_SM_MODE": "hard",
         "HAMI_SLICE_SIZE": "users['alice']"},
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_profile_is_the_pod_hami_and_the_provisioner_read(KubeSpawner, case):
    name, groups, options, env, limits = CASES[case]
    _, pod = start(KubeSpawner, make_config(), HubUser(name, groups), options=options)
    container = notebook_container(pod)
    assert hami_env(container) == env
    # The device plugin picks the GPUs; a policy's `gpus` never reaches the pod.
    assert "CUDA_VISIBLE_DEVICES" not in env_of(container)
    assert container["resources"]["limits"] == limits
    # An extended resource's request must equal its limit (Kubernetes refuses
    # the pod otherwise): the profile sets both.
    assert container["resources"]["requests"] == limits


def test_gpumem_is_never_below_the_slice(KubeSpawner):
    # HAMi counts memory in whole MiB: a slice that is not a whole number of
    # MiB gets the MiB above it, so the container's share holds the slice.
    c = make_config(sizes={**SIZES, "odd": {"memory": "1000000000"}}, default="odd")
    _, pod = start(KubeSpawner, c, HubUser("erin"))
    container = notebook_container(pod)
    assert hami_env(container)["HAMI_MEMORY_LIMIT"] == "1000000000"
    assert container["resources"]["limits"]["nvidia.com/gpumem"] == "954"  # 953.67 MiB


def test_a_posted_form_picks_the_profile(KubeSpawner):
    # What JupyterHub hands options_from_form when the spawn page is posted.
    spawner, pod = start(KubeSpawner, make_config(), HubUser("dave", ["research"]),
                         form={"profile": ["pair"]})
    assert spawner.user_options == {"profile": "pair"}
    assert hami_env(notebook_container(pod))["HAMI_SLICE_SIZE"] == "pair"
    assert notebook_container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "2"


# ---- who sees what ------------------------------------------------------------

def test_a_groups_users_see_their_sizes_and_only_those(KubeSpawner):
    c = make_config()
    # research: their own size first and preselected, then what `offer` adds.
    form = options_form(KubeSpawner, c, HubUser("dave", ["research"]))
    assert form.choices == [("large", True), ("small", False), ("pair", False)]
    assert form.headings == ["GPU slice large", "Small: 4 GiB, a quarter of a GPU", "GPU slice pair"]
    # ml-course: their size alone.
    assert options_form(KubeSpawner, c, HubUser("carol", ["ml-course"])).choices == [("course", True)]
    # Nobody's group: the default alone.
    assert options_form(KubeSpawner, c, HubUser("erin")).choices == [("small", True)]
    # The list is worked out for each user when they spawn, not once for all:
    # the same spawner class and config, other users, other lists.
    assert options_form(KubeSpawner, c, HubUser("frank", ["ml-course", "research"])).choices == [
        ("course", True), ("small", False), ("pair", False)]


@pytest.mark.parametrize("user", [
    HubUser("dave", ["research"]),
    HubUser("alice", ["research"]),           # her own size is written out
    HubUser('o"neil&lt;co', ["research"]),   # so is this one's: a name HTML mangles
])
def test_every_choice_of_the_form_posts_back_to_its_size(KubeSpawner, user):
    # What a browser posts for each radio button (the parser unescapes the
    # value as a browser does) starts the size it stands for.
    c = make_config(users={"alice": {"memory": "8g", "sm": 30},
                           'o"neil&lt;co': {"memory": "6g", "sm": 30}})
    policy = SlicePolicy(config=c)
    offered = policy.offered(user.name, [g.name for g in user.groups])
    form = options_form(KubeSpawner, c, user)
    assert len(form.choices) == len(offered) == 3
    for (value, _), size in zip(form.choices, offered):
        _, pod = start(KubeSpawner, c, user, form={"profile": [value]})
        env = hami_env(notebook_container(pod))
        assert (env["HAMI_SLICE_SIZE"], env["HAMI_MEMORY_LIMIT"]) == (
            size.name, str(size.limits.memory_limit))


def test_a_written_out_size_is_picked_as_own(KubeSpawner):
    c = make_config()
    form = options_form(KubeSpawner, c, HubUser("alice", ["research"]))
    assert form.choices == [("(own)", True), ("small", False), ("pair", False)]
    _, pod = start(KubeSpawner, c, HubUser("alice", ["research"]), options={"profile": "(own)"})
    assert hami_env(notebook_container(pod))["HAMI_SLICE_SIZE"] == "users['alice']"
    # A slug like any other: dave's own size is named, he has no "(own)".
    with pytest.raises(ValueError, match=r"No such profile: \(own\)"):
        start(KubeSpawner, c, HubUser("dave", ["research"]), options={"profile": "(own)"})


@pytest.mark.parametrize("name", ["big one", "r&d", 'x"y', "-x", "größe", ""])
def test_a_size_name_that_cannot_be_a_slug_stops_the_hub(name):
    c = make_config()
    c.SlicePolicy.sizes = {**SIZES, name: {"memory": "1g"}}
    with pytest.raises(PolicyError, match=f"slice size {re.escape(repr(name))}: a KubeSpawner"):
        kubespawner_profiles(SlicePolicy(config=c))


@pytest.mark.parametrize("pick", ["large", "pair", "huge"])
@pytest.mark.parametrize("how", ["rest", "form"])
def test_a_profile_not_offered_is_refused(KubeSpawner, pick, how):
    c = make_config()
    request = {"options": {"profile": pick}} if how == "rest" else {"form": {"profile": [pick]}}
    with pytest.raises(ValueError, match=f"No such profile: {pick}. Options include: small$"):
        start(KubeSpawner, c, HubUser("erin"), **request)
    with pytest.raises(ValueError, match=f"No such profile: {pick}. Options include: course$"):
        start(KubeSpawner, c, HubUser("carol", ["ml-course"]), **request)


def test_a_user_with_no_size_gets_no_profile(KubeSpawner):
    # default None and no group: an empty profile list. The pod gets what the
    # deployment gives every pod, nothing of HAMi's; naming a size is refused.
    c = make_config(default=None)
    assert options_form(KubeSpawner, c, HubUser("erin")).choices == []
    _, pod = start(KubeSpawner, c, HubUser("erin"))
    container = notebook_container(pod)
    assert hami_env(container) == {}
    assert not any(k.startswith("nvidia.com/") for k in container["resources"].get("limits") or {})
    with pytest.raises(ValueError, match="No such profile: large"):
        start(KubeSpawner, c, HubUser("erin"), options={"profile": "large"})


def test_names_and_descriptions_show_as_written(KubeSpawner):
    # KubeSpawner puts display_name and description into its form as HTML.
    c = make_config(sizes={**SIZES, "course": {
        "memory": "2g", "display_name": "Course <GPU> & tutors",
        "description": "for <b>ml-course</b> only"}})
    form = options_form(KubeSpawner, c, HubUser("carol", ["ml-course"]))
    assert form.headings == ["Course <GPU> & tutors"]
    assert form.paragraphs == ["for <b>ml-course</b> only"]


# ---- with the deployment's own settings ---------------------------------------

def test_profiles_add_to_the_deployments_environment_and_resources(KubeSpawner):
    c = make_config()
    c.KubeSpawner.environment = {"JUPYTER_DEFAULT_PROVISIONER_NAME": "hami-provisioner",
                                 "HAMI_SLICE_ROOT": "/tmp/hami-jupyter"}
    c.KubeSpawner.mem_limit = "32G"
    _, pod = start(KubeSpawner, c, HubUser("dave", ["research"]), options={"profile": "small"})
    container = notebook_container(pod)
    env = env_of(container)
    assert env["JUPYTER_DEFAULT_PROVISIONER_NAME"] == "hami-provisioner"
    assert env["HAMI_SLICE_ROOT"] == "/tmp/hami-jupyter"
    assert env["HAMI_MEMORY_LIMIT"] == str(4 * GiB)
    limits = container["resources"]["limits"]
    assert limits["memory"] == 32 * GiB  # KubeSpawner writes bytes
    assert limits["nvidia.com/gpumem"] == "4096"


def test_a_deployments_gpu_request_follows_the_profile(KubeSpawner):
    # Zero to JupyterHub's singleuser.extraResource.guarantees: a GPU request
    # for every pod. The profile's own request replaces it, so request and
    # limit agree, as Kubernetes requires of extended resources.
    c = make_config()
    c.KubeSpawner.extra_resource_guarantees = {"nvidia.com/gpu": "1"}
    c.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}
    _, pod = start(KubeSpawner, c, HubUser("dave", ["research"]), options={"profile": "pair"})
    resources = notebook_container(pod)["resources"]
    assert resources["limits"] == resources["requests"] == {
        "nvidia.com/gpu": "2", "nvidia.com/gpumem": "20480"}


def test_without_hami_resources_only_the_environment(KubeSpawner):
    c = make_config()
    c.KubeSpawner.profile_list = kubespawner_profiles(SlicePolicy(config=c), hami_resources=False)
    _, pod = start(KubeSpawner, c, HubUser("dave", ["research"]), options={"profile": "pair"})
    container = notebook_container(pod)
    assert hami_env(container)["HAMI_SLICE_SIZE"] == "pair"
    assert not any(k.startswith("nvidia.com/") for k in container["resources"].get("limits") or {})


# ---- the Zero to JupyterHub example ---------------------------------------------

def test_the_z2jh_example_through_kubespawner(KubeSpawner):
    yaml = pytest.importorskip("yaml")
    values = yaml.safe_load((EXAMPLES / "z2jh-values.yaml").read_text())
    # What the chart's jupyterhub_config.py makes of these values (the parts
    # the example sets), then hub.extraConfig, run last as the chart runs it.
    c = Config()
    c.KubeSpawner.environment = dict(values["singleuser"]["extraEnv"])
    c.KubeSpawner.default_url = values["singleuser"]["defaultUrl"]
    image = values["singleuser"]["image"]
    c.KubeSpawner.image = f"{image['name']}:{image['tag']}"
    c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
    for code in values["hub"]["extraConfig"].values():
        exec(code, {"c": c})
    _, pod = start(KubeSpawner, c, HubUser("dave", ["research"]), options={"profile": "large"})
    container = notebook_container(pod)
    env = env_of(container)
    assert env["JUPYTER_DEFAULT_PROVISIONER_NAME"] == "hami-provisioner"
    assert hami_env(container) == {
        "HAMI_SLICE_ROOT": "/tmp/hami-jupyter", "HAMI_MEMORY_LIMIT": str(24 * GiB),
        "HAMI_SM_LIMIT": "50", "HAMI_SM_MODE": "hard", "HAMI_SLICE_SIZE": "large",
        # The hub view: the node from the downward API, the service's address.
        "HAMI_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "HAMI_HUB_SERVICE_URL": "http://proxy-public/services/hami-hub/"}
    assert container["resources"]["limits"] == container["resources"]["requests"] == {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "24576", "nvidia.com/gpucores": "50"}
    assert "--HamiParking.enabled=True" in container["args"]
    # Not in research: the small size alone; large is refused.
    assert options_form(KubeSpawner, c, HubUser("erin")).choices == [("small", True)]
    with pytest.raises(ValueError, match="No such profile: large"):
        start(KubeSpawner, c, HubUser("erin"), options={"profile": "large"})
