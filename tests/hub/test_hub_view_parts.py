"""The hub view's parts without a hub: the document from servers' answers, the
history, Prometheus's targets, the actions' answers on Kubernetes, the
service's registration in a config, and the charts."""

import asyncio
import html
import re
import logging
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from hami_jupyter.admin.sparkline import sparkline
from hami_jupyter.hub import SlicePolicy, next_sizes, register_hub_service
from hami_jupyter.hubview import document as doc
from hami_jupyter.hubview.actions import ActionError, Actions
from hami_jupyter.hubview.app import HamiHubService
from hami_jupyter.hubview.history import History
from hami_jupyter.hubview.metrics import targets

MiB, GiB = 1 << 20, 1 << 30
GPU = "GPU-aaaaaaaa-0000-4000-8000-00000000000a"


def kernel(kid, user, mib=0, parked=0):
    used = {GPU: mib * MiB} if mib else {}
    return {"kernel_id": kid, "user": user, "kernelspec": "hami-python3", "pid": 1,
            "memory_used": mib * MiB, "memory_parked": parked, "sm_util": 0,
            "park_state": "parked" if parked else "running",
            "processes": [{"pid": 10, "memory_used": used, "sm_util": {},
                           "parked": {GPU: parked} if parked else {}}] if (mib or parked) else []}


def status(name, kernels, used=0, limit=GiB):
    return {"slice": name, "path": f"/run/hami-jupyter/{name}.slice",
            "default_limit": {"memory_limit": limit, "sm_share": 25, "mode": "hard"},
            "gpus": [{"index": 0, "uuid": GPU, "memory_total": 16 * GiB, "memory_used": used,
                      "memory_limit": limit, "memory_parked": 0, "memory_real": None,
                      "guard_state": None, "sm_share": 25, "sm_util": 3, "mode": "hard",
                      "memory_level": "ok", "limit_is_fallback": True}],
            "kernels": kernels}


def answer(node, slices, own, activity=None):
    return {"node": node, "slices": slices, "kernels": {k: s for k, s in own.items()},
            "host_gpus": [{"index": 0, "uuid": GPU, "name": "Simulated GPU",
                           "memory_total": 16 * GiB, "memory_used": GiB, "utilization": 5}],
            "host_gpus_error": None, "kernel_activity": activity or {}}


def test_one_users_two_servers_on_one_node_share_a_slice_listed_once():
    k1, k2 = kernel("k1", "alice", 100), kernel("k2", "alice", 50)
    shared = status("alice", [k1, k2], used=150 * MiB)
    readings = [
        doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                    answer("n1", [shared], {"k1": "alice"},
                           {"k1": {"execution_state": "busy", "idle_seconds": 0.0}})),
        doc.Reading(doc.ServerRef("alice", "gpu2", "/user/alice/gpu2/"),
                    answer("n1", [shared], {"k2": "alice"},
                           {"k2": {"execution_state": "idle", "idle_seconds": 42.0}})),
    ]
    d = doc.build(readings, 1000.0)
    (node,) = d["nodes"]
    (gpu,) = node["gpus"]
    assert (gpu["name"], gpu["memory_total"], gpu["memory_used"]) == ("Simulated GPU", 16 * GiB,
                                                                      150 * MiB)
    (s,) = gpu["slices"]  # once, though both servers reported it
    owners = {k["kernel_id"]: (k["server"], k["execution_state"], k["idle_seconds"])
              for k in s["kernels"]}
    assert owners == {"k1": ("", "busy", 0.0), "k2": ("gpu2", "idle", 42.0)}
    (alice,) = d["users"]
    assert (alice["servers"], alice["kernels"], alice["memory_used"], alice["memory_limit"]) == \
        (["", "gpu2"], 2, 150 * MiB, GiB)


