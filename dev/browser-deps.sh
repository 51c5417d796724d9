#!/usr/bin/env bash
# What the JupyterLab browser test (tests/browser) needs beyond pip: a headless
# Chromium from Debian's packages (chromium-headless-shell, or the full
# chromium where that package does not exist), and fonts for its screenshots.
# Installed with apt-get, as root, and only when neither /usr/bin/chromium-headless-shell
# nor /usr/bin/chromium is there. The Python side, playwright, comes from pip
# (the test extra); it never downloads a browser of its own, since
# `playwright install` is never run. Quiet and idempotent; run by dev/test.sh,
# or run by hand.
set -euo pipefail

browser_deps_install() {
    local path package
    for path in /usr/bin/chromium-headless-shell /usr/bin/chromium; do
        if [ -x "$path" ]; then
            return 0
        fi
    done
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "dev/browser-deps.sh: no Chromium and no apt-get; install Debian's" \
             "chromium-headless-shell (or chromium) package for tests/browser" >&2
        return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "dev/browser-deps.sh: no Chromium; run this as root to install Debian's" \
             "chromium-headless-shell package (apt-get), or install it yourself" >&2
        return 1
    fi
    apt-get update -qq
    package=chromium-headless-shell
    if ! apt-cache show "$package" >/dev/null 2>&1; then
        package=chromium
    fi
    echo "dev/browser-deps.sh: installing $package (apt-get) for tests/browser"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "$package" fonts-liberation fonts-dejavu-core >/dev/null
    for path in /usr/bin/chromium-headless-shell /usr/bin/chromium; do
        if [ -x "$path" ]; then
            return 0
        fi
    done
    echo "dev/browser-deps.sh: apt-get installed $package, but neither" \
         "/usr/bin/chromium-headless-shell nor /usr/bin/chromium is there" >&2
    return 1
}

browser_deps_install
