"""The hub service against a real JupyterHub: users on two simulated nodes.

One JupyterHub (hub_view_hub.py's ``HubViewHub``, built on
tests/hub/conftest.py's ``Hub``), its servers placed on two "nodes" the way
a multi-host hub would have them: each node has its own slice root and its
own simulated GPU (its own UUID), and its servers report the node's name
(``HAMI_NODE_NAME``). alice, bob and the administrator ada run on node-a,
carol on node-b. ``hami-jupyter hub-service`` runs as the hub's managed
service, registered by ``register_hub_service`` as a deployment would, with
node-a as its own node (the one whose limits files it holds).

What a user of the hub view would notice: the document lists every user's
kernels under the right node and GPU with the numbers their slices count;
an administrator's restart, shut-down, park and resume through it act on the
kernels, and stopping a server through it stops it; a
non-administrator gets 403, whether their token lacks the service's scope
or has it; a server killed under it is listed as unreachable within one
refresh; and ``AdminPanel()`` shows the hub and resizes a slice through it.
"""

import json
import os
import signal
import time

import pytest
from conftest import TAG_ENV
from hub_view_hub import (ADMIN, CONTEXT, NAME, NODES, PLACE, REFRESH, SERVER_TIMEOUT, GiB,
                          HubViewHub, MiB, allocate, kernels_of, running, slice_on)
from prometheus_client.parser import text_string_to_metric_families

from hami_jupyter import audit
from hami_jupyter.slice.file import read_snapshot

pytestmark = pytest.mark.slow

ALLOC_MIB = {"alice": 100, "bob": 200, "carol": 300}


@pytest.fixture(scope="module")
def view_hub(tmp_path_factory):
    with running(HubViewHub(tmp_path_factory.mktemp("hubview"))) as h:
        yield h


def test_the_hub_view_lists_every_users_kernels(view_hub):
    hub = view_hub
    started = time.monotonic()
    for user in PLACE:
        hub.spawn(user)
    hub.api("POST", "users/erin", expect={201})  # no server: a member of the admin group
    hub.api("POST", "groups/gpu-admins/users", {"users": ["erin"]}, expect={200})
    hub.api("POST", "groups/viewers/users", {"users": ["bob"]}, expect={200})
    for user in PLACE:
        hub.wait_ready(user)
    hub.tokens[ADMIN] = hub.user_token(ADMIN, [f"access:services!service={NAME}"])
    for user in PLACE:
        hub.kernels[user] = hub.start_kernel(user)
    for user, mib in ALLOC_MIB.items():
        out = hub.execute(user, hub.kernels[user], allocate(mib))
        assert out.error is None, f"{user}: {out.error}"

    def complete(doc):
        found = kernels_of(doc)
        return all(hub.kernels[u] in found and found[hub.kernels[u]][2]["memory_used"]
                   == ALLOC_MIB[u] * MiB + CONTEXT for u in ALLOC_MIB)

    doc = hub.wait_document(complete, what="every user's kernel with its memory")
    assert [n["node"] for n in doc["nodes"]] == ["node-a", "node-b"]
    assert {s["user"]: (s["state"], s["node"]) for s in doc["servers"]} == \
        {u: ("ready", node) for u, node in PLACE.items()}
    assert doc["unreachable"] == [] and doc["hub_error"] is None
    assert doc["viewer"] == ADMIN

    found = kernels_of(doc)
    for user, mib in ALLOC_MIB.items():
        node = PLACE[user]
        gpu, s = slice_on(doc, node, user)
        assert gpu is not None, f"no slice {user} on {node}: {doc['nodes']}"
        # The node's own GPU, named as NVML names it on that node, with its size.
        assert (gpu["uuid"], gpu["memory_total"]) == (NODES[node], 16 * GiB)
        assert gpu["name"], gpu
        assert (s["memory_used"], s["memory_limit"], s["sm_share"], s["mode"]) == \
            (mib * MiB + CONTEXT, 1 * GiB, 25, "hard")
        assert s["users"] == [user] and s["memory_parked"] == 0
        assert s["path"] == str(hub.roots[node] / f"{user}.slice")
        (k,) = s["kernels"]
        assert found[hub.kernels[user]][:2] == (node, NODES[node])
        assert (k["kernel_id"], k["user"], k["server"], k["slice"]) == \
            (hub.kernels[user], user, "", user)
        assert k["execution_state"] == "idle" and 0 <= k["idle_seconds"] < 60
        assert k["park_state"] == "running" and k["pids"]
    # ada's kernel has not touched the GPU: it is listed all the same.
    assert found[hub.kernels[ADMIN]][:2] == ("node-a", None)

    gpu_a, _ = slice_on(doc, "node-a", "alice")
    assert gpu_a["memory_used"] == (100 + 200) * MiB + 2 * CONTEXT
    assert gpu_a["memory_limits"] == 2 * GiB and gpu_a["kernels"] == 2
    users = {u["user"]: u for u in doc["users"]}
    assert (users["carol"]["memory_used"], users["carol"]["memory_limit"]) == \
        (300 * MiB + CONTEXT, 1 * GiB)
    assert users[ADMIN]["kernels"] == 1 and users[ADMIN]["memory_used"] == 0

    # The charts' history: one sample per refresh, per GPU and per user.
    later = hub.wait_document(
        lambda d: len(d["history"]["gpus"].get(f"node-a/{NODES['node-a']}", [])) >= 2,
        what="a second history sample")
    samples = later["history"]["gpus"][f"node-b/{NODES['node-b']}"]
    assert samples[-1][1:3] == [300 * MiB + CONTEXT, 16 * GiB]
    assert later["history"]["users"]["alice"][-1][1:3] == [100 * MiB + CONTEXT, 1 * GiB]

    # Prometheus: every server's /metrics through the proxy, and the per-node totals.
    status, targets = hub.view("api/targets")
    assert status == 200, targets
    by_user = {t["labels"]["user"]: t for t in targets}
    assert set(by_user) == set(PLACE)
    assert by_user["carol"]["targets"] == [f"127.0.0.1:{hub.port}"]
    assert (by_user["carol"]["labels"]["__metrics_path__"], by_user["carol"]["labels"]["node"]) == \
        ("/user/carol/metrics", "node-b")
    status, text = hub.view("metrics")
    assert status == 200
    samples = {(m.name, s.labels.get("node"), s.labels.get("gpu_uuid")): s.value
               for m in text_string_to_metric_families(text) for s in m.samples}
    assert samples[("hami_hub_gpu_memory_used_bytes", "node-a", NODES["node-a"])] == \
        (100 + 200) * MiB + 2 * CONTEXT
    assert samples[("hami_hub_gpu_memory_total_bytes", "node-b", NODES["node-b"])] == 16 * GiB
    assert time.monotonic() - started < 75