def test_servers_that_do_not_answer_stay_listed_and_kernels_off_the_gpu_too():
    idle = kernel("k3", "bob")  # started, never touched the GPU
    readings = [
        doc.Reading(doc.ServerRef("bob", "", "/user/bob/"),
                    answer("n2", [status("bob", [idle]),
                                  {"slice": "broken", "path": "/x/broken.slice",
                                   "error": "hami: damaged"}],
                           {"k3": "bob", "k4": None})),
        doc.Reading(doc.ServerRef("carol", "", "/user/carol/"), error="HTTP 503 Service Unavailable"),
        doc.Reading(doc.ServerRef("dave", "", "/user/dave/", ready=False, pending="spawn"),
                    error="the server is starting"),
    ]
    d = doc.build(readings, 1000.0)
    states = {s["user"]: (s["state"], s["error"]) for s in d["servers"]}
    assert states == {"bob": ("ready", None), "carol": ("unreachable", "HTTP 503 Service Unavailable"),
                      "dave": ("pending", "the server is starting")}
    assert [s["user"] for s in d["unreachable"]] == ["carol"]
    (node,) = d["nodes"]
    assert [k["kernel_id"] for k in node["kernels_without_gpu"]] == ["k3", "k4"]
    assert node["kernels_without_gpu"][1]["slice"] is None  # not started in a slice
    assert node["errors"][0]["error"] == "hami: damaged"


def test_history_keeps_the_last_minutes_only():
    h = History(seconds=60)
    readings = [doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                            answer("n1", [status("alice", [kernel("k1", "alice", 10)],
                                                 used=10 * MiB)], {"k1": "alice"}))]
    for t in (0, 30, 61, 90):
        h.add(doc.build(readings, float(t)))
    samples = h.as_dict()["gpus"][f"n1/{GPU}"]
    assert [s[0] for s in samples] == [30, 61, 90]
    assert samples[-1][1:3] == [10 * MiB, 16 * GiB]
    assert h.as_dict()["users"]["alice"][-1][1:3] == [10 * MiB, GiB]


def test_prometheus_targets_go_through_the_proxy_or_a_subdomain():
    d = {"servers": [{"user": "a", "server": "", "url": "/hub-base/user/a/", "node": "n1"},
                     {"user": "b", "server": "x", "url": "https://b.hub.example.org/user/b/x/",
                      "node": None}]}
    a, b = targets(d, "http://127.0.0.1:8000")
    assert a == {"targets": ["127.0.0.1:8000"],
                 "labels": {"__scheme__": "http", "__metrics_path__": "/hub-base/user/a/metrics",
                            "user": "a", "server": "", "node": "n1"}}
    assert (b["targets"], b["labels"]["__scheme__"], b["labels"]["__metrics_path__"]) == \
        (["b.hub.example.org"], "https", "/user/b/x/metrics")


class FakeService(SimpleNamespace):
    async def refresh_after(self, what):
        self.refreshed.append(what)


def fake_service(tmp_path, **kw):
    d = doc.build([doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                               answer("n1", [status("alice", [kernel("k1", "alice", 10)])],
                                      {"k1": "alice"}))], 0.0)
    settings = dict(document=d, kubernetes=False, node="n1", slice_root=str(tmp_path),
                    sizes=["small", "large"], next_sizes_file=str(tmp_path / "next.json"),
                    log=logging.getLogger("test"), refreshed=[], allow_stop_server=True,
                    audit_path=lambda: tmp_path / "audit.log",
                    server_ref=lambda user, name="": None)
    return FakeService(**{**settings, **kw})


def run(service, **request):
    return asyncio.run(Actions(service).run(request, "ada"))


def test_on_kubernetes_a_resize_says_next_start_and_the_next_size_is_stored(tmp_path):
    service = fake_service(tmp_path, kubernetes=True)
    with pytest.raises(ActionError) as refused:
        run(service, action="resize", node="n1", slice="alice", memory="4g")
    e = refused.value
    assert e.status == 409 and "next server start" in str(e)
    assert e.extra["applies"] == "next-start"
    assert e.extra["next_size"] == {"user": "alice", "sizes": ["small", "large"], "available": True}
    answer_ = run(service, action="next-size", user="alice", size="large")
    assert answer_["ok"] and "'large'" in answer_["message"]
    assert next_sizes.read(tmp_path / "next.json")["alice"]["by"] == "ada"
    with pytest.raises(ActionError, match="no slice size named 'huge'"):
        run(service, action="next-size", user="alice", size="huge")
    run(service, action="next-size", user="alice", size=None)
    assert next_sizes.read(tmp_path / "next.json") == {}


