"""Fixtures of the guard's tests: real processes on the simulated GPU, a real guard.

The simulated NVML lists every process of the simulated GPU with the bytes
it really holds, with or without the preload library, as a driver does: the
guard's input is real. The suite reuses tests/native (``hami_build``,
``gpu``, ``cudrive``: every process started is killed at teardown).

* ``root``: this test's slice root (``tmp_path/slices``, 0700).
* ``slices.make(name, memory="1g")``: a slice file under the root with that
  cap (as the hub or a provisioner makes it); ``slices.env(name, preload=...)``
  the environment of a process in it: with the preload library, or without it
  but with ``HAMI_SLICE`` naming the slice (a bypass the guard must find).
* ``start_guard(*args)``: ``python -m hami_jupyter guard --root ROOT ...`` as a
  child process (stopped, and killed if need be, at teardown), with
  ``.reports(...)``, ``.log()``, ``.stop()``.
* ``holder(env, device, size)``: a cudrive process that holds *size* bytes on
  *device* until told otherwise.

The helpers behind them are in guard_helpers.py.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))

import native_fixtures  # noqa: E402
from guard_helpers import GUARD_START_TIMEOUT, Guard, Slices, guard_env  # noqa: E402

# The native suite's fixtures, made fixtures here by being names of this conftest.
hami_build, gpu, cudrive = native_fixtures.hami_build, native_fixtures.gpu, native_fixtures.cudrive
root = native_fixtures.root

# Helpers (guard_helpers.py) are imported by the tests under their own module
# name: every test folder has a conftest, and "from conftest import" could meet another's.


@pytest.fixture
def slices(gpu, root):
    return Slices(gpu, root)


@pytest.fixture
def start_guard(gpu, root, tmp_path):
    started = []

    def start(*args, env=None, script=None, wait=True):
        """*script*: run this file (a wrapper that patches something) instead of ``-m hami_jupyter``."""
        head = [sys.executable, str(script)] if script else [sys.executable, "-m", "hami_jupyter"]
        argv = head + ["guard", "--root", str(root), *map(str, args)]
        g = Guard(argv, env or guard_env(gpu), root, tmp_path / f"guard-{len(started)}.log")
        started.append(g)
        if wait:
            g.wait_report(timeout=GUARD_START_TIMEOUT, what="the guard's first report")
        return g

    yield start
    for g in started:
        g.kill()


@pytest.fixture
def holder(cudrive):
    def start(env, device=0, size=None):
        it = cudrive.start(env)
        it.ok("init")
        it.ok(f"ctx {device}")
        if size:
            it.ok(f"alloc {size}")
        return it

    return start
