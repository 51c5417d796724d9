"""Sizes that do not fit in 64 bits are refused, never wrapped into small ones.

A request of SIZE_MAX bytes, or a pitched allocation or an array whose
dimensions multiply past 2^64, must leave the slice's counter exactly where
it was: with no limit set, a wrapped sum once took a slice holding 164 MiB
to 0 while the memory was still held.
"""

import pytest

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, MiB, SIM_CONTEXT

SIZE_MAX = (1 << 64) - 1
HUGE = ["alloc 18446744073709551615", "managed 18446744073709551615", "async 18446744073709551615",
        "pitch 4294967296 4294967296 4", "array 4294967296 4294967296 FLOAT 4",
        "array3d 65536 65536 65536 FLOAT 4", "mipmap 65536 65536 65536 FLOAT 4 3"]


@pytest.mark.parametrize("limit", [None, "1g"], ids=["no-limit", "limit"])
@pytest.mark.parametrize("line", HUGE, ids=[h.split()[0] for h in HUGE])
def test_a_size_past_64_bits_is_refused_and_the_counter_stays(cudrive, make_slice, limit, line):
    s = make_slice(limit=limit, overhead="64m")
    p = cudrive.with_context(s.env, "alloc 100m A")
    before = s.used()
    assert before == SIM_CONTEXT + 100 * MiB
    rec = p.cmd(line)
    assert rec["rc"] != 0, rec
    assert s.used() == before, f"{line}: the slice went from {before} to {s.used()}"
    # The slice still works: what fits is charged, and freed back to where it was.
    p.ok("alloc 64m B")
    assert s.used() == before + 64 * MiB
    p.ok("free B")
    assert s.used() == before


def test_the_refusal_says_why(cudrive, make_slice):
    s = make_slice(limit=None, overhead="64m")
    p = cudrive.with_context(s.env)
    assert p.cmd(f"alloc {SIZE_MAX}")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert "more than any GPU holds" in p.stderr()