def test_actions_refuse_what_the_hub_does_not_list(tmp_path):
    service = fake_service(tmp_path)
    with pytest.raises(ActionError) as e:
        run(service, action="restart", user="alice", kernel_id="k1")
    assert e.value.status == 404 and "not running" in str(e.value)
    with pytest.raises(ActionError) as e:
        run(service, action="resize", node="n2", slice="alice", memory="4g")
    assert e.value.status == 404
    with pytest.raises(ActionError) as e:
        run(service, action="format-disk")
    assert e.value.status == 400
    service.allow_stop_server = False
    with pytest.raises(ActionError) as e:
        run(service, action="stop-server", user="alice")
    assert e.value.status == 403


def parked_record(pid, ticks=None, user="alice"):
    return {"pid": pid, "user": user, "command": "python train.py", "uuid": GPU,
            "process_bytes": 3 * GiB, "real_bytes": 4 * GiB, "unix": 900.0,
            "why": "held 3.0 GiB past its slice's cap without the preload library",
            **({"start_ticks": ticks} if ticks is not None else {})}


def with_parked(slice_status, *records):
    return {**slice_status, "guard": {"running": True, "parked": list(records)}}


def test_a_nodes_processes_parked_by_the_guard_are_listed_once():
    """Issue 27, item 2: the hub view lists what the guard parked, per node."""
    shared = with_parked(status("alice", [kernel("k1", "alice", 10)]), parked_record(4242))
    other = with_parked(status("bob", []), parked_record(5151, user="bob"))
    d = doc.build([
        doc.Reading(doc.ServerRef("alice", "", "/user/alice/"), answer("n1", [shared], {"k1": "alice"})),
        doc.Reading(doc.ServerRef("alice", "b", "/user/alice/b/"), answer("n1", [shared], {})),
        doc.Reading(doc.ServerRef("bob", "", "/user/bob/"), answer("n2", [other], {})),
    ], 1000.0)
    by_node = {n["node"]: [(p["pid"], p["slice"], p["user"]) for p in n["parked"]] for n in d["nodes"]}
    assert by_node == {"n1": [(4242, "alice", "alice")], "n2": [(5151, "bob", "bob")]}


