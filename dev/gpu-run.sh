#!/usr/bin/env bash
# Run a command on the GPU machine (the device tool) from this checkout:
#   dev/gpu-run.sh env HAMI_TEST_GPU=1 python3 -m pytest -v tests/gpu
# That machine has PyTorch, CuPy, JAX and a C compiler but no Jupyter packages
# and no network: they travel as wheels in .whl/ (ignored by git; fetch them
# here with the `pip download` line in docs/benchmarks.md). hami-jupyter itself
# runs from this checkout: a small dist-info makes its kernel provisioner's
# entry point visible without building a wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
site=/tmp/hami-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
dist="$site/hami_jupyter-0+checkout.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: hami-jupyter\nVersion: 0+checkout\n' >"$dist/METADATA"
printf '[jupyter_client.kernel_provisioners]\nhami-provisioner = hami_jupyter.provisioning.provisioner:HamiProvisioner\n' \
    >"$dist/entry_points.txt"
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$site/bin:$PATH"
make -C native -j"$(nproc)" all sim tools >/dev/null
exec "$@"
