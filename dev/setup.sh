#!/usr/bin/env bash
# Set up a working copy from any state: a virtual environment in .venv
# (created on first use), hami-jupyter installed into it editable with the
# extras named by the first argument (its kernelspec and provisioner
# included), and native/ built. Sourced by dev/demo.sh and dev/test.sh.
#
#   source dev/setup.sh        the test extras: everything the tests need (the default)
#   source dev/setup.sh test   the same
#   source dev/setup.sh lab    JupyterLab and what the demo notebook needs, no test tools
#
# Extras only ever add: a .venv set up for the tests keeps them after a lab
# set-up, and one set up for the demo gets the rest when the tests set it up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras=${1:-test}
case "$extras" in
    test|lab) ;;
    *) echo "dev/setup.sh: unknown set-up '$extras': give test (the default) or lab" >&2
       return 2 2>/dev/null || exit 2 ;;
esac
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
make -C native -j"$(nproc 2>/dev/null || echo 2)" all sim tools
