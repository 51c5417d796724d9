#!/usr/bin/env bash
# What the JupyterHub end-to-end test (tests/hub) needs beyond pip:
# configurable-http-proxy, JupyterHub's proxy, from npm. Installed into
# node_modules/ of this checkout (git-ignored), pinned, and only when neither
# that copy nor one on PATH is there. Quiet and idempotent; run by
# dev/test.sh, or run by hand.
#
# What Node.js it needs: the proxy's own package says Node.js >= 20
# (hub_deps_node_least below). Its commander 15 says 22.12, for programs that
# load it with require(); the proxy is an ES module and imports it, which
# Node.js 20 does (npm then warns "EBADENGINE" about commander, nothing
# more: the hub tests and a real hub ran on Node.js 20.20). So the check
# that matters is the one below: the proxy found must start and say its
# version under the node on PATH.
set -euo pipefail

hub_deps_chp_version=5.3.0
hub_deps_node_least=20

hub_deps_say_node() {
    echo "dev/hub-deps.sh: $1; the JupyterHub test needs Node.js >= $hub_deps_node_least and npm" \
         "to run configurable-http-proxy (docs/single-host.md, step 1, says how)" >&2
}

# The proxy at $1 starts under this node: its version, else why not.
hub_deps_check_runs() {
    local chp=$1 out node_major
    if ! command -v node >/dev/null 2>&1; then
        hub_deps_say_node "node is missing (configurable-http-proxy is at $chp)"
        return 1
    fi
    node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$node_major" -lt "$hub_deps_node_least" ]; then
        hub_deps_say_node "node $(node --version) is too old"
        return 1
    fi
    if ! out=$("$chp" --version 2>&1); then
        echo "dev/hub-deps.sh: $chp does not start under node $(node --version):" >&2
        echo "$out" | tail -n 5 >&2
        return 1
    fi
}

hub_deps_install() {
    local repo local_pkg have local_chp
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local_pkg="$repo/node_modules/configurable-http-proxy/package.json"
    local_chp="$repo/node_modules/.bin/configurable-http-proxy"

    if command -v configurable-http-proxy >/dev/null 2>&1; then
        hub_deps_check_runs "$(command -v configurable-http-proxy)"
        return
    fi
    if [ -x "$local_chp" ] && [ -f "$local_pkg" ]; then
        have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$local_pkg" | head -n 1)
        if [ "$have" = "$hub_deps_chp_version" ]; then
            hub_deps_check_runs "$local_chp"
            return
        fi
    fi
    if ! command -v npm >/dev/null 2>&1; then
        hub_deps_say_node "npm is missing"
        return 1
    fi
    echo "dev/hub-deps.sh: installing configurable-http-proxy@$hub_deps_chp_version into node_modules/"
    # --no-save/--no-package-lock: no package.json or lock file at the top of the checkout.
    # On Node.js 20 npm warns that commander wants 22.12 (see above): shown, not fatal.
    npm install --no-audit --no-fund --no-save --no-package-lock --loglevel=error \
        --prefix "$repo" "configurable-http-proxy@$hub_deps_chp_version" >/dev/null
    if [ ! -x "$local_chp" ]; then
        echo "dev/hub-deps.sh: npm ran, but node_modules/.bin/configurable-http-proxy is missing" >&2
        return 1
    fi
    hub_deps_check_runs "$local_chp"
}

hub_deps_install
