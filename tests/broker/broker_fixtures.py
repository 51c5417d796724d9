"""The broker's fixtures, as functions, for every suite that starts an agent (tests/broker's
conftest names them; tests/agent's and tests/adversarial's too): see tests/broker/conftest.py."""

import sys
import time
from pathlib import Path

import pytest

from broker_helpers import START_TIMEOUT, BrokerProcess, RoomClient, age, broker_env
from native_fixtures import root  # noqa: F401 (a fixture, named here for the suites that import these)
from native_helpers import slice_env

from hami_jupyter.slice.create import create_slice
from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.size import parse_size


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


def _agent_fixture(command, doc):
    """A fixture starting ``python -m hami_jupyter COMMAND --root ROOT ...``
    (each one killed at teardown), returned once its first report is written."""

    @pytest.fixture(name=f"start_{command}")
    def fixture(gpu, root, socket_path, tmp_path):
        started = []

        def start(*args, env=None, preexec_fn=None, wait=True):
            argv = [sys.executable, "-m", "hami_jupyter", command, "--root", str(root), *map(str, args)]
            b = BrokerProcess(argv, env or broker_env(gpu), root, socket_path,
                              tmp_path / f"{command}-{len(started)}.log", preexec_fn=preexec_fn)
            started.append(b)
            if wait:
                b.wait_report(timeout=START_TIMEOUT, what=f"the {command}'s first report")
            return b

        yield start
        for b in started:
            b.teardown()

    fixture.__doc__ = doc
    return fixture


start_broker = _agent_fixture("broker", "``hami-jupyter broker``: the agent with the room policy alone.")
start_agent = _agent_fixture("agent", "``hami-jupyter agent``: both policies.")
