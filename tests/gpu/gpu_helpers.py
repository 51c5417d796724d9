"""Helpers of the GPU tests (fixtures are in conftest.py)."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "gpu_scenarios.py"
GiB = 1 << 30
MiB = 1 << 20


def parse_result(name, out, err, rc):
    """The RESULT dict a scenario printed last (its output is printed for the log)."""
    print(f"--- scenario {name}: exit {rc}\n{out}\n{err[-4000:]}")
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert results, f"scenario {name} printed no RESULT (exit {rc}):\n{out[-4000:]}\n{err[-4000:]}"
    return json.loads(results[-1])