def test_ending_a_parked_process_goes_through_the_admin_service_as_the_hub_admin(tmp_path):
    """The hub view's End: the node's root admin service ends it and audits
    it under the JupyterHub administrator's name."""
    import os
    import subprocess

    from fake_guard import write_guard

    from hami_jupyter import audit
    from hami_jupyter.admin.service import AdminService
    from hami_jupyter.processes import start_ticks
    from hami_jupyter.slice.guard_report import write_report

    if os.geteuid() != 0:
        pytest.skip("the admin service acts on behalf of a hub administrator for root only")
    root = tmp_path / "slices"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        record = parked_record(sleeper.pid, start_ticks(sleeper.pid))
        report = write_guard(root, {}, action="park")
        write_report({**report, "parked": [{**record, "slice": "alice", "action": "park"}]}, root)
        d = doc.build([doc.Reading(doc.ServerRef("alice", "", "/user/alice/"), answer(
            "n1", [with_parked(status("alice", []), record)], {}))], 0.0)
        service = fake_service(tmp_path, document=d, slice_root=str(root))
        with pytest.raises(ActionError) as e:  # no admin service yet
            run(service, action="guard-end", node="n1", pid=sleeper.pid)
        assert e.value.status == 503 and "admin-service" in str(e.value)
        admin = AdminService(root).start()
        try:
            with pytest.raises(ActionError) as e:
                run(service, action="guard-end", node="n2", pid=sleeper.pid)
            assert e.value.status == 404
            done = run(service, action="guard-end", node="n1", pid=sleeper.pid)
        finally:
            admin.close()
        assert done["ok"] and f"process {sleeper.pid} (alice) ended" in done["message"], done
        assert sleeper.wait(30) != 0
        assert service.refreshed == ["guard-end"]
        last = audit.read_records(audit.default_path(root))[-1]
        assert (last["action"], last["who"], last["pid"]) == ("guard-end", "ada (JupyterHub)", sleeper.pid)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_registering_the_service_grants_what_it_needs_and_no_more():
    c = Config()
    c.JupyterHub.port = 8123
    c.JupyterHub.load_roles = [{"name": "mine", "scopes": ["read:hub"], "users": ["x"]}]
    c.Spawner.environment = {"PATH": "/usr/bin"}
    c.SlicePolicy.sizes = {"small": {"memory": "1g"}}
    policy = SlicePolicy(config=c)
    entry = register_hub_service(c, policy, admin_groups=["gpu-admins"], allow_stop_server=False)
    assert entry["url"] == "http://127.0.0.1:10101"
    assert "--proxy-url=http://127.0.0.1:8123" in entry["command"]
    assert f"--slice-root={policy.slice_root}" in entry["command"]
    assert "--no-stop-server" in entry["command"]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["mine"]["scopes"] == ["read:hub"]  # the config's own roles stay
    assert sorted(roles["hami-hub"]["scopes"]) == sorted(
        ["list:users", "read:servers", "read:users:activity", "access:servers"])
    assert roles["hami-hub-admins"] == {
        "name": "hami-hub-admins", "groups": ["gpu-admins"],
        "scopes": ["access:services!service=hami-hub"],
        "description": roles["hami-hub-admins"]["description"]}
    assert c.Spawner.server_token_scopes == [
        "users:activity!user", "access:servers!server", "access:services!service=hami-hub"]
    assert c.Spawner.environment == {"PATH": "/usr/bin",
                                     "HAMI_HUB_SERVICE_URL": "http://127.0.0.1:8123/services/hami-hub/"}
    # The service's own parser takes the command as written.
    app = HamiHubService()
    app.initialize(entry["command"][2:])
    assert (app.proxy_url, app.admin_groups, app.allow_stop_server, app.sizes) == \
        ("http://127.0.0.1:8123", ["gpu-admins"], False, ["small"])


def test_what_registering_adds_outlives_a_later_plain_assignment(tmp_path):
    """Issue 35, item 14: a jupyterhub_config.py that sets its own roles, services,
    server scopes or server environment below register_hub_service (a plain
    assignment, as an administrator adding a Prometheus role writes it) keeps the
    service's role, entry, scope and URL; the administrator's own entries stay
    and come first. Loaded the way JupyterHub loads its config file."""
    from traitlets.config.loader import PyFileConfigLoader

    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "from hami_jupyter.hub import SlicePolicy, register_hub_service\n"
        "c = get_config()  # noqa: F821\n"
        "c.SlicePolicy.sizes = {'small': {'memory': '1g'}}\n"
        "register_hub_service(c, SlicePolicy(config=c), admin_groups=['gpu-admins'])\n"
        "c.JupyterHub.load_roles = [{'name': 'prometheus', 'scopes': ['read:metrics'],\n"
        "                            'services': ['prometheus']}]\n"
        "c.JupyterHub.services = [{'name': 'prometheus', 'api_token': 'x'}]\n"
        "c.Spawner.server_token_scopes = ['access:servers!server']\n"
        "c.Spawner.environment = {'PATH': '/usr/bin'}\n")
    c = PyFileConfigLoader(str(config)).load_config()
    roles = [r["name"] for r in c.JupyterHub.load_roles]
    assert roles == ["prometheus", "hami-hub", "hami-hub-admins"], roles
    assert [s["name"] for s in c.JupyterHub.services] == ["prometheus", "hami-hub"]
    assert c.Spawner.server_token_scopes == ["access:servers!server",
                                             "access:services!service=hami-hub"]
    assert c.Spawner.environment == {"PATH": "/usr/bin",
                                     "HAMI_HUB_SERVICE_URL": "http://127.0.0.1:8000/services/hami-hub/"}
    # An administrator's role of the same name is theirs: not doubled, not replaced.
    c.JupyterHub.load_roles = [{"name": "hami-hub", "scopes": ["list:users"], "services": ["hami-hub"]}]
    assert [(r["name"], r["scopes"]) for r in c.JupyterHub.load_roles][0] == ("hami-hub", ["list:users"])
    assert [r["name"] for r in c.JupyterHub.load_roles] == ["hami-hub", "hami-hub-admins"]


