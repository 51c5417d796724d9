#!/usr/bin/env bash
# Set up and run the whole test suite, from any state of the checkout:
#   - dev/setup.sh: .venv, hami-jupyter installed editable with the test
#     extras, native/ built (release, native/build),
#   - dev/hub-deps.sh: configurable-http-proxy from npm, for tests/hub,
#   - dev/browser-deps.sh: Debian's headless Chromium, for tests/browser,
#   - native/ built again with ASan+UBSan (native/build-asan),
#   - for a full run, the JupyterLab extension's TypeScript unit tests (jest),
#   - pytest -ra over tests/ (arguments are passed on to pytest), then, for a
#     full run, tests/native again against the sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/setup.sh
# configurable-http-proxy (npm) for the JupyterHub end-to-end test in tests/hub,
# which must run here, never skip.
bash dev/hub-deps.sh
export HAMI_REQUIRE_HUB_E2E=1
# Debian's headless Chromium for the JupyterLab browser test in tests/browser,
# which must run here, never skip.
bash dev/browser-deps.sh
export HAMI_REQUIRE_BROWSER_E2E=1
make -C native -j"$(nproc 2>/dev/null || echo 2)" BUILD=asan all sim tools

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
if [ "$#" -eq 0 ]; then
    (cd labextension && ../.venv/bin/jlpm install --immutable >/dev/null && ../.venv/bin/jlpm test)
fi
run_pytest "$@"
# The C code again, under AddressSanitizer and UndefinedBehaviorSanitizer.
if [ "$#" -eq 0 ]; then
    HAMI_TEST_BUILD=asan run_pytest tests/native
fi
