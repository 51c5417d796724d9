"""CuPy under a 4 GiB slice sees 4 GiB and cannot pass it (real GPU)."""

import pytest

from gpu_helpers import GiB

pytestmark = pytest.mark.gpu

LIMIT = 4 * GiB


def test_cupy_sees_and_keeps_to_the_slice(scenario, slice_env):
    pytest.importorskip("cupy")
    r = scenario("cupy_cap", slice_env(limit="4g"), LIMIT)
    print(f"cupy: total {r['total']} free {r['free']} reached {r['reached'] / GiB:.2f} GiB")
    assert r["total"] == LIMIT
    assert r["oom"]
    assert 2 * GiB <= r["reached"] <= LIMIT
