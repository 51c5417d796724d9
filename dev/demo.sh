#!/usr/bin/env bash
# The main job: set everything up, then execute examples/quickstart.ipynb in a
# hami-python3 kernel inside a slice and print its %hami status. Without an
# NVIDIA driver it runs on the bundled simulated GPU and says so.
# Arguments go to `hami-jupyter demo` (see --help). It installs JupyterLab (to
# open the notebook afterwards: .venv/bin/jupyter lab), not the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
source dev/setup.sh lab
exec .venv/bin/hami-jupyter demo "$@"
