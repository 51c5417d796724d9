"""Fixtures of the adversarial suite: the preload library and the node agent attacked on the simulated GPU.

The suite reuses tests/native: its helpers (native_helpers.py) and fixtures of
the same names (``hami_build``, ``gpu``, ``make_slice``, ``cudrive``), so
``HAMI_TEST_BUILD=asan`` / ``tsan`` apply here too.

Randomness comes from one seed, ``HAMI_ADVERSARIAL_SEED`` (default below),
printed by every test, so that a failure can be replayed exactly:

    HAMI_ADVERSARIAL_SEED=1234 .venv/bin/python -m pytest tests/adversarial

Every test reports its counts (kills, survivors, files, outcomes by class) with
``report(...)``: the lines are printed, and shown again in the terminal summary
whether or not pytest captures output (``-s`` or not).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker"))

from native_fixtures import cudrive, gpu, hami_build, make_slice  # noqa: E402,F401 (fixtures)
# The node agent's, for the lies told to it (test_lies_to_the_agent.py).
from broker_fixtures import client, holder, root, slices, socket_path, start_agent, start_broker  # noqa: E402,F401

DEFAULT_SEED = 20261124

_REPORTS = []


def suite_seed():
    value = os.environ.get("HAMI_ADVERSARIAL_SEED", "")
    try:
        return int(value) if value else DEFAULT_SEED
    except ValueError:
        raise pytest.UsageError(f"HAMI_ADVERSARIAL_SEED={value!r} is not a whole number")


@pytest.fixture
def seed(request):
    """The suite's seed, mixed with the test's name: each test has its own stream."""
    base = suite_seed()
    return base, (base * 1_000_003 + sum(map(ord, request.node.name))) % (1 << 63)


@pytest.fixture
def report(request):
    """``report("line")``: a count for the log, printed now and in the terminal summary."""

    def add(line):
        text = f"{request.node.name}: {line}"
        print(text, flush=True)
        _REPORTS.append(text)

    return add


def pytest_terminal_summary(terminalreporter):
    if _REPORTS:
        terminalreporter.section("adversarial counts")
        for line in _REPORTS:
            terminalreporter.write_line(line)