PANEL_IN_KERNEL = (
    "import json\n"
    "from hami_jupyter.admin.hub_client import connect\n"
    "client, doc, note = connect()\n"
    "print(json.dumps([client is not None, note,\n"
    "                  [n['node'] for n in doc['nodes']] if doc else None]))\n"
)


def test_a_kernel_reaches_the_service_with_its_servers_token(view_hub):
    """What AdminPanel() does in a notebook: the hub's HAMI_HUB_SERVICE_URL and
    the server's own token, which carries the service's scope for admins only."""
    hub = view_hub
    out = hub.execute(ADMIN, hub.kernels[ADMIN], PANEL_IN_KERNEL)
    assert out.error is None, out.error
    assert json.loads(out.stdout) == [True, None, ["node-a", "node-b"]]
    out = hub.execute("alice", hub.kernels["alice"], PANEL_IN_KERNEL)
    assert out.error is None, out.error
    reached, note, nodes = json.loads(out.stdout)
    assert (reached, nodes) == (False, None) and "403" in note


def test_only_administrators_may_read_and_act(view_hub):
    hub = view_hub
    alice_kernel = hub.kernels["alice"]
    plain = hub.user_token("carol")  # carol's own scopes: not the service's
    viewer = hub.user_token("bob", [f"access:services!service={NAME}"])  # bob is in "viewers"
    group_admin = hub.user_token("erin", [f"access:services!service={NAME}"])
    for token, why in ((plain, "no access to the service"), (viewer, "not an administrator")):
        assert hub.view(token=token)[0] == 403, why
        status, answer = hub.act(token, action="restart", user="alice", kernel_id=alice_kernel)
        assert status == 403, (why, answer)
    # Nothing was restarted: alice's buffer is still there.
    out = hub.execute("alice", alice_kernel, "print('bufs' in globals())")
    assert out.stdout.split() == ["True"]
    # A member of the admin group reads it like a JupyterHub admin.
    status, doc = hub.view(token=group_admin)
    assert status == 200 and doc["viewer"] == "erin"


def test_restart_and_shutdown_through_the_service(view_hub):
    hub = view_hub
    alice_kernel, bob_kernel = hub.kernels["alice"], hub.kernels["bob"]
    status, answer = hub.act(action="restart", user="alice", kernel_id=alice_kernel)
    assert status == 200 and answer["ok"], answer
    assert "restarted" in answer["message"]
    out = hub.execute("alice", alice_kernel, "print('bufs' in globals())")
    assert out.error is None and out.stdout.split() == ["False"], out
    status, answer = hub.act(action="shutdown", user="bob", kernel_id=bob_kernel)
    assert status == 200 and answer["ok"], answer
    kernels = hub.server_api("bob", "GET", "kernels", expect={200})
    assert bob_kernel not in [k["id"] for k in kernels]
    doc = hub.wait_document(lambda d: bob_kernel not in kernels_of(d)
                            and alice_kernel in kernels_of(d)
                            and kernels_of(d)[alice_kernel][1] is None,
                            what="bob's kernel gone and alice's restarted one off the GPU")
    _, s = slice_on(doc, "node-a", "bob")
    assert s is None or s["kernels"] == []
    # Park and resume carol's kernel on the other node: its GPU memory to host memory and back.
    carol_kernel = hub.kernels["carol"]
    status, answer = hub.act(action="park", user="carol", kernel_id=carol_kernel)
    assert status == 200 and answer["ok"], answer
    doc = hub.document()  # the action refreshed the document before it answered
    node, _, k = kernels_of(doc)[carol_kernel]
    assert (node, k["park_state"], k["memory_used"]) == ("node-b", "parked", 0)
    assert k["memory_parked"] >= 300 * MiB
    status, answer = hub.act(action="resume", user="carol", kernel_id=carol_kernel)
    assert status == 200 and answer["ok"], answer
    _, _, k = kernels_of(hub.document())[carol_kernel]
    assert (k["park_state"], k["memory_parked"]) == ("running", 0)
    assert k["memory_used"] == 300 * MiB + CONTEXT
    # A kernel the server does not have: the server's 404, passed on.
    status, answer = hub.act(action="interrupt", user="bob", kernel_id=bob_kernel)
    assert status == 404, answer
    status, answer = hub.act(action="restart", user="nobody", kernel_id=bob_kernel)
    assert status == 404 and "not running" in answer["message"]