def test_the_service_admits_hub_admins_and_the_admin_groups():
    app = HamiHubService()
    app.initialize(["--HamiHubService.admin_groups=gpu-admins"])
    assert app.is_admin({"name": "a", "admin": True, "groups": []})
    assert app.is_admin({"name": "b", "admin": False, "groups": ["x", "gpu-admins"]})
    assert not app.is_admin({"name": "c", "admin": False, "groups": ["x"]})


def test_a_chart_draws_use_and_the_cap_as_a_line():
    svg = sparkline([[0, 1 * GiB, 4 * GiB, 0], [60, 3 * GiB, 4 * GiB, 0]], label="alice")
    assert svg.startswith("<svg") and 'class="hami-spark-cap"' in svg
    assert "alice: 3.0 GiB of 4.0 GiB, last 1 min" in svg
    assert 'class="hami-spark-cap"' not in sparkline([[0, GiB, 0, 0]])  # no cap: no line
    assert sparkline([]) == ""


def test_the_command_refuses_to_start_without_a_token(tmp_path):
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "hami_jupyter", "hub-service", "--refresh=2"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "no API token" in run.stderr and "JUPYTERHUB_API_TOKEN" in run.stderr


def test_a_servers_gpus_are_read_again_only_every_few_seconds(monkeypatch):
    import threading

    from hami_jupyter.server import host

    calls, release = [], threading.Event()

    def read():
        calls.append(1)
        if len(calls) > 1:
            release.wait(30)  # a slow read (a child process, under the preload library)
        return [], f"read {len(calls)}"

    monkeypatch.setattr(host, "read_gpus", read)
    monkeypatch.setattr(host, "_gpus_cache", {"read": None, "answer": None})
    assert host.host_gpus(now=100.0) == ([], "read 1")
    host.host_gpus(now=100.0 + host.GPUS_FRESH_S / 2)
    assert len(calls) == 1  # the hub service's next poll: from the cache
    # Stale: answered from the cache at once, read anew in the background.
    assert host.host_gpus(now=100.0 + host.GPUS_FRESH_S) == ([], "read 1")
    assert host.host_gpus(now=100.0 + host.GPUS_FRESH_S + 1) == ([], "read 1")  # one read at a time
    release.set()
    for t in [t for t in threading.enumerate() if t.name == "hami-host-gpus"]:
        t.join(30)
    assert len(calls) == 2
    assert host.host_gpus(now=100.0 + host.GPUS_FRESH_S + 2) == ([], "read 2")


class FakeClient:
    """The hub service as the hub view's forms see it: its document, and the
    actions asked of it, answered "ok"."""

    def __init__(self, document):
        self.doc, self.acts = document, []

    def document(self):
        return self.doc

    def act(self, **request):
        self.acts.append(request)
        return {"ok": True, "message": f"done: {request['action']}"}


