#!/usr/bin/env bash
# Set up and run the whole test suite, from any state of the checkout:
#   - dev/setup.sh: .venv, hami-jupyter installed editable with the test
#     extras, native/ built (release, native/build),
#   - dev/hub-deps.sh: configurable-http-proxy from npm, for tests/hub,
#   - dev/browser-deps.sh: Debian's headless Chromium, for tests/browser,
# then the passes, each run whatever the one before it did:
#   - jest: for a full run, the JupyterLab extension's TypeScript unit tests,
#   - release: pytest -ra over tests/ (arguments are passed on to pytest;
#     tests/adversarial, the attack suite, is part of it),
#   - asan, tsan: for a full run, native/ built again with ASan+UBSan
#     (native/build-asan) and with ThreadSanitizer (native/build-tsan; the TSan
#     runtime, Debian's libtsan2, is installed when missing and we may), and
#     tests/native and tests/adversarial run against each build (less the SM
#     share's timing tests, which only the release build measures).
# At the end each pass's summary is printed; the exit status is nonzero when
# any pass failed (a failing pass never hides the ones after it).
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/setup.sh test
# configurable-http-proxy (npm) for the JupyterHub end-to-end test in tests/hub,
# which must run here, never skip.
bash dev/hub-deps.sh
export HAMI_REQUIRE_HUB_E2E=1
# jupyterhub-kubespawner (the test extras) for tests/hub/test_kubespawner_profiles.py,
# which must run here, never skip.
export HAMI_REQUIRE_KUBESPAWNER=1
# Debian's headless Chromium for the JupyterLab browser test in tests/browser,
# which must run here, never skip.
bash dev/browser-deps.sh
export HAMI_REQUIRE_BROWSER_E2E=1

jobs=$(nproc 2>/dev/null || echo 2)
source dev/passes.sh

# pytest exit 5 means it collected nothing: a failure here, never a pass.
run_pytest() {
    local status=0
    .venv/bin/python -m pytest -ra "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "dev/test.sh: pytest collected no tests; that is a failure, not a pass" >&2
        return 1
    fi
    return "$status"
}

# The JupyterLab extension's TypeScript unit tests (formatting, thresholds).
jest_pass() {
    cd labextension
    ../.venv/bin/jlpm install --immutable >/dev/null
    ../.venv/bin/jlpm test
}

# The C code again, under AddressSanitizer and UndefinedBehaviorSanitizer, then
# under ThreadSanitizer (every data race in the library fails the test that met it;
# tests/adversarial brings the threads racing into every hook and the kill storm).
# What an SM share comes to in GPU time is measured by the release pass:
# under a sanitizer every launch costs many times more, so those timing tests
# would measure the sanitizer (share_accuracy); the launch paths still run
# under it in the other SM-share tests.
asan_pass() {
    make -C native -j"$jobs" BUILD=asan all sim tools
    HAMI_TEST_BUILD=asan run_pytest -m "not share_accuracy" tests/native tests/adversarial
}

# ThreadSanitizer needs its runtime (gcc: libtsan2, normally there with build-essential).
tsan_pass() {
    local probe
    probe=$(mktemp -d)
    if ! echo 'int main(void) { return 0; }' | cc -x c -fsanitize=thread -o "$probe/probe" - >/dev/null 2>&1; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "dev/test.sh: installing the ThreadSanitizer runtime (libtsan2)"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtsan2
        else
            echo "dev/test.sh: cc -fsanitize=thread does not link: install the ThreadSanitizer runtime (Debian: libtsan2)" >&2
            rm -rf "$probe"
            return 1
        fi
    fi
    rm -rf "$probe"
    make -C native -j"$jobs" BUILD=tsan all sim tools
    HAMI_TEST_BUILD=tsan run_pytest -m "not share_accuracy" tests/native tests/adversarial
}

if [ "$#" -eq 0 ]; then
    run_pass jest jest_pass
fi
run_pass release run_pytest "$@"
if [ "$#" -eq 0 ]; then
    run_pass asan asan_pass
    run_pass tsan tsan_pass
fi

passes_summary
