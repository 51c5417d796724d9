"""The admin panel's hub view in a real browser (issue 16).

A real JupyterHub with the hub service (hub_view_hub.py: servers on two
simulated nodes; the service on node-a, whose limits files it holds): alice
and the administrator ada on node-a, carol on node-b. Each server runs
JupyterLab. alice's kernel, started through her server's REST API, tries to
allocate 1.5 GiB in her 1 GiB slice and is refused.

Headless Chromium then logs in as ada through the hub's login form, opens a
notebook on the hami-python3 kernel in ada's JupyterLab and runs
``AdminPanel()`` in a cell the way a user does. The ipywidgets render: the
hub view lists both nodes with their GPUs, and alice's, carol's and ada's
kernels. In alice's slice form ada types a 2 GiB memory cap and clicks
Apply (the form's row wraps, so Apply lies within the notebook at the
browser tests' 1440 px). Then: the outcome shows in the page, alice's limits file on node-a
holds 2 GiB, the audit log has the change (ada, via the hub service), the
page's hub view shows the new cap, and alice's running kernel follows: the
same 1.5 GiB allocation now succeeds. The screenshot
``test-artifacts/hub-view-admin-panel.png`` shows the panel after the resize.
"""

import concurrent.futures
import json
import re
import time
from pathlib import Path

import pytest
from chromium_browser import CHROMIUM_ARGS, VIEWPORT, require_browser
from hub_view_hub import ADMIN, CONTEXT, NAME, NODES, PLACE, GiB, HubViewHub, MiB, running, slice_on

from hami_jupyter import audit
from hami_jupyter.slice.file import read_snapshot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
SCREENSHOT = ARTIFACTS / "hub-view-admin-panel.png"
USERS = ("alice", "carol", ADMIN)
NOTEBOOK = "hub-view.ipynb"
PANEL_CELL = "from hami_jupyter.admin import AdminPanel; AdminPanel()"
TIMEOUT_MS = 30_000

# 1.5 GiB in alice's kernel: past the 1 GiB cap, within 2 GiB (with the 64 MiB context).
TRY_ALLOCATE = (
    "from hami_jupyter import driver_memory as c\n"
    "c.init()\n"
    "try:\n"
    "    big = c.DeviceBuffer(1536 << 20)\n"
    "    print('allocated')\n"
    "except c.CudaError as e:\n"
    "    print('refused', e)\n"
)
HOLD = "from hami_jupyter import driver_memory as c\nc.init()\nkeep = c.DeviceBuffer({} << 20)\n"

# No "fetch Jupyter news?" toast over the page, and no requests outside.
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                                "checkForUpdates": False}}


class LabHubViewHub(HubViewHub):
    """The two-node hub, its servers' JupyterLab with this test's settings."""

    def __init__(self, tmp):
        super().__init__(tmp)
        settings = tmp / "lab-settings"
        for plugin, values in LAB_SETTINGS.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        self.extra_environment = {"JUPYTERLAB_SETTINGS_DIR": str(settings)}


@pytest.fixture(scope="module")
def chromium():
    return require_browser()


@pytest.fixture(scope="module")
def view_hub(chromium, tmp_path_factory):
    with running(LabHubViewHub(tmp_path_factory.mktemp("hubview-browser"))) as h:
        yield h


@pytest.fixture
def page(chromium, view_hub, request):
    from playwright.sync_api import sync_playwright

    # Never a browser download: only Debian's Chromium. The hub's tag lets its
    # teardown find whatever of the browser outlived it.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(view_hub.tmp), "HAMI_HUB_E2E_TAG": view_hub.tag,
           "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
    failed_before = request.session.testsfailed
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, env=env,
                                    headless=True, timeout=30_000)
        try:
            # The browser tests' width; tall enough for the whole panel in the screenshot.
            context = browser.new_context(viewport={**VIEWPORT, "height": 2000})
            context.set_default_timeout(15_000)
            pg = context.new_page()
            errors = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.page_errors = errors
            yield pg
            # The call's report is in before teardown: a failure leaves a screenshot.
            if request.session.testsfailed > failed_before:
                ARTIFACTS.mkdir(exist_ok=True)
                pg.screenshot(path=str(ARTIFACTS / f"failure-{request.node.name}.png"),
                              full_page=True, timeout=5_000)
        finally:
            browser.close()


