"""The admin panel and ``hami-jupyter slice list|set``, on the simulated GPU.

Panels run in this process without a browser: tests set the input widgets,
press Apply with ``button.click()`` and read the slice file and the audit log.
The panel's GPU facts come from a fake source here (NVML is loaded once per
process, before the simulated one could be put on its path); NVML itself is
read in a child process that sees the simulated GPU. Processes charging a
slice are ``cudrive`` under the preload library; "live" tests use real
kernels. The simulated GPU charges 64 MiB for each CUDA context.
"""

import html
import json
import os
import pwd
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from fake_guard import seen, write_guard

from hami_jupyter import native
from hami_jupyter.slice import registry as kernel_registry
from hami_jupyter.slice import change as slice_limits
from hami_jupyter import gpus
from hami_jupyter import audit
from hami_jupyter.admin import AdminPanel, actions, changes, slice_form
from hami_jupyter.admin.cli import main
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.create import create_limits_file, create_slice, ensure_slice

MiB = 1 << 20
GiB = 1 << 30
CONTEXT = 64 * MiB
FAKE_UUID = "GPU-f0000000-0000-0000-0000-000000000001"
WAIT_S = 30  # bound of every wait for a process or a thread; never reached when all is well


def make_slice(root, name, **configured):
    """A slice as a kernel start would create it (memory_limit, sm_limit, sm_mode)."""
    path = root / f"{name}.slice"
    ensure_slice(path, name, resolve_limits(configured, {}))
    return path


def fake_gpus(*specs):
    """A panel's gpu_source: ``(uuid, name, memory_total)`` per GPU."""
    facts = [gpus.HostGpu(i, u, n, t, memory_used=GiB, utilization=7)
             for i, (u, n, t) in enumerate(specs)]
    return lambda: (facts, None)


ONE_GPU = fake_gpus((FAKE_UUID, "Fake H100", 16 * GiB))


def message(form):
    """What the form's message says, as text."""
    return html.unescape(form.message.value)


def audit_log(root):
    return audit.read_records(audit.default_path(root))


def wait_for(predicate, what):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {WAIT_S} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def panels(hami_env):
    """``panels(**kw)``: an AdminPanel of the test's slice root (not refreshing by itself)."""
    made = []

    def make(**kw):
        kw.setdefault("gpu_source", ONE_GPU)
        kw.setdefault("start", False)
        panel = AdminPanel(hami_env.root, **kw)
        made.append(panel)
        return panel

    yield make
    for panel in made:
        panel.stop()


class Cudrive:
    """``cudrive stdin`` under the preload library: one command line in, one JSON line out."""

    def __init__(self, proc):
        self.proc = proc
        self.selector = selectors.DefaultSelector()
        self.selector.register(proc.stdout, selectors.EVENT_READ)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if not self.selector.select(WAIT_S):
            raise AssertionError(f"cudrive did not answer {line!r} within {WAIT_S} s")
        return json.loads(self.proc.stdout.readline())


@pytest.fixture
def charge(hami_env):
    """``charge(path, mib, kernel_id="")``: a process of the slice holding *mib* MiB on GPU 0."""
    procs = []

    def start(path, mib, kernel_id=""):
        env = native.sim_env(hami_env.sim_state, LD_PRELOAD=str(native.library_path()),
                             HAMI_SLICE=str(path), HAMI_KERNEL_ID=kernel_id)
        proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        procs.append(proc)
        cu = Cudrive(proc)
        for line in ("init", "ctx 0", f"alloc {mib}m"):
            reply = cu.send(line)
            assert reply["rc"] == 0, reply
        return cu

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=WAIT_S)


def sim_uuid(path):
    [device] = read_snapshot(path).devices
    return device.uuid


# ---- what the panel shows ---------------------------------------------------------


def test_panel_shows_gpus_slices_kernels_and_refreshes(hami_env, panels, charge):
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    make_slice(hami_env.root, "bob", memory_limit="1g", sm_limit="30", sm_mode="elastic")
    holder = charge(alice, 300, kernel_id="k-alice")
    kernel_registry.register(alice, kernel_registry.KernelEntry(
        "k-alice", "alice-user", "hami-python3", holder.proc.pid, time.time(), "alice"))
    uuid = sim_uuid(alice)

    panel = panels(gpu_source=fake_gpus((uuid, "Fake H100", 16 * GiB)))
    table = panel.gpu_table.value
    assert "Fake H100" in table and f'title="{uuid}"' in table  # the whole UUID a tooltip
    shown = html.unescape(re.sub(r"<[^>]+>", "", table))  # the text a reader sees
    assert "1.0 GiB of 16.0 GiB in use · 7 % busy" in shown, shown
    assert "2.0 GiB guaranteed to users · alice 2.0 GiB" in shown and "bob" not in table  # elastic slices promise nothing
    assert list(panel.forms) == ["alice", "bob"]
    a, b = panel.forms["alice"], panel.forms["bob"]
    assert "alice-user" in a.status.value and "k-alice" in a.status.value
    assert "364.0 MiB / 2.0 GiB" in a.status.value
    # Short entry labels (a select cuts long ones); the whole story is the tooltip.
    assert [label for label, _ in a.device.options] == ["all GPUs", "GPU 0 (as all GPUs)"]
    assert a.device.value == slice_form.DEFAULT and "every GPU without limits" in a.device.tooltip
    a.device.value = 0
    assert uuid in a.device.tooltip and "follows the limits for all GPUs" in a.device.tooltip
    a.device.value = slice_form.DEFAULT
    # Sizes as every other view shows them.
    assert (a.memory.value, a.sm.value, a.mode.value) == ("2.0 GiB", "none", "hard")
    assert (b.memory.value, b.sm.value, b.mode.value) == ("1.0 GiB", "30", "elastic")
    assert not panel.read_only and panel.banner.value == "" and not a.apply_button.disabled

    panel.interval = 0.05
    panel.start()
    assert panel.running
    count = panel.refresh_count
    wait_for(lambda: panel.refresh_count >= count + 3, "three refreshes")
    assert holder.send("alloc 100m")["rc"] == 0
    wait_for(lambda: "464.0 MiB / 2.0 GiB" in a.status.value, "the panel to show new usage")
    panel.stop()
    assert not panel.running and not panel._thread.is_alive()