def test_the_hub_views_slice_form_is_the_local_panels_form():
    """One form module for both views (issue 26, item 6): the same default
    sentinel, entries named alike, and a malformed value refused in the local
    panel's words before anything goes to the service; Apply sends only the
    edited field, for the chosen entry."""
    from hami_jupyter.admin import panel, slice_form
    from hami_jupyter.admin.hub_view import HubSliceForm, HubView

    readings = [doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                            answer("n1", [status("alice", [kernel("k1", "alice", 100)],
                                                 used=164 * MiB)], {"k1": "alice"}))]
    document = {**doc.build(readings, 1000.0), "service": {"node": "n1", "refresh_seconds": 5}}
    client = FakeClient(document)
    view = HubView(client, document)
    form = view.slice_forms[("n1", "alice")]
    assert isinstance(form, HubSliceForm) and isinstance(form, slice_form.LimitsForm)
    assert issubclass(panel.SliceForm, slice_form.LimitsForm)
    assert form.device.value == slice_form.DEFAULT and form.device_ref() is None
    assert [label for label, _ in form.device.options] == ["all GPUs", "GPU 0 (as all GPUs)"]
    assert (form.memory.value, form.sm.value, form.mode.value) == ("1.0 GiB", "25", "hard")

    form.memory.value = "4x"
    assert "cannot apply" in form.message.value and "is not a size" in form.message.value
    assert form.apply() is None and client.acts == []  # refused here, never sent
    assert form.errors == slice_form.value_problems({"memory": "4x"})
    assert any("is not a size" in e for e in view.errors), view.errors

    form.memory.value = "3g"
    assert "on Apply" in form.message.value
    assert form.apply() is not None
    assert client.acts[-1] == {"action": "resize", "node": "n1", "slice": "alice", "device": None,
                               "overcommit": False, "memory": "3g"}

    form.device.value = GPU  # one GPU's entry: only the edited SM share goes
    form.sm.value = "30"
    assert form.apply() is not None
    assert client.acts[-1]["device"] == GPU and client.acts[-1]["sm"] == "30"
    assert "memory" not in client.acts[-1] and "mode" not in client.acts[-1]


def test_the_hub_view_shows_parked_processes_with_resume_and_end():
    """Issue 27, item 2: the administrator's AdminPanel() (the hub view) lists
    what the guard parked, per node, and its buttons ask the service."""
    from hami_jupyter.admin.hub_view import HubView

    readings = [doc.Reading(doc.ServerRef("alice", "", "/user/alice/"), answer(
        "n1", [with_parked(status("alice", []), parked_record(4242))], {}))]
    document = {**doc.build(readings, 1000.0), "service": {"node": "n1", "refresh_seconds": 5}}
    client = FakeClient(document)
    view = HubView(client, document)
    row = view.parked_rows[("n1", 4242)]
    text = row.label.value
    assert "pid 4242" in text and "python train.py" in text and "alice" in text and "n1" in text
    assert "3.0 GiB safe in host memory" in text and "without the preload library" in text
    assert row.act("resume") is not None
    assert client.acts[-1] == {"action": "guard-resume", "node": "n1", "pid": 4242}
    row.act("end")
    assert client.acts[-1] == {"action": "guard-end", "node": "n1", "pid": 4242}
    # Once the guard no longer lists it, the row goes.
    view.show_document({**doc.build([doc.Reading(doc.ServerRef("alice", "", "/user/alice/"), answer(
        "n1", [status("alice", [])], {}))], 1001.0), "service": {"node": "n1"}})
    assert view.parked_rows == {} and view.parked_box.layout.display == "none"


# ---- guarantees, sums per GPU, who waits (issue 28, items 1 and 4) ----------------------

def waiting_kernel(kid, user, mib, wait_gib, since):
    k = kernel(kid, user, mib)
    k["processes"][0].update(pid=77, room_wait={"uuid": GPU, "bytes": wait_gib * GiB,
                                                "since_unix": since})
    k["room_wait"] = k["processes"][0]["room_wait"]
    return k


