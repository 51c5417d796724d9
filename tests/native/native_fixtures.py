"""The fixtures of the native tests, shared with tests/adversarial and the agent's suites.

A conftest imports them (``from native_fixtures import ...``), which makes
them fixtures there: ``hami_build``, ``gpu``, ``make_slice``, ``cudrive``,
``root``, a slice root for the node agent's tests, and ``shared_gpu``, a
simulated GPU that processes of other users can use too (root only).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from native_helpers import CudriveRunner, SimGpu, Slice, build_name_from_env, build_native, slice_env


@pytest.fixture(scope="session")
def hami_build():
    return build_native(build_name_from_env())


@pytest.fixture
def gpu(hami_build, tmp_path):
    return SimGpu(hami_build, tmp_path / "sim-state")


@pytest.fixture
def shared_gpu(hami_build):
    """A simulated GPU whose processes may be any user's: its state made by root,
    0666 (its side folders 1777), in a folder under /tmp that every user can
    search (a test's tmp_path is root's, 0700). Skips unless the tests run as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it runs processes as another user")
    folder = Path(tempfile.mkdtemp(prefix="hami-sim-shared-", dir="/tmp"))
    folder.chmod(0o755)
    shared = SimGpu(hami_build, folder / "state")
    old = os.umask(0)
    try:
        shared.simctl("status")
    finally:
        os.umask(old)
    yield shared
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def root(tmp_path):
    """This test's slice root (``tmp_path/slices``, 0700), as the node agent's tests use it."""
    path = tmp_path / "slices"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def make_slice(gpu, tmp_path):
    def make(name="team", limit="1g", overhead="64m", **extra):
        path = tmp_path / name if name else None
        return Slice(gpu, path, slice_env(gpu, path, limit, overhead, **extra))

    return make


@pytest.fixture
def cudrive(hami_build, tmp_path):
    runner = CudriveRunner(hami_build, tmp_path)
    yield runner
    runner.teardown()
