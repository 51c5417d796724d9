"""bench/driver_overhead.c's pairs on the simulated GPU (issue 34).

The launch-overhead rows measure what the hook adds inside one process:
blocks of launches through the entry point dlsym hands out and through the
driver's own alternate. Under the preload the first is the hook; without it
both are the driver's, and the differences are the method's own noise.
Nothing here is timed against a target: only that the right entry points
are compared and the JSON says what the rows need.
"""
import json
import subprocess

import pytest

from native_helpers import REPO, check_sanitizers, slice_env


@pytest.fixture(scope="module")
def overhead_bin(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "driver_overhead"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{REPO / 'native/include'}", "-o", str(out),
                    str(REPO / "bench/driver_overhead.c"), "-ldl"], check=True)
    return out


def _pairs(binary, env, pairs=20, block=50):
    res = subprocess.run([str(binary), "pairs", str(pairs), str(block), "0.3"], env=env,
                         capture_output=True, text=True, timeout=120)
    check_sanitizers(res.stderr, "driver_overhead")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_without_the_preload_both_sides_are_the_drivers(overhead_bin, gpu):
    env = gpu.env(HAMI_SIM_NS_PER_WAVE=0)
    if gpu.build.sanitized:
        env["LD_PRELOAD"] = gpu.build.runtime  # the simulated driver is instrumented
    doc = _pairs(overhead_bin, env)
    assert doc["mode"] == "pairs" and doc["same_entry"] is True
    assert (doc["pairs"], doc["block"], len(doc["diff_ns"])) == (20, 50, 20)
    assert doc["real_ns"] > 0 and doc["hooked_ns"] > 0
    assert doc["instructions"] is None or set(doc["instructions"]) == {"hooked", "real"}


@pytest.mark.parametrize("share", [None, 90])
def test_under_the_preload_one_side_is_the_hook(overhead_bin, gpu, tmp_path, share):
    extra = {"HAMI_SIM_NS_PER_WAVE": "0"}
    if share:
        extra["CUDA_DEVICE_SM_LIMIT"] = str(share)
    doc = _pairs(overhead_bin, slice_env(gpu, tmp_path / "bench.slice", limit=None, overhead="0", **extra))
    assert doc["same_entry"] is False
    assert len(doc["diff_ns"]) == 20
