"""Debian's headless Chromium for the browser tests (tests/browser, and
tests/hub/test_hub_view_browser.py): where it is, how it is launched, and the
check that skips (or, with ``HAMI_REQUIRE_BROWSER_E2E``, fails) a test that
lacks it, Playwright or JupyterLab. Playwright never downloads a browser here;
dev/browser-deps.sh installs Chromium.
"""

import importlib.util
import os

import pytest

REQUIRE_ENV = "HAMI_REQUIRE_BROWSER_E2E"

# Debian's packages: chromium-headless-shell (what dev/browser-deps.sh
# installs), else the full chromium.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1440, "height": 900}


def find_chromium():
    for path in CHROMIUM_CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def require_browser():
    """Chromium's path; skips (or, with HAMI_REQUIRE_BROWSER_E2E, fails) without
    Playwright, Chromium or JupyterLab."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the Python package playwright (`pip install -e '.[test]'`)")
    if importlib.util.find_spec("jupyterlab") is None:
        missing.append("jupyterlab (`pip install -e '.[test]'`)")
    chromium = find_chromium()
    if chromium is None:
        missing.append(f"Debian's Chromium ({' or '.join(CHROMIUM_CANDIDATES)}; "
                       f"run dev/browser-deps.sh as root)")
    if not missing:
        return chromium
    why = "the JupyterLab browser test needs " + " and ".join(missing)
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{why}, and {REQUIRE_ENV} is set", pytrace=False)
    pytest.skip(why)
