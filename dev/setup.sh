#!/usr/bin/env bash
# Set up a working copy from any state: a virtual environment in .venv
# (created on first use), hami-jupyter installed into it editable with the
# test extras (its kernelspec and provisioner included), and native/ built.
# Sourced by dev/demo.sh and dev/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
make -C native -j"$(nproc 2>/dev/null || echo 2)" all sim tools
