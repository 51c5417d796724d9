"""Fixtures of the broker's tests: a real broker, real processes on the simulated GPU.

The simulated driver really moves a parked process's memory to host memory,
and its NVML reports the free bytes and each process's bytes as a driver
does: the broker's input is real. The suite reuses tests/native
(``hami_build``, ``gpu``, ``cudrive``: every process started is killed at
teardown).

* ``root``: this test's slice root (``tmp_path/slices``, 0700); ``socket_path``
  the broker's socket in it.
* ``slices.make(name, limit="8g", guarantee="1g")``: a slice file with that
  limit and guarantee; ``slices.env(name, kernel=...)`` the environment of a
  process in it, under the preload library, in that kernel.
* ``holder(env, size, age=None)``: a cudrive process holding *size* bytes on
  GPU 0 (and, with *age*, idle for that many seconds by its slot).
* ``client(env)``: a :class:`~broker_helpers.RoomClient` with CUDA started
  on GPU 0 (so it has its slot), asking over the socket.
* ``start_broker(*args)``: ``python -m hami_jupyter broker --root ROOT ...``
  (killed at teardown), returned once its first report is written.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))

import native_fixtures  # noqa: E402
from broker_helpers import START_TIMEOUT, BrokerProcess, RoomClient, age, broker_env  # noqa: E402
from native_helpers import slice_env  # noqa: E402

from hami_jupyter.slice.create import create_slice  # noqa: E402
from hami_jupyter.slice.limits import Limits  # noqa: E402
from hami_jupyter.slice.size import parse_size  # noqa: E402

hami_build, gpu, cudrive = native_fixtures.hami_build, native_fixtures.gpu, native_fixtures.cudrive


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "slices"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def socket_path(root):
    return root / "broker.sock"


class Slices:
    def __init__(self, gpu, root):
        self.gpu, self.root = gpu, root

    def path(self, name):
        return self.root / f"{name}.slice"

    def make(self, name, limit="8g", guarantee="1g"):
        path = self.path(name)
        create_slice(path, name, Limits(memory_limit=parse_size(limit),
                                        memory_guarantee=parse_size(guarantee) if guarantee else 0))
        return path

    def env(self, name, kernel=None, **extra):
        if kernel:
            extra["HAMI_KERNEL_ID"] = kernel
        return slice_env(self.gpu, self.path(name), limit=None, overhead="64m", **extra)


@pytest.fixture
def slices(gpu, root):
    return Slices(gpu, root)


@pytest.fixture
def holder(cudrive):
    def start(env, size, age_s=None, device=0):
        it = cudrive.start(env)
        it.slice = Path(env["HAMI_SLICE"])
        it.ok("init")
        it.ok(f"ctx {device}")
        sent = time.time_ns()
        it.ok(f"alloc {size}")
        if age_s is not None:
            age(it.slice, it.pid, age_s, sent)
        return it

    return start


@pytest.fixture
def client(tmp_path):
    started = []

    def start(env, device=0):
        c = RoomClient(env, tmp_path / f"client-{len(started)}.stderr")
        c.slice = Path(env["HAMI_SLICE"])
        started.append(c)
        c.init(device)
        return c

    yield start
    for c in started:
        c.teardown()


@pytest.fixture
def start_broker(gpu, root, socket_path, tmp_path):
    started = []

    def start(*args, env=None, preexec_fn=None, wait=True):
        argv = [sys.executable, "-m", "hami_jupyter", "broker", "--root", str(root), *map(str, args)]
        b = BrokerProcess(argv, env or broker_env(gpu), root, socket_path,
                          tmp_path / f"broker-{len(started)}.log", preexec_fn=preexec_fn)
        started.append(b)
        if wait:
            b.wait_report(timeout=START_TIMEOUT, what="the broker's first report")
        return b

    yield start
    for b in started:
        b.teardown()