def _expect():
    from playwright.sync_api import expect

    return expect


def write_notebook(path, sources):
    cells = [{"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "source": source,
              "outputs": [], "execution_count": None} for i, source in enumerate(sources)]
    path.write_text(json.dumps({
        "cells": cells,
        "metadata": {"kernelspec": {"name": "hami-python3", "display_name": "Python 3 (HAMi vGPU)",
                                    "language": "python"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))


def execute(hub, user, kernel_id, code):
    """``hub.execute`` in a thread of its own: Playwright's sync API keeps an
    event loop running in this one, and ``hub.execute`` starts one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(hub.execute, user, kernel_id, code).result()


def session_kernel(hub, user, path, timeout=30):
    """The id of the kernel JupyterLab started for *path*, once it is idle."""
    deadline = time.monotonic() + timeout
    while True:
        for s in hub.server_api(user, "GET", "sessions", expect={200}):
            kernel = s.get("kernel") or {}
            if s.get("path") == path and kernel.get("execution_state") == "idle":
                return kernel["id"]
        if time.monotonic() > deadline:
            pytest.fail(f"no idle kernel for {path} within {timeout} s\n{hub.log_tail()}",
                        pytrace=False)
        time.sleep(0.2)


def test_an_admins_click_resizes_a_slice_and_the_running_kernel_follows(view_hub, page):
    expect = _expect()
    hub = view_hub
    started = time.monotonic()
    for user in USERS:
        hub.spawn(user)
    for user in USERS:
        hub.wait_ready(user)
    # The test reads the service's document as ada, with a token of her own.
    hub.tokens[ADMIN] = hub.user_token(ADMIN, [f"access:services!service={NAME}"])
    assert {u: PLACE[u] for u in USERS} == {"alice": "node-a", "carol": "node-b", ADMIN: "node-a"}

    # alice's kernel, started as the REST API does it: 1.5 GiB does not fit her 1 GiB slice.
    alice = hub.start_kernel("alice")
    out = execute(hub, "alice", alice, TRY_ALLOCATE)
    assert out.error is None and out.stdout.startswith("refused"), out
    execute(hub, "alice", alice, HOLD.format(100))
    carol = hub.start_kernel("carol")
    assert execute(hub, "carol", carol, HOLD.format(300)).error is None
    limits = hub.roots["node-a"] / "alice.slice"
    assert read_snapshot(limits).fallback_limit.memory_limit == GiB

    # ada logs in through the hub's form and lands in her JupyterLab, on the notebook.
    write_notebook(hub.tmp / "home" / ADMIN / NOTEBOOK, [PANEL_CELL])
    page.goto(f"{hub.url}/hub/login?next=/user/{ADMIN}/lab/tree/{NOTEBOOK}",
              wait_until="domcontentloaded")
    page.locator("#username_input").fill(ADMIN)
    page.locator("#password_input").fill("any")
    page.locator("#login_submit").click()
    expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")).to_contain_text(
        NOTEBOOK, timeout=TIMEOUT_MS)
    assert page.url.startswith(f"{hub.url}/user/{ADMIN}/lab"), page.url
    ada = session_kernel(hub, ADMIN, NOTEBOOK)

    # Run the cell as a user does; the panel renders as widgets, not as their text.
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").first
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea-output")
    expect(output.locator(".widget-vbox").first).to_contain_text("HAMi slices across the hub",
                                                                 timeout=TIMEOUT_MS)
    expect(output).not_to_contain_text("VBox(")
    expect(output).not_to_contain_text("Error displaying widget")
    # A kernel named by its notebook (ada's, started for this notebook), the whole id a
    # tooltip (issue 41, item 1); one started over the REST API, without a notebook, by its
    # id as the JupyterLab panel shows it: 8 characters; GPU UUIDs "GPU-" and 8.
    for text in ("node node-a", "node node-b", NODES["node-a"][:12], NODES["node-b"][:12],
                 alice[:8], carol[:8], NOTEBOOK, f"as {ADMIN}"):
        expect(output.first).to_contain_text(text)
    expect(output.first.locator(f'code[title="{alice}"]').first).to_have_text(alice[:8])
    expect(output.first.locator(f'.hami-kernel-notebook[title="kernel {ada}"]').first).to_have_text(NOTEBOOK)

    # alice's slice form: 1 GiB; ada types 2 GiB and clicks Apply.
    form = output.locator(".widget-vbox").filter(
        has=page.locator(".widget-html", has_text=re.compile(r"slice alice on node-a"))).last
    memory = form.locator(".widget-text", has=page.locator("label", has_text="memory")).locator(
        "input")
    expect(memory).to_have_value("1.0 GiB")  # sizes as everything else shows them
    # Every input of the form and its Apply button lie within the notebook's output,
    # at JupyterLab's default layout: nothing to scroll sideways to.
    area = output.first.bounding_box()
    apply = form.locator("button", has_text="Apply")
    for name, box in (("Apply", apply.bounding_box()),
                      ("mode", form.locator(".widget-dropdown", has=page.locator(
                          "label", has_text="above the share")).locator("select").bounding_box())):
        assert box["x"] >= area["x"] and box["x"] + box["width"] <= area["x"] + area["width"] + 1, \
            f"{name} of alice's form at {box} sticks out of the output {area}"
    memory.click()
    memory.fill("2g")
    apply.click()
    expect(output.first).to_contain_text("applied", timeout=TIMEOUT_MS)
    expect(output.first).not_to_contain_text("not done")

    # The limits file, the audit log, and the page's view of the slice.
    assert read_snapshot(limits).fallback_limit.memory_limit == 2 * GiB
    record = audit.read_records(hub.roots["node-a"] / "audit.log")[-1]
    assert (record["who"], record["via"], record["slice"]) == \
        (f"{ADMIN} (JupyterHub)", "hub-service", "alice"), record
    assert (record["old"]["memory_limit"], record["new"]["memory_limit"]) == (GiB, 2 * GiB), record
    _, s = slice_on(hub.document(), "node-a", "alice")
    assert s["memory_limit"] == 2 * GiB, s
    expect(memory).to_have_value("2.0 GiB", timeout=TIMEOUT_MS)
    # carol's slice is node-b's: its form is there, and cannot be applied from this hub.
    carol_form = output.locator(".widget-vbox").filter(
        has=page.locator(".widget-html", has_text=re.compile(r"slice carol on node-b"))).last
    expect(carol_form.locator("button", has_text="Apply")).to_be_disabled()

    # alice's running kernel follows at its next allocation.
    out = execute(hub, "alice", alice, TRY_ALLOCATE)
    assert out.error is None and out.stdout.strip() == "allocated", out
    _, s = slice_on(hub.wait_document(
        lambda d: (slice_on(d, "node-a", "alice")[1] or {}).get("memory_used")
        == 1636 * MiB + CONTEXT, what="alice's 1.6 GiB"), "node-a", "alice")
    assert s["memory_used"] > GiB
    # The page follows too: alice's 1.7 GiB of her 2 GiB, in the users' table.
    expect(output.first).to_contain_text("1.7 GiB / 2.0 GiB", timeout=10_000)

    page.mouse.move(5, 5)
    output.first.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 10_000
    assert not page.page_errors, page.page_errors
    assert time.monotonic() - started < 90
