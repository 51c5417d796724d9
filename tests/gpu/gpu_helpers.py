"""Helpers of the GPU tests (fixtures are in conftest.py)."""

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).resolve().parent / "gpu_scenarios.py"
GiB = 1 << 30
MiB = 1 << 20


def fast_park_env():
    """HAMI_TEST_FAST_PARK=0|1: the library's HAMI_FAST_PARK for every process
    a GPU test starts under it (the tests drop the caller's HAMI_* settings)."""
    value = os.environ.get("HAMI_TEST_FAST_PARK")
    return {"HAMI_FAST_PARK": value} if value in ("0", "1") else {}


def fast_park_tested():
    return fast_park_env().get("HAMI_FAST_PARK") == "1"


def parse_result(name, out, err, rc):
    """The RESULT dict a scenario printed last (its output is printed for the log)."""
    print(f"--- scenario {name}: exit {rc}\n{out}\n{err[-4000:]}")
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert results, f"scenario {name} printed no RESULT (exit {rc}):\n{out[-4000:]}\n{err[-4000:]}"
    return json.loads(results[-1])


def run_in_kernel(kc, code):
    """stdout of *code* in the kernel, then the text/plain of what it displayed;
    fails with the traceback if the cell raised."""
    out, err = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            (out if msg["content"]["name"] == "stdout" else err).append(msg["content"]["text"])
        elif msg["msg_type"] in ("display_data", "execute_result"):
            out.append(msg["content"]["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            err.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=300, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(err)
    return "".join(out)
