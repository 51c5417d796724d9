"""The fixtures of the native tests, shared with tests/adversarial and the agent's suites.

A conftest imports them (``from native_fixtures import ...``), which makes
them fixtures there: ``hami_build``, ``gpu``, ``make_slice``, ``cudrive``,
and ``root``, a slice root for the node agent's tests.
"""

import pytest

from native_helpers import CudriveRunner, SimGpu, Slice, build_name_from_env, build_native, slice_env


@pytest.fixture(scope="session")
def hami_build():
    return build_native(build_name_from_env())


@pytest.fixture
def gpu(hami_build, tmp_path):
    return SimGpu(hami_build, tmp_path / "sim-state")


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
