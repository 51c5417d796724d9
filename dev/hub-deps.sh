#!/usr/bin/env bash
# What the JupyterHub end-to-end test (tests/hub) needs beyond pip:
# configurable-http-proxy, JupyterHub's proxy, from npm. Installed into
# node_modules/ of this checkout (git-ignored), pinned, and only when neither
# that copy nor one on PATH is there. Quiet and idempotent; run by
# dev/test.sh, or run by hand.
set -euo pipefail

hub_deps_chp_version=5.3.0

hub_deps_install() {
    local repo local_pkg have
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local_pkg="$repo/node_modules/configurable-http-proxy/package.json"

    if command -v configurable-http-proxy >/dev/null 2>&1; then
        return 0
    fi
    if [ -x "$repo/node_modules/.bin/configurable-http-proxy" ] && [ -f "$local_pkg" ]; then
        have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$local_pkg" | head -n 1)
        if [ "$have" = "$hub_deps_chp_version" ]; then
            return 0
        fi
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "dev/hub-deps.sh: npm is missing; the JupyterHub test needs Node.js >= 22.12 and npm" \
             "to install configurable-http-proxy (docs/single-host.md, step 1, says how)" >&2
        return 1
    fi
    echo "dev/hub-deps.sh: installing configurable-http-proxy@$hub_deps_chp_version into node_modules/"
    # --no-save/--no-package-lock: no package.json or lock file at the top of the checkout.
    npm install --no-audit --no-fund --no-save --no-package-lock --loglevel=error \
        --prefix "$repo" "configurable-http-proxy@$hub_deps_chp_version" >/dev/null
    if [ ! -x "$repo/node_modules/.bin/configurable-http-proxy" ]; then
        echo "dev/hub-deps.sh: npm ran, but node_modules/.bin/configurable-http-proxy is missing" >&2
        return 1
    fi
}

hub_deps_install
