"""A real JupyterLab on loopback and a headless Chromium driving it.

* ``lab`` (one per module): ``python -m jupyterlab`` on 127.0.0.1 with a
  random token, its own config, runtime, settings and workspaces folders, a
  root folder in tmp, the simulated GPU (16 GiB, 64 MiB per context) and the
  slice limits ``HAMI_MEMORY_LIMIT=1g``, ``HAMI_SM_LIMIT=25`` in its
  environment (its kernels inherit them), and the status bar polling every
  500 ms (a user-settings file). Kernelspecs and the prebuilt labextension
  come from this environment's ``share/jupyter``; the fixture checks that the
  server sees both before any test runs. ``lab.api()`` is its REST API,
  ``lab.write_notebook()`` puts a notebook into its root, ``lab.url_for()``
  gives a page's address with the token; its log is ``lab.log_path``,
  whose tail failures quote. Beside ``hami-python3`` it has the kernelspec
  ``hami-two-gpus`` (TWO_GPU_KERNEL): the same kernel on a simulated GPU of
  its own with two devices, in the slice ``two-gpus``.
* ``browser`` (one per module): Debian's Chromium (``chromium-headless-shell``
  or ``chromium``) launched by Playwright; Playwright never downloads a
  browser here.
* ``page``: a fresh browser context and page per test, 1440x900; a failed
  test leaves ``test-artifacts/failure-<test>.png``.

Every process of one run (the server, its kernels, the browser) carries a
tag in its environment. Teardown closes the browser, stops the server
(SIGTERM, then SIGKILL), then ends anything tagged that is still alive; a
process that outlived the server fails the run.

Without Playwright or Chromium the tests are skipped with the reason, unless
``HAMI_REQUIRE_BROWSER_E2E`` is set: then they fail, so CI can never skip
them silently. dev/browser-deps.sh installs Chromium.
"""

import os
import uuid

import pytest
from chromium_browser import CHROMIUM_ARGS, VIEWPORT, require_browser
from lab_server import ARTIFACTS, TAG_ENV, running_lab

# ---- fixtures -----------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="module")
def chromium():
    return require_browser()


@pytest.fixture(scope="module")
def run_tag():
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def lab(chromium, run_tag, tmp_path_factory):
    yield from running_lab(run_tag, tmp_path_factory)


@pytest.fixture(scope="module")
def browser(chromium, run_tag, lab):
    # After the server (it needs the server's tag): closed before the server
    # stops, and the server's teardown then finds any of its leftovers too.
    from playwright.sync_api import sync_playwright

    # Never a browser download: only the Chromium found above is used.
    env = {**os.environ, TAG_ENV: run_tag, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, env=env,
                              headless=True, timeout=30_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, lab, request):
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.page_errors = errors
    try:
        yield pg
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            ARTIFACTS.mkdir(exist_ok=True)
            try:
                pg.screenshot(path=str(ARTIFACTS / f"failure-{request.node.name}.png"),
                              full_page=True, timeout=5_000)
            except Exception:  # noqa: BLE001 - a failing screenshot must not hide the failure
                pass
        context.close()