def lending_document(service=None):
    """alice: 8 GiB cap, 2 GiB guaranteed, one kernel parked to make room; bob:
    4 GiB cap from a server that sends no guarantee (its cap), one process
    waiting for 3 GiB since 900.0."""
    alice = status("alice", [kernel("k1", "alice", 100)], used=100 * MiB, limit=8 * GiB)
    alice["gpus"][0]["memory_guarantee"] = 2 * GiB
    alice["kernels"][0].update(park_state="parked", park_reason="room", memory_parked=GiB)
    bob = status("bob", [waiting_kernel("k2", "bob", 50, 3, 900.0)], used=50 * MiB, limit=4 * GiB)
    readings = [doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                            answer("n1", [alice], {"k1": "alice"})),
                doc.Reading(doc.ServerRef("bob", "", "/user/bob/"),
                            answer("n1", [bob], {"k2": "bob"}))]
    return {**doc.build(readings, 1000.0), "service": service or {"node": "n1"}}


def test_each_gpu_sums_guarantees_and_caps_and_lists_who_waits():
    from prometheus_client.core import Metric  # noqa: F401 (prometheus_client is there)

    from hami_jupyter.hubview import metrics

    (gpu,) = lending_document()["nodes"][0]["gpus"]
    assert (gpu["memory_guarantees"], gpu["memory_limits"]) == (2 * GiB + 4 * GiB, 12 * GiB)
    assert (gpu["memory_used"], gpu["nvml_memory_used"]) == (150 * MiB, GiB)
    assert gpu["waiting"] == [{"slice": "bob", "user": "bob", "server": "", "kernel_id": "k2",
                               "notebook": None, "pid": 77, "bytes": 3 * GiB, "since_unix": 900.0}]
    assert gpu["room_wait_bytes"] == 3 * GiB
    samples = {f.name: [s.value for s in f.samples]
               for f in metrics._families(lending_document())}
    assert samples["hami_hub_gpu_memory_guarantee_bytes"] == [6 * GiB]
    assert samples["hami_hub_gpu_room_waiting_processes"] == [1]
    assert samples["hami_hub_gpu_room_waiting_bytes"] == [3 * GiB]


def test_the_hub_view_shows_guarantees_parked_kernels_and_waiters():
    import time

    from hami_jupyter.admin.hub_view import HubView

    document = lending_document({"node": "n1", "memory_oversubscription": 4.0})
    view = HubView(FakeClient(document), document)
    text = view.nodes.value
    shown = html.unescape(re.sub(r"<[^>]+>", "", text))  # what a reader sees
    assert "caps 12.0 GiB (up to 64.0 GiB, 4 x the GPU, at a start) · guaranteed 6.0 GiB · " \
           "1.0 GiB on the GPU (NVML)" in shown
    clock = time.strftime("%H:%M", time.localtime(900.0))
    assert "Waiting for room on this GPU: bob (" in text
    assert f"waiting for 3.0 GiB of GPU room since {clock}" in text
    from hami_jupyter.slice.status_html import MUTED_COLOUR

    assert f"8.0 GiB <span style='color: {MUTED_COLOUR}'>(2.0 GiB guaranteed)" in text
    assert "parked to make room for another user&#x27;s work" in text

    form = view.slice_forms[("n1", "alice")]
    assert form.guarantee.value == "whole cap"  # the default entry: none of its own sent
    form.device.value = GPU
    assert (form.memory.value, form.guarantee.value) == ("8.0 GiB", "2.0 GiB")
    form.guarantee.value = "3g"
    assert form.apply() is not None
    assert view.client.acts[-1] == {"action": "resize", "node": "n1", "slice": "alice",
                                    "device": GPU, "overcommit": False, "guarantee": "3g"}
    assert view.slice_forms[("n1", "bob")].guarantee.value == "whole cap"