def memory_rows(panel):
    """The panel's lines of slices per GPU, each as the parts a reader sees (between " · ")."""
    lines = re.findall(r'<div class="hami-slice-line">(.*?)</div>', panel.memory_table.value)
    parts = [[" ".join(p.split()) for p in html.unescape(re.sub(r"<[^>]+>", "", line)).split(" \u00b7 ")]
             for line in lines]
    return [[f"{p[0]} · {p[1]}", *p[2:]] for p in parts]  # the slice and GPU, then its figures


def test_panel_shows_the_guards_real_memory_and_who_is_over(hami_env, panels, charge):
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    bob = make_slice(hami_env.root, "bob", memory_limit="1g")
    charge(alice, 100)
    charge(bob, 200)
    uuid = sim_uuid(alice)
    gpu = f"GPU 0 · {uuid[:12]}\u2026"  # the UUID shortened as the JupyterLab panel does; whole in a tooltip

    panel = panels(gpu_source=fake_gpus((uuid, "Fake H100", 16 * GiB)))  # no guard yet
    assert memory_rows(panel) == [[f"alice on {gpu}", "164.0 MiB in use", "cap 2.0 GiB", "not measured"],
                                  [f"bob on {gpu}", "264.0 MiB in use", "cap 1.0 GiB", "not measured"]]
    note = re.search(r'<div class="hami-guard-note" title="([^"]*)"[^>]*>(.*?)</div>',
                     panel.memory_table.value)
    assert note, panel.memory_table.value
    # Plain words that end in what to do; the technical note (paths and all) its tooltip.
    words = html.unescape(re.sub(r"<[^>]+>", "", note.group(2)))
    assert words.startswith("No guard is running: what the GPU really holds for each slice is not "
                            "measured") and words.endswith("To start it: hami-jupyter guard (as root)."), words
    assert "/" not in words
    tooltip = html.unescape(note.group(1))
    assert "The guard is not running (no " in tooltip and "memory caps are enforced only cooperatively" in tooltip
    assert all(f.guard_notice.value == "" for f in panel.forms.values())

    write_guard(hami_env.root, {"alice": {uuid: seen(170 * MiB, 164 * MiB, 2 * GiB)},
                                "bob": {uuid: seen(1536 * MiB, 264 * MiB, GiB)}}, interval=5.0)
    panel.refresh()
    assert memory_rows(panel) == [[f"alice on {gpu}", "164.0 MiB in use", "cap 2.0 GiB", "measured 170.0 MiB"],
                                  [f"bob on {gpu}", "264.0 MiB in use", "cap 1.0 GiB",
                                   "measured 1.5 GiB, over the cap"]]
    assert "hami-guard-note" not in panel.memory_table.value
    a, b = panel.forms["alice"], panel.forms["bob"]
    assert a.guard_notice.value == ""
    assert 'class="hami-guard-over"' in b.guard_notice.value
    assert html.unescape(b.guard_notice.value).endswith(
        ">Slice bob is over its memory cap, as the guard sees it: GPU 0 (1.5 GiB really in use, "
        "cap 1.0 GiB). The guard's action: kill.</div>")
    assert b.box.children[0] is b.guard_notice  # heads the slice's section
    assert "real 1.5 GiB (guard)" in b.status.value and "(guard)" not in a.status.value


def test_the_panel_speaks_plainly(hami_env, panels):
    """Issue 35, item 7: no literal backticks, no jargon in the headings (the
    precise meaning is their tooltip), a parked kernel's memory shown as parked
    rather than as 0 B, sizes as everything else shows them and typed so too,
    and two GPUs whose UUIDs begin alike told apart."""
    from hami_jupyter.admin.panel import _gpu_lines, _memory_lines
    from hami_jupyter.slice.status_html import uuid_text

    make_slice(hami_env.root, "alice", memory_limit="2g")
    panel = panels()
    text = html.unescape(panel.memory_table.value + panel.gpu_table.value)
    assert "`" not in text and "<code>hami-jupyter guard</code>" in panel.memory_table.value
    shown = re.sub(r"<[^>]+>", "", text)
    # Issue 41, item 4: words that needed a manual ("kept for slices", "the guard sees -").
    for jargon in ("used (reported)", "real (guard)", "promised to hard slices", ">entry<",
                   "kept for slices", "the guard sees", " - ", "overcommit"):
        assert jargon not in shown, jargon
    form = panel.forms["alice"]
    assert form.device.description == "limits for" and form.memory.value == "2.0 GiB"
    assert (form.guarantee.description, form.guarantee.value) == ("always kept", "whole cap")
    assert form.sm.description == "compute %"
    assert (form.mode.description, [label for label, _ in form.mode.options]) == \
        ("above the share", ["never", "if the GPU is idle"])
    assert panel.overcommit.description == "allow promising more memory than a GPU has"
    # Each plain word explained on hover.
    for widget in (form.guarantee, form.sm, form.mode, panel.overcommit):
        assert len(widget.tooltip) > 40, widget.description
    assert 'title="memory the users' in panel.gpu_table.value  # "guaranteed to users"
    form.memory.value = "3 GiB"  # typed as it is shown
    assert form.pending() == {"memory": "3GiB"} and form.apply() is not None, form.errors
    assert read_snapshot(form.path).fallback_limit.memory_limit == 3 * GiB
    assert form.memory.value == "3.0 GiB"

    # A slice whose kernel is parked: in use 0 B, and its parked bytes beside it.
    twins = ("GPU-5a1f0000-0000-4000-8000-000000000000", "GPU-5a1f0000-0000-4000-8000-000000000001")
    gpus = [{"index": i, "uuid": u, "memory_used": 0, "memory_parked": 3584 << 20,
             "memory_limit": 4 * GiB, "memory_real": None, "guard_state": None}
            for i, u in enumerate(twins)]
    view = type("View", (), {"name": "bob", "status": {"gpus": gpus}})()
    table = re.sub(r"<[^>]+>", "", html.unescape(_memory_lines([view], None)))
    assert "0 B in use + 3.5 GiB parked" in table, table
    assert {uuid_text(u, twins) for u in twins} == {"GPU-5a1f0000\u20260000", "GPU-5a1f0000\u20260001"}
    assert uuid_text(twins[0]) == uuid_text(twins[0], [twins[0], "GPU-77770000-1"]) == "GPU-5a1f0000\u2026"
    promised = [{"uuid": u, "name": "sim", "memory_total": 16 * GiB, "promised": 0, "holders": {}}
                for u in twins]
    assert html.unescape(_gpu_lines([], None, promised)).count("GPU-5a1f0000\u20260001") == 1


