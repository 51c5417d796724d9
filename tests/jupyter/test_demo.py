"""`hami-jupyter demo`, the README's main job, end to end on this machine.

CI has no NVIDIA driver, so this is the simulated-GPU path: a real nbclient
run of examples/quickstart.ipynb in a hami-python3 kernel inside a 2 GiB slice.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hami_jupyter.commands.demo import nvidia_driver_present


@pytest.mark.skipif(nvidia_driver_present(), reason="this machine has a real GPU: see tests/gpu")
def test_demo_runs_the_quickstart_in_a_slice_on_the_simulated_gpu(hami_env, tmp_path):
    # Without PYTEST_CURRENT_TEST, which makes ipykernel leave the kernel's own
    # stderr alone: the demo runs as a user runs it.
    env = {k: v for k, v in os.environ.items()
           if k not in ("HAMI_SLICE_ROOT", "HAMI_SIM_STATE", "LD_LIBRARY_PATH", "PYTEST_CURRENT_TEST")}
    out_nb = tmp_path / "executed.ipynb"
    proc = subprocess.run([sys.executable, "-m", "hami_jupyter", "demo", "--output", str(out_nb)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "no NVIDIA driver found: using the bundled simulated GPU" in out
    # The cap, not the 16 GiB GPU, stopped the loop: 7 x 256 MiB + a 64 MiB context fit in 2 GiB.
    assert "the driver reports 2.00 GiB in total" in out
    assert "refused after 7 buffers of 256 MiB (1.75 GiB): CUDA_ERROR_OUT_OF_MEMORY" in out
    # The story adds up: the context's share is named, in units people read.
    assert ("in use: 1.75 GiB of data + 64 MiB for the kernel's CUDA context = 1.81 GiB of the "
            "2.00 GiB cap") in out
    [oom] = [line for line in out.splitlines() if "out of memory" in line]  # once, in its cell
    assert "of its 2.0 GiB cap in use (CUDA contexts included)" in oom
    assert "byte" not in oom.split("cap in use")[0], oom  # no raw byte counts
    assert proc.stderr == "", proc.stderr  # the kernel's own stderr went to its log
    assert "freed the buffers (1.75 GiB): back in the slice at once" in out
    assert "hami release: nothing freed: no framework that caches GPU memory is imported" in out
    statuses = re.findall(r"hami slice 'demo'.*?(?=\n--- In:|\nhami-jupyter demo: done)", out, re.S)
    assert len(statuses) == 3, out
    before, full, after = statuses
    assert "no GPU used in this slice yet" in before
    assert "1.8 GiB / 2.0 GiB (91 %)" in full and "WARNING" in full
    assert "64.0 MiB / 2.0 GiB" in after  # only the context is left after the buffers are freed
    assert out_nb.is_file()


# ---- what the Quick start commands install ------------------------------------

REPO = Path(__file__).resolve().parents[2]
RECORD = 'printf "%s\\n" "$(basename "$0") $*" >> "$CALLS"'


def _stub(path, body=RECORD):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def dev_copy(tmp_path):
    """dev/setup.sh and dev/demo.sh in a copy of the checkout whose .venv's
    python, hami-jupyter and make only record how they were called."""
    copy = tmp_path / "checkout"
    (copy / "dev").mkdir(parents=True)
    for name in ("setup.sh", "demo.sh"):
        shutil.copy2(REPO / "dev" / name, copy / "dev" / name)
    _stub(copy / ".venv" / "bin" / "python")
    _stub(copy / ".venv" / "bin" / "hami-jupyter")
    _stub(tmp_path / "bin" / "make")
    calls = tmp_path / "calls"
    env = {**os.environ, "CALLS": str(calls), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}

    def run(*command):
        calls.unlink(missing_ok=True)
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                              timeout=60)
        return done, calls.read_text().splitlines() if calls.exists() else []

    return run


def test_the_demo_installs_the_lab_extras_and_the_tests_get_the_test_extras(dev_copy):
    done, calls = dev_copy("bash", "dev/demo.sh", "--simulate")
    assert done.returncode == 0, done.stderr
    assert calls[0] == "python -m pip install --quiet --disable-pip-version-check -e .[lab]"
    assert calls[-1] == "hami-jupyter demo --simulate"  # its arguments reach the demo
    # What dev/test.sh asks for (`source dev/setup.sh test`), and a plain `source
    # dev/setup.sh` as everyone runs it: every test tool.
    for command in (["bash", "-c", "source dev/setup.sh"], ["bash", "-c", "source dev/setup.sh test"]):
        done, calls = dev_copy(*command)
        assert done.returncode == 0, done.stderr
        assert calls[0].endswith(" -e .[test]"), calls
    done, calls = dev_copy("bash", "-c", "source dev/setup.sh tset")
    assert done.returncode == 2 and calls == []
    assert "dev/setup.sh: unknown set-up 'tset': give test (the default) or lab" in done.stderr