def test_the_admin_panel_shows_the_hub_and_resizes_through_it(view_hub, monkeypatch, tmp_path):
    from hami_jupyter.admin import AdminPanel

    hub = view_hub
    monkeypatch.setenv("HAMI_SLICE_ROOT", str(tmp_path))  # the local view, if it came, is empty
    monkeypatch.setenv("HAMI_HUB_SERVICE_URL", hub.service_url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens[ADMIN])
    panel = AdminPanel(start=False)
    try:
        assert panel.mode == "hub" and panel.hub_note is None
        view = panel.hub
        html = view.nodes.value
        for text in ("node-a", "node-b", NODES["node-a"], NODES["node-b"], hub.kernels["carol"]):
            assert text in html, text
        assert "<svg" in view.nodes.value and "<svg" in view.users.value  # the charts
        assert set(view.kernel_rows) >= {hub.kernels[u] for u in ("alice", "carol", ADMIN)}
        assert ("node-a", "alice") in view.slice_forms and ("node-b", "carol") in view.slice_forms

        form = view.slice_forms[("node-a", "alice")]
        assert (form.memory.value, form.sm.value, form.mode.value) == ("1.0 GiB", "25", "hard")
        form.memory.value = "3g"
        answer = form.apply()
        assert answer is not None and answer["ok"], (view.message, view.errors)
        snap = read_snapshot(hub.roots["node-a"] / "alice.slice")
        assert snap.fallback_limit.memory_limit == 3 * GiB
        record = audit.read_records(hub.roots["node-a"] / "audit.log")[-1]
        assert (record["who"], record["via"], record["slice"]) == \
            ("ada (JupyterHub)", "hub-service", "alice")
        assert record["new"]["memory_limit"] == 3 * GiB
        panel.refresh()
        _, s = slice_on(view.document, "node-a", "alice")
        assert s["memory_limit"] == 3 * GiB

        # A kernel's buttons act through the service.
        assert view.kernel_rows[hub.kernels[ADMIN]].act("interrupt") is not None
        assert view.message.startswith("interrupted kernel"), view.message

        # Another node's limits files are that node's: refused, saying where.
        other = view.slice_forms[("node-b", "carol")]
        assert other.apply_button.disabled
        other.memory.value = "2g"
        assert other.apply() is None
        assert "node-b" in view.message
        assert read_snapshot(hub.roots["node-b"] / "carol.slice").fallback_limit.memory_limit == GiB
    finally:
        panel.stop()

    # Not an administrator: this host's view, and one line saying why.
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.user_token("alice"))
    local = AdminPanel(start=False)
    assert local.mode == "local" and "403" in local.hub_note
    assert "403" in local.hub_notice.value


def _processes_of(tag, user):
    """PIDs of *user*'s server and kernels of this hub (by their environment)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if f"{TAG_ENV}={tag}".encode() in env and f"JUPYTERHUB_USER={user}".encode() in env:
            pids.append(int(entry))
    return pids


def test_a_killed_server_is_unreachable_within_one_refresh(view_hub):
    hub = view_hub
    pids = _processes_of(hub.tag, "carol")
    assert pids, "carol's server was not found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    doc = hub.wait_document(
        lambda d: any(s["user"] == "carol" and s["state"] == "unreachable" for s in d["servers"]),
        timeout=REFRESH + SERVER_TIMEOUT + 5, what="carol's server listed as unreachable")
    took = time.monotonic() - killed
    # One refresh: at most an interval until it starts, plus the servers' time limit.
    assert took < REFRESH + SERVER_TIMEOUT + 2, took
    (carol,) = [s for s in doc["unreachable"] if s["user"] == "carol"]
    assert carol["error"] and carol["url"] == "/user/carol/"
    assert all(n["node"] != "node-b" for n in doc["nodes"])  # nothing of it is made up
    assert {s["user"] for s in doc["servers"]} == set(PLACE)  # never dropped
    # An administrator stops it through the service: the hub stops listing it.
    status, answer = hub.act(action="stop-server", user="carol")
    assert status == 200 and answer["ok"], answer
    hub.wait_document(lambda d: "carol" not in {s["user"] for s in d["servers"]},
                      what="carol's server gone from the hub's list")