def test_refresh_keeps_what_an_admin_is_typing(hami_env, panels):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    panel = panels()
    form = panel.forms["alice"]
    form.memory.value = "3g"  # being edited
    slice_limits.set_sm_share(path, None, 40)  # another admin, meanwhile
    panel.refresh()
    assert form.memory.value == "3g" and form.sm.value == "none"
    assert form.pending() == {"memory": "3g"}

    form.memory.value = "2.0 GiB"  # back to what was loaded: nothing pending, so it follows the file
    panel.refresh()
    assert (form.memory.value, form.sm.value) == ("2.0 GiB", "40")


# ---- applying from the panel ----------------------------------------------------------


def test_panel_apply_writes_the_slice_and_the_audit_log(hami_env, panels, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_USER", "admin-ann")
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    form = panels().forms["alice"]
    form.memory.value, form.sm.value, form.mode.value = "4g", "25", "elastic"
    assert "on Apply: slice 'alice'" in message(form)  # checked before Apply
    form.apply_button.click()

    assert form.errors == [] and "applied: slice 'alice'" in message(form)
    assert form.last_change.applied
    fallback = read_snapshot(path).fallback_limit
    assert (fallback.memory_limit, fallback.sm_share, fallback.mode) == (4 * GiB, 25, "elastic")
    [record] = audit_log(hami_env.root)
    # Who comes from the OS, never from JUPYTERHUB_USER (any process can set that).
    assert record["who"] == pwd.getpwuid(os.geteuid()).pw_name != "admin-ann"
    assert record["uid"] == os.getuid() and record["euid"] == os.geteuid()
    assert record["slice"] == "alice" and record["path"] == str(path)
    assert record["device"] is None and record["uuid"] is None
    assert record["old"] == {"memory_limit": 2 * GiB, "sm_share": 0, "mode": "hard", "max_decoders": 0, "memory_guarantee": 0}
    assert record["new"] == {"memory_limit": 4 * GiB, "sm_share": 25, "mode": "elastic", "max_decoders": 0, "memory_guarantee": 0}
    assert datetime.fromisoformat(record["when"].replace("Z", "+00:00")).utcoffset().total_seconds() == 0
    assert form.pending() == {} and (form.memory.value, form.sm.value) == ("4.0 GiB", "25")

    form.apply_button.click()  # nothing edited since
    assert form.errors == ["nothing to change: edit the memory cap, the guarantee, the SM share "
                           "or the mode first"]
    assert len(audit_log(hami_env.root)) == 1


def test_panel_changes_one_gpu_of_a_slice(hami_env, panels, charge):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    charge(path, 300)
    uuid = sim_uuid(path)
    form = panels().forms["alice"]
    form.device.value = 0
    assert form.memory.value == "2.0 GiB"  # the GPU follows the default so far
    form.memory.value = "1g"
    assert form.apply() is not None
    assert any("GPU 0 gets limits of its own" in w for w in form.warnings)

    snap = read_snapshot(path)
    assert snap.fallback_limit.memory_limit == 2 * GiB
    assert snap.devices[0].limit.memory_limit == GiB and not snap.devices[0].limit_is_fallback
    [record] = audit_log(hami_env.root)
    assert (record["device"], record["uuid"]) == (0, uuid)
    assert [label for label, _ in form.device.options][1] == "GPU 0"
    assert form.device.tooltip == f"GPU 0 ({uuid})"


@pytest.mark.parametrize("field, value, text", [
    ("memory", "-1g", "is negative"),
    ("memory", "4x", "is not a size"),
    ("memory", "", "is not a size"),
    ("memory", "0", "would refuse every allocation"),
    ("sm", "101", "is not a whole percent"),
    ("sm", "-5", "is negative"),
    ("sm", "2.5", "is not a whole percent"),
    # one grammar with the preload library: no spaces, ASCII digits only
    ("memory", " 4g", "is not a size"),
    ("memory", "4g\n", "is not a size"),
    ("sm", "50 ", "is not a whole percent"),
    ("sm", "\u0665\u0660", "is not a whole percent"),
    ("sm", "0050", "is not a whole percent"),
])
def test_panel_refuses_malformed_values(hami_env, panels, field, value, text):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    generation = read_snapshot(path).limits_generation
    form = panels().forms["alice"]
    getattr(form, field).value = value
    assert "cannot apply" in message(form) and text in message(form)  # before Apply
    assert form.apply() is None
    assert any(text in e for e in form.errors), form.errors
    assert read_snapshot(path).limits_generation == generation
    assert not audit.default_path(hami_env.root).exists()


def test_hard_slices_must_fit_the_gpu_unless_overcommit(hami_env, panels):
    alice = make_slice(hami_env.root, "alice", memory_limit="10g")
    bob = make_slice(hami_env.root, "bob", memory_limit="4g")
    make_slice(hami_env.root, "carol", memory_limit="12g", sm_mode="elastic")  # not counted
    panel = panels()
    form = panel.forms["bob"]
    form.memory.value = "8g"
    assert form.apply() is None
    [error] = form.errors
    assert f"GPU Fake H100 {FAKE_UUID}: hard slices would be promised 18.0 GiB of its 16.0 GiB" in error
    assert "alice 10.0 GiB, bob 8.0 GiB" in error and "carol" not in error
    assert read_snapshot(bob).fallback_limit.memory_limit == 4 * GiB

    panel.overcommit.value = True
    assert form.apply() is not None
    assert any("allowed because overcommit is on" in w for w in form.warnings)
    assert read_snapshot(bob).fallback_limit.memory_limit == 8 * GiB

    # Overcommitted now; a change that lowers the promise is still allowed without overcommit.
    panel.overcommit.value = False
    a = panel.forms["alice"]
    a.memory.value = "9g"
    assert a.apply() is not None, a.errors
    assert read_snapshot(alice).fallback_limit.memory_limit == 9 * GiB
    assert len(audit_log(hami_env.root)) == 2


def test_shrinking_below_usage_is_applied_with_a_warning(hami_env, panels, charge):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    holder = charge(path, 1024)
    form = panels().forms["alice"]
    form.memory.value = "512m"
    assert form.apply() is not None
    [warning] = form.warnings
    assert "uses 1.1 GiB, more than the new cap 512.0 MiB" in warning
    assert "new allocations are refused until usage falls below the cap" in warning
    assert read_snapshot(path).fallback_limit.memory_limit == 512 * MiB
    reply = holder.send("alloc 1m")
    assert reply["err"] == "CUDA_ERROR_OUT_OF_MEMORY", reply
    assert read_snapshot(path).devices[0].memory_used == 1024 * MiB + CONTEXT  # it kept what it held


def test_lowering_the_sm_share_is_in_the_file_at_once(hami_env, panels, charge):
    path = make_slice(hami_env.root, "alice", memory_limit="2g", sm_limit="50")
    charge(path, 100)
    generation = read_snapshot(path).limits_generation
    form = panels().forms["alice"]
    form.sm.value = "20"
    form.apply_button.click()
    snap = read_snapshot(path)
    assert snap.limits_generation > generation
    assert snap.fallback_limit.sm_share == 20 and snap.fallback_limit.mode == "hard"
    assert snap.devices[0].limit.sm_share == 20  # the GPU the process uses follows the default


# ---- read-only -------------------------------------------------------------------------


def test_a_slice_this_user_cannot_write_is_read_only(hami_env, panels, monkeypatch):
    make_slice(hami_env.root, "alice", memory_limit="2g")
    bob = make_slice(hami_env.root, "bob", memory_limit="2g")
    monkeypatch.setattr(slice_limits, "limits_writable", lambda p: Path(p).name != "bob.slice")
    panel = panels()
    a, b = panel.forms["alice"], panel.forms["bob"]
    assert b.read_only and changes.READ_ONLY in b.banner.value
    assert all(w.disabled for w in b.inputs) and not any(w.disabled for w in a.inputs)
    assert not a.read_only and panel.banner.value == ""  # alice is still theirs to change

    b.memory.value = "8g"
    b.apply_button.click()
    assert b.errors == [changes.READ_ONLY]
    with pytest.raises(changes.ReadOnlyError, match="read-only: you cannot change limits"):
        actions.apply(bob, memory="8g")
    assert read_snapshot(bob).limits_generation == 0
    assert not audit.default_path(hami_env.root).exists()


# The child starts as root and becomes user nobody once its imports are done: the
# interpreter may live where nobody cannot read it (a pyenv under /root).
READ_ONLY_CHILD = textwrap.dedent("""
    import contextlib, io, json, os, shutil, sys  # shutil: argparse imports it when it prints
    from hami_jupyter.admin import AdminPanel, actions, changes
    from hami_jupyter.admin.cli import main

    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    root = sys.argv[1]
    panel = AdminPanel(root, gpu_source=lambda: ([], None), start=False)
    seen = {"panel_read_only": panel.read_only, "banner": panel.banner.value,
            "overcommit_disabled": panel.overcommit.disabled}
    for name, form in panel.forms.items():
        form.memory.value = "8g"
        form.apply_button.click()
        try:
            actions.apply(form.path, memory="8g")
            raised = None
        except changes.ReadOnlyError as e:
            raised = str(e)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = main(["slice", "set", name, "--root", root, "--memory", "8g"])
        seen[name] = {"banner": form.banner.value, "disabled": [w.disabled for w in form.inputs],
                      "status": form.status.value, "errors": form.errors, "raised": raised,
                      "cli": [status, err.getvalue()]}
    print(json.dumps(seen))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a child as user nobody")
def test_another_user_sees_read_only_and_cannot_write(hami_env):
    """Run as user nobody: alice's slice is root's; bob's slice file is nobody's own, but
    a hub-owned limits file holds its limits, so nobody may not change those either."""
    base = Path(tempfile.mkdtemp(prefix="hami-admin-ro-"))
    try:
        base.chmod(0o755)
        root = base / "slices"
        root.mkdir(mode=0o755)
        alice = make_slice(root, "alice", memory_limit="2g")
        alice.chmod(0o644)
        bob = root / "bob.slice"
        two_gib = resolve_limits({"memory_limit": "2g"}, {}).limits
        create_limits_file(bob, two_gib)  # root's, 0644
        create_slice(bob, "bob", two_gib, mode=0o600)
        os.chown(bob, 65534, 65534)
        before = {p: read_snapshot(p) for p in (alice, bob)}
        env = {k: v for k, v in os.environ.items() if k not in ("JUPYTERHUB_USER", "HAMI_SLICE_ROOT")}
        env["HOME"] = str(base)
        child = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(root)],
                               env=env, cwd=base, capture_output=True, text=True, timeout=WAIT_S)
        assert child.returncode == 0, child.stderr
        seen = json.loads(child.stdout)
        assert seen["panel_read_only"] and changes.READ_ONLY in seen["banner"]
        assert seen["overcommit_disabled"]
        for name in ("alice", "bob"):
            form = seen[name]
            assert "2.0\u00a0GiB" in html.unescape(form["status"])  # it can see the slice
            assert changes.READ_ONLY in form["banner"] and all(form["disabled"])
            assert form["errors"] == [changes.READ_ONLY]
            assert form["raised"].startswith(f"read-only: you cannot change limits of slice '{name}'")
            assert form["cli"][0] == 1 and "read-only: you cannot change limits" in form["cli"][1]
        for path, snap in before.items():
            after = read_snapshot(path)
            assert after.limits_generation == snap.limits_generation
            assert after.fallback_limit == snap.fallback_limit
        assert not audit.default_path(root).exists()
    finally:
        shutil.rmtree(base)


def test_an_admin_changes_hub_owned_limits_live(hami_env, panels, charge):
    """A slice whose limits live in a hub-owned limits file: the change goes there,
    and the slice's running process follows at its next allocation."""
    path = hami_env.root / "alice.slice"
    hami_env.root.mkdir(mode=0o755)
    two_gib = resolve_limits({"memory_limit": "2g"}, {}).limits
    limits_file, _ = create_limits_file(path, two_gib)
    create_slice(path, "alice", two_gib)
    holder = charge(path, 300)
    assert holder.send("alloc 2g")["err"] == "CUDA_ERROR_OUT_OF_MEMORY"
    form = panels().forms["alice"]
    form.memory.value = "4g"
    assert form.apply() is not None, form.errors
    assert read_snapshot(path).limits_file == str(limits_file)
    assert read_snapshot(path).fallback_limit.memory_limit == 4 * GiB
    assert holder.send("alloc 2g")["rc"] == 0


def _bad_registry(path):
    """A good entry (this process) and, beside it, entries a user could write by hand."""
    d = kernel_registry.registry_dir(path)
    kernel_registry.register(path, kernel_registry.new_entry(path, "k-good", "alice-user",
                                                             "hami-python3", os.getpid()))
    base = {"user": "alice", "kernelspec": "hami-python3", "started_unix": 1.0, "slice": str(path)}
    for kernel_id, pid in (("k-huge", 99999999999), ("k-text", "123")):
        (d / f"{kernel_id}.json").write_text(json.dumps({**base, "kernel_id": kernel_id, "pid": pid}))


def test_panel_survives_bad_registry_entries_and_skips_untrusted_slices(hami_env, panels, caplog):
    """A malformed registry entry once stopped the panel (OverflowError); a slice
    file anyone may write is named in the banner and never read."""
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    _bad_registry(alice)
    loose = make_slice(hami_env.root, "bob", memory_limit="1g")
    loose.chmod(0o666)
    with caplog.at_level("WARNING", logger="hami_jupyter"):
        panel = panels()
    assert list(panel.forms) == ["alice"]
    status = panel.forms["alice"].status.value
    assert "k-good" in status and "alice-user" in status and "k-huge" not in status
    assert "pid 99999999999 is out of range" in caplog.text
    assert panel.skipped == [f"skipped slice file {loose} is writable by every user (mode 666): "
                             f"refused; run chmod o-w {loose}"]
    assert html.escape(panel.skipped[0]) in panel.banner.value
    # The fit check counts what it can read and says what it could not.
    form = panel.forms["alice"]
    form.memory.value = "3g"
    assert any(w.startswith(f"skipped slice file {loose}") and w.endswith("its caps are not counted")
               for w in form.warnings), form.warnings


# ---- the CLI --------------------------------------------------------------------------


def run(capsys, *argv):
    """``(exit status, stdout, stderr)`` of one in-process ``hami-jupyter slice ...``."""
    code = main(["slice", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_nvml(monkeypatch):
    """The CLI sees no GPU through NVML (a machine running the tests may have a real one)."""
    import hami_jupyter.admin.cli as admin_cli

    monkeypatch.setattr(admin_cli, "read_gpus", lambda: ([], "GPU facts unavailable: test"))


def test_cli_list_as_text_and_json(hami_env, capsys, charge, no_nvml):
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    make_slice(hami_env.root, "bob", memory_limit="1g", sm_limit="30")
    charge(alice, 100, kernel_id="k-1")
    uuid = sim_uuid(alice)

    code, out, err = run(capsys, "list")
    assert code == 0 and err == ""
    assert f"hami slice 'alice'  ({alice})" in out and "hami slice 'bob'" in out
    assert "164.0 MiB / 2.0 GiB" in out and "limits: you may change them" in out
    # bob has not used the GPU; its default counts against it all the same.
    assert f"GPU {uuid}: 3.0 GiB of 16.0 GiB promised to hard slices (alice 2.0 GiB, bob 1.0 GiB)" in out
    assert "GPU facts unavailable: test; sizes come from the slice files" in out

    code, out, _ = run(capsys, "list", "--json")
    assert code == 0
    shown = json.loads(out)
    assert [s["slice"] for s in shown["slices"]] == ["alice", "bob"]
    assert all(s["writable"] for s in shown["slices"])
    assert shown["slices"][0]["gpus"][0]["memory_used"] == 100 * MiB + CONTEXT
    assert shown["slices"][1]["default_limit"] == {"memory_limit": GiB, "sm_share": 30, "mode": "hard", "max_decoders": 0, "memory_guarantee": 0}
    assert shown["gpus"] == [{"uuid": uuid, "name": "", "memory_total": 16 * GiB,
                              "promised": 3 * GiB, "holders": {"alice": 2 * GiB, "bob": GiB},
                              "capped": 3 * GiB, "lent": False}]


def test_cli_list_shows_the_guards_real_memory(hami_env, capsys, charge, no_nvml):
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    make_slice(hami_env.root, "bob", memory_limit="1g")
    charge(alice, 100, kernel_id="k-1")
    uuid = sim_uuid(alice)
    heading = "memory per slice and GPU (REAL: as the guard reads it from NVML):"

    def table(out):
        lines = out.splitlines()
        start = lines.index(heading)
        return [" ".join(line.split()) for line in lines[start + 1:start + 4]]

    code, out, err = run(capsys, "list")  # no guard: REAL unknown, and a note that says so
    assert code == 0 and err == ""
    assert table(out) == ["SLICE GPU USED CAP REAL", "alice 0 164.0 MiB 2.0 GiB -",
                          "bob - 0 B 1.0 GiB -"]
    guard_file = hami_env.root / "guard.json"
    assert (f"note: the guard is not running (no {guard_file}): real memory is unknown (-), and memory "
            "caps are enforced only cooperatively, by the preload library in each process; "
            "`hami-jupyter guard` starts the guard (docs/guard.md)") in out.splitlines()

    report = write_guard(hami_env.root, {"alice": {uuid: seen(2600 * MiB, 164 * MiB, 2 * GiB)}},
                         interval=5.0)
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert table(out) == ["SLICE GPU USED CAP REAL", "alice 0 164.0 MiB 2.0 GiB 2.5 GiB OVER CAP",
                          "bob - 0 B 1.0 GiB -"]
    assert "note:" not in out
    assert "OVER CAP: the guard sees 2.5 GiB really in use on this GPU, over the 2.0 GiB cap" in out
    code, out, _ = run(capsys, "list", "--json")
    alice_gpu = json.loads(out)["slices"][0]["gpus"][0]
    assert (alice_gpu["memory_real"], alice_gpu["guard_state"]) == (2600 * MiB, "over")

    write_guard(hami_env.root, {"alice": {uuid: seen(2600 * MiB, 164 * MiB, 2 * GiB)}},
                written_unix=report["written_unix"] - 600, guard_pid=99999999)
    code, out, _ = run(capsys, "list")
    assert code == 0 and table(out)[1] == "alice 0 164.0 MiB 2.0 GiB -"
    [note] = [line for line in out.splitlines() if line.startswith("note:")]
    assert note.startswith(f"note: the guard is not running: it last wrote {guard_file} 60")
    assert "s ago (its process 99999999 is gone); real memory is unknown (-)" in note


def test_cli_list_survives_bad_registry_entries_and_skips_untrusted_slices(hami_env, capsys, no_nvml,
                                                                           caplog):
    alice = make_slice(hami_env.root, "alice", memory_limit="2g")
    _bad_registry(alice)
    loose = make_slice(hami_env.root, "bob", memory_limit="1g")
    loose.chmod(0o666)
    with caplog.at_level("WARNING", logger="hami_jupyter"):
        code, out, err = run(capsys, "list")
    assert code == 0 and "Traceback" not in err
    assert "hami slice 'alice'" in out and "k-good  (alice-user, hami-python3)" in out
    assert "k-huge" not in out and "hami slice 'bob'" not in out
    assert f"warning: skipped slice file {loose} is writable by every user (mode 666)" in err
    assert "pid is str, not a whole number" in caplog.text

    code, out, _ = run(capsys, "list", "--json")
    assert code == 0
    [shown] = json.loads(out)["slices"]
    assert [k["kernel_id"] for k in shown["kernels"]] == ["k-good"]


def test_cli_set_reads_values_as_the_preload_library_does(hami_env, capsys, no_nvml):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    for argv, words in ((["--sm", " 25"], "SM share ' 25' is not a whole percent"),
                        (["--memory", "4g "], "memory limit '4g ' is not a size"),
                        (["--mode", "hard "], "SM mode 'hard ' is not one of hard, elastic"),
                        (["--device", "\u0660", "--memory", "1g"],
                         "--device: '\u0660' is neither a GPU index")):
        code, out, err = run(capsys, "set", "alice", *argv)
        assert code == 2 and words in err, (argv, err)
    assert read_snapshot(path).limits_generation == 0


def test_cli_set_reports_every_bad_argument_before_looking_for_the_slice(hami_env, capsys,
                                                                         no_nvml):
    code, out, err = run(capsys, "set", "nosuchslice", "--memory", "lots", "--sm", "150",
                         "--device", "x")
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert "--device: 'x' is neither" in lines[0] and "--memory: memory limit 'lots'" in lines[1]
    assert "--sm: SM share '150'" in lines[2] and "nosuchslice" not in err
    code, _, err = run(capsys, "set", "nosuchslice", "--memory", "1g")
    assert code == 1 and "slice 'nosuchslice' does not exist" in err


def test_cli_reset_and_audit_verify_say_where_they_looked(hami_env, capsys, no_nvml):
    """`slice reset` of a missing slice says what `slice set` says: where it
    looked and what to check."""
    code, out, err = run(capsys, "reset", "nosuchslice")
    assert code == 1 and out == ""
    said = err.removeprefix("hami-jupyter slice reset: error: ")
    assert said.startswith(f"slice 'nosuchslice' does not exist "
                           f"({hami_env.root / 'nosuchslice.slice'}); ")
    assert said.rstrip().endswith("check the name, and HAMI_SLICE_ROOT or --root for the folder")
    code, _, err = run(capsys, "set", "nosuchslice", "--memory", "1g")
    assert code == 1 and err.removeprefix("hami-jupyter slice set: error: ") == said

    code, out, err = main(["audit", "verify"]), *capsys.readouterr()
    assert code == 1 and out == ""
    assert err == (f"hami-jupyter audit verify: error: no audit log at {hami_env.root / 'audit.log'}: "
                   "it is written at the first limit change (slice set or reset); check --log, "
                   "or --root and HAMI_SLICE_ROOT for the folder\n")


def test_on_a_single_machine_set_and_reset_say_the_same(hami_env, capsys, no_nvml):
    """Issue 35, item 8: a slice no hub runs. `slice set` applied, then `slice
    reset` failed "no limits set by an administrator". Now both say what they do
    there: set holds while the kernels run, reset has no policy to go back to."""
    path = make_slice(hami_env.root, "root", memory_limit="2g")
    code, out, err = run(capsys, "set", "root", "--memory", "3g")
    assert code == 0 and out.startswith("applied: slice 'root'"), out + err
    assert "note: slice 'root' is not a hub's, so `slice reset` has no policy to go back to. " \
           "Its limits are what `slice set` last applied while its kernels run; when none runs, " \
           "the next kernel start gives it the limits its kernels are configured with" in out, out
    code, out, err = run(capsys, "reset", "root")
    assert code == 1 and out == "", out
    assert "slice 'root' is not a hub's (no limits file beside it): there is no policy to go back " \
           "to. Its limits are what `slice set` last applied" in err, err
    assert "nothing to reset" not in err and "administrator" not in err, err
    assert read_snapshot(path).fallback_limit.memory_limit == 3 * GiB  # reset changed nothing


def test_cli_list_without_slices(hami_env, capsys, no_nvml):
    code, out, _ = run(capsys, "list")
    assert code == 0 and f"no slices under {hami_env.root}" in out
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0 and json.loads(out) == {"gpus": [], "slices": []}


def test_cli_set_applies_and_logs(hami_env, capsys, monkeypatch, no_nvml):
    monkeypatch.setenv("JUPYTERHUB_USER", "admin-bo")
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    code, out, err = run(capsys, "set", "alice", "--memory", "4g", "--sm", "40", "--mode", "elastic")
    assert code == 0, err
    assert out.startswith("applied: slice 'alice', default (every GPU without limits of its own): "
                          "memory 2.0 GiB, SM unlimited -> memory 4.0 GiB, SM 40 % (elastic)")
    fallback = read_snapshot(path).fallback_limit
    assert (fallback.memory_limit, fallback.sm_share, fallback.mode) == (4 * GiB, 40, "elastic")
    [record] = audit_log(hami_env.root)
    assert record["who"] == pwd.getpwuid(os.geteuid()).pw_name != "admin-bo"
    assert record["new"]["sm_share"] == 40

    elsewhere = hami_env.tmp / "elsewhere.log"
    code, _, err = run(capsys, "set", str(path), "--memory", "none", "--audit-log", str(elsewhere))
    assert code == 0, err
    assert read_snapshot(path).fallback_limit.memory_limit == 0
    assert [r["new"]["memory_limit"] for r in audit.read_records(elsewhere)] == [0]


@pytest.mark.parametrize("argv, status, message", [
    (["alice", "--memory=-1g"], 2, "memory: '-1g' is negative"),
    (["alice", "--memory", "4x"], 2, "memory limit '4x' is not a size"),
    (["alice", "--sm", "150"], 2, "SM share '150' is not a whole percent"),
    (["alice", "--mode", "turbo"], 2, "SM mode 'turbo' is not one of hard, elastic"),
    (["alice", "--device", "3", "--memory", "1g"], 1, "slice 'alice' has no GPU 3 (it has: none yet)"),
    (["nobody-here", "--memory", "1g"], 1, "slice 'nobody-here' does not exist"),
    (["alice"], 2, "nothing to change: give --memory, --guarantee, --sm or --mode"),
    (["bad name!", "--memory", "1g"], 2, "invalid slice name 'bad name!'"),
    ([], 2, "the following arguments are required: SLICE"),
])
def test_cli_set_refuses_with_one_clear_line(hami_env, capsys, no_nvml, argv, status, message):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    code, out, err = run(capsys, "set", *argv)
    assert code == status and out == ""
    assert message in err and "Traceback" not in err
    assert read_snapshot(path).limits_generation == 0
    assert not audit.default_path(hami_env.root).exists()


def test_cli_overcommit(hami_env, capsys, monkeypatch):
    import hami_jupyter.admin.cli as admin_cli

    monkeypatch.setattr(admin_cli, "read_gpus", ONE_GPU)
    make_slice(hami_env.root, "alice", memory_limit="10g")
    bob = make_slice(hami_env.root, "bob", memory_limit="4g")
    code, _, err = run(capsys, "set", "bob", "--memory", "8g")
    assert code == 1 and "hard slices would be promised 18.0 GiB of its 16.0 GiB" in err
    assert "or allow overcommit" in err
    code, out, _ = run(capsys, "set", "bob", "--memory", "8g", "--overcommit")
    assert code == 0 and "warning: GPU Fake H100" in out and "allowed because overcommit is on" in out
    assert read_snapshot(bob).fallback_limit.memory_limit == 8 * GiB


def test_cli_set_on_a_read_only_slice(hami_env, capsys, monkeypatch, no_nvml):
    path = make_slice(hami_env.root, "alice", memory_limit="2g")
    monkeypatch.setattr(slice_limits, "limits_writable", lambda p: False)
    code, _, err = run(capsys, "set", "alice", "--memory", "8g")
    assert code == 1 and "read-only: you cannot change limits of slice 'alice'" in err
    code, out, _ = run(capsys, "list")
    assert code == 0 and "read-only: you cannot change limits" in out
    assert read_snapshot(path).limits_generation == 0


# ---- live: a running kernel follows -----------------------------------------------------

ALLOCATE_3G = """\
from hami_jupyter import driver_memory as c
c.init()
try:
    held = c.DeviceBuffer(3 << 30)
    print("allocated")
except c.CudaError as e:
    print(e.name)
"""

# The bound: the kernel's next allocation succeeds within 1 s of the change.
ALLOCATE_3G_WITHIN_1S = """\
import time
deadline = time.monotonic() + 1.0
while True:
    try:
        held = c.DeviceBuffer(3 << 30)
        break
    except c.CudaError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.01)
print("allocated")
"""


@pytest.mark.parametrize("how", ["panel", "cli"])
def test_raising_the_cap_reaches_a_running_kernel(hami_env, start_kernel, cell, panels, capsys,
                                                  no_nvml, how):
    _, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "2g"})
    r = cell(kc, ALLOCATE_3G)
    assert r.error is None and r.stdout.strip() == "CUDA_ERROR_OUT_OF_MEMORY", r
    path = Path(cell(kc, "import os; print(os.environ['HAMI_SLICE'])").stdout.strip())
    name = path.name[: -len(".slice")]

    if how == "panel":
        form = panels().forms[name]
        form.memory.value = "4g"  # the default entry, which GPU 0 follows
        form.apply_button.click()
        assert form.errors == [], form.errors
    else:
        code, _, err = run(capsys, "set", name, "--device", "0", "--memory", "4g")
        assert code == 0, err

    r = cell(kc, ALLOCATE_3G_WITHIN_1S)
    assert r.error is None and r.stdout.strip() == "allocated", r
    [record] = audit_log(hami_env.root)
    assert record["new"]["memory_limit"] == 4 * GiB


# ---- concurrent admins ------------------------------------------------------------------


def test_two_admins_at_once_lose_nothing(hami_env, panels):
    """Admin A resizes alice's memory while admin B changes alice's SM share and bob's memory."""
    rounds = 50
    alice = make_slice(hami_env.root, "alice", memory_limit="1g")
    bob = make_slice(hami_env.root, "bob", memory_limit="1g")
    a, b = panels(), panels()
    start = threading.Barrier(2)
    failures = []

    def admin(steps):
        try:
            start.wait(timeout=WAIT_S)
            for form, field, value in steps:
                getattr(form, field).value = value
                form.apply_button.click()
                assert form.errors == [], form.errors
        except Exception as e:  # reported by the main thread
            failures.append(e)

    steps_a = [(a.forms["alice"], "memory", f"{1000 + i}m") for i in range(rounds)]
    steps_b = [step for i in range(rounds) for step in (
        (b.forms["alice"], "sm", str(i + 1)), (b.forms["bob"], "memory", f"{2000 + i}m"))]
    threads = [threading.Thread(target=admin, args=(s,)) for s in (steps_a, steps_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S * 4)
    assert not failures and not any(t.is_alive() for t in threads), failures

    fa, fb = read_snapshot(alice).fallback_limit, read_snapshot(bob).fallback_limit
    assert (fa.memory_limit, fa.sm_share) == ((1000 + rounds - 1) * MiB, rounds)
    assert fb.memory_limit == (2000 + rounds - 1) * MiB

    records = audit_log(hami_env.root)  # every line parses: none torn or interleaved
    assert len(records) == 3 * rounds
    for name in ("alice", "bob"):
        mine = [r for r in records if r["slice"] == name]
        # In log order each record's "old" is the previous one's "new": every change was
        # made on top of the one before, so none was lost.
        assert all(prev["new"] == nxt["old"] for prev, nxt in zip(mine, mine[1:]))
    alice_memory = [r["new"]["memory_limit"] for r in records
                    if r["slice"] == "alice" and r["old"]["memory_limit"] != r["new"]["memory_limit"]]
    assert alice_memory == [(1000 + i) * MiB for i in range(rounds)]


# ---- GPU facts and the audit log --------------------------------------------------------

NVML_CHILD = textwrap.dedent("""
    import json, sys
    from dataclasses import asdict
    from hami_jupyter.admin import AdminPanel
    from hami_jupyter.gpus import read_gpus
    panel = AdminPanel(sys.argv[1], start=False)
    found, message = read_gpus()
    print(json.dumps({"read": [[asdict(g) for g in found], message], "table": panel.gpu_table.value}))
""")


def test_gpu_facts_come_from_nvml(hami_env):
    env = native.sim_env(hami_env.tmp / "nvml-state", HAMI_SIM_DEVICES="2", HAMI_SIM_MEMORY="8g")
    child = subprocess.run([sys.executable, "-c", NVML_CHILD, str(hami_env.root)], env=env,
                           capture_output=True, text=True, timeout=WAIT_S)
    assert child.returncode == 0, child.stderr
    shown = json.loads(child.stdout)
    found, message = shown["read"]
    assert message is None and [g["index"] for g in found] == [0, 1]
    for g in found:
        assert g["uuid"].startswith("GPU-") and g["name"]
        assert g["memory_total"] == 8 * GiB and isinstance(g["utilization"], int)
        assert g["uuid"] in shown["table"] and g["name"] in shown["table"]


def test_gpu_facts_without_nvml(monkeypatch):
    import pynvml

    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(gpus, "_initialised", False)
    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    found, message = gpus.read_gpus()
    assert found == [] and message.startswith("GPU facts unavailable: NVML:")


def test_audit_reader_refuses_a_damaged_log(tmp_path):
    log = tmp_path / "audit.log"
    with audit.AuditLog(log) as writer:
        writer.append({"slice": "alice"})
    with open(log, "a") as f:
        f.write('{"slice": "bo')
    with pytest.raises(audit.AuditLogError, match=r"audit.log:2: not an audit record"):
        audit.read_records(log)


def test_the_panel_ends_a_process_the_guard_parked(hami_env, panels):
    """Issue 27, item 2: the local AdminPanel() lists what the guard parked under
    its root, with the reason, and End ends it (root here; an administrator
    who is not root goes through the admin service: tests/hub/test_admin_audit.py)."""
    import os
    import subprocess

    from fake_guard import write_guard

    from hami_jupyter import audit
    from hami_jupyter.processes import start_ticks
    from hami_jupyter.slice.guard_report import write_report

    if os.geteuid() != 0:
        pytest.skip("ending another process of the guard's is root's (or the admin service's)")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        report = write_guard(hami_env.root, {}, action="park")
        write_report({**report, "parked": [{
            "pid": sleeper.pid, "start_ticks": start_ticks(sleeper.pid), "slice": "alice",
            "user": "alice", "command": "sleep 60", "uuid": "GPU-x", "process_bytes": 1 << 30,
            "unix": report["written_unix"], "action": "park",
            "why": "held 1.0 GiB past its slice's cap without the preload library"}]}, hami_env.root)
        panel = panels()
        row = panel.parked_rows[sleeper.pid]
        assert "sleep 60" in row.label.value and "without the preload library" in row.label.value
        assert panel.parked.layout.display is None
        assert f"process {sleeper.pid} (alice) ended" in row.act("end")
        assert sleeper.wait(30) != 0
        assert "ended" in panel.parked_message.value
        last = audit.read_records(audit.default_path(hami_env.root))[-1]
        assert (last["action"], last["pid"]) == ("guard-end", sleeper.pid)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