def test_the_service_applies_a_guarantee_to_a_slice_of_its_node(tmp_path):
    from hami_jupyter import audit
    from hami_jupyter.slice.create import create_limits_file, create_slice
    from hami_jupyter.slice.file import read_snapshot
    from hami_jupyter.slice.limits import Limits

    path = tmp_path / "alice.slice"
    create_slice(path, "alice", Limits(8 * GiB))
    create_limits_file(path, Limits(8 * GiB))
    real = {**status("alice", [kernel("k1", "alice", 10)], limit=8 * GiB), "path": str(path)}
    d = doc.build([doc.Reading(doc.ServerRef("alice", "", "/user/alice/"),
                               answer("n1", [real], {"k1": "alice"}))], 0.0)
    answer_ = run(fake_service(tmp_path, document=d), action="resize", node="n1", slice="alice",
                  guarantee="2g")
    assert answer_["ok"] and "(2.0 GiB guaranteed)" in answer_["message"]
    assert read_snapshot(path).fallback_limit.memory_guarantee == 2 * GiB
    [record] = audit.read_records(tmp_path / "audit.log")
    assert record["who"] == "ada (JupyterHub)" and record["new"]["memory_guarantee"] == 2 * GiB


def test_registering_the_service_tells_it_the_policys_oversubscription():
    for settings, expected in (({"memory_oversubscription": 4.0}, "4.0"),
                               ({"sizes": {"s": {"memory": "8g", "guarantee": "2g"}}}, "1.0"),
                               ({}, None)):
        c = Config()
        c.SlicePolicy.sizes = settings.pop("sizes", {"s": {"memory": "8g"}})
        for k, v in settings.items():
            setattr(c.SlicePolicy, k, v)
        command = register_hub_service(c, SlicePolicy(config=c))["command"]
        given = [a.split("=", 1)[1] for a in command
                 if a.startswith("--HamiHubService.memory_oversubscription=")]
        assert given == ([expected] if expected else [])


# ---- issue 41: kernels named by their notebooks, lines that wrap ----------------------------------

def test_the_hub_view_names_kernels_by_their_notebooks():
    """Item 1: the hub view listed kernels by 8-character ids. A kernel whose server
    names its notebook is listed by it (the id on hover), in its slice's line, in who
    waits for room, and in the kernels' rows; one without a notebook by its short id."""
    from hami_jupyter.admin.hub_view import HubView

    alice = status("alice", [kernel("k1-alice-0000", "alice", 100)], used=100 * MiB, limit=8 * GiB)
    alice["kernels"][0]["notebook"] = "work/analysis.ipynb"
    bob = status("bob", [waiting_kernel("k2-bob-000000", "bob", 50, 3, 900.0)], used=50 * MiB,
                 limit=4 * GiB)
    bob["kernels"][0]["notebook"] = "train.ipynb"
    carol = status("carol", [kernel("k3-carol-0000", "carol", 10)], used=10 * MiB, limit=GiB)
    readings = [doc.Reading(doc.ServerRef(user, "", f"/user/{user}/"), answer("n1", [s], {kid: user}))
                for user, s, kid in (("alice", alice, "k1-alice-0000"), ("bob", bob, "k2-bob-000000"),
                                     ("carol", carol, "k3-carol-0000"))]
    document = {**doc.build(readings, 1000.0), "service": {"node": "n1"}}
    (gpu,) = document["nodes"][0]["gpus"]
    assert {k["kernel_id"]: k["notebook"] for s in gpu["slices"] for k in s["kernels"]} == \
        {"k1-alice-0000": "work/analysis.ipynb", "k2-bob-000000": "train.ipynb", "k3-carol-0000": None}
    assert gpu["waiting"][0]["notebook"] == "train.ipynb"
    view = HubView(FakeClient(document), document)
    text = view.nodes.value
    assert 'title="kernel k1-alice-0000"' in text and "work/<wbr>analysis.ipynb" in text
    assert "bob (<span class=\"hami-kernel-notebook\" title=\"kernel k2-bob-000000\"" in text
    assert '<code title="k3-carol-0000"' in text and ">k3-carol<" in text  # no notebook: the short id
    assert "train.ipynb" in view.kernel_rows["k2-bob-000000"].label.value
    # Lines that wrap between their parts: no table to scroll sideways.
    assert "<table" not in text and "<table" not in view.users.value
    assert 'class="hami-hub-slice-line"' in text and 'class="hami-hub-user"' in view.users.value
