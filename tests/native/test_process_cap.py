"""HAMI_PROCESS_MEMORY_LIMIT: a process's own cap, nested inside its slice's.

Under the hub every kernel runs in the hub's slice; a kernel that asks for
less than the slice holds gets its own cap this way (hami_jupyter/provisioner.py).
"""

from native_helpers import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB


def test_a_process_stops_at_its_own_cap_and_the_slice_keeps_the_rest(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    capped = cudrive.start({**s.env, "HAMI_PROCESS_MEMORY_LIMIT": "1g"})
    capped.ok("init")
    capped.ok("ctx 0")
    info = capped.ok("meminfo")
    assert info["total"] == GiB and info["free"] == GiB - 64 * MiB  # it sizes itself to its own cap
    assert capped.ok("totalmem 0")["total"] == GiB
    rec = capped.ok("fill 64m")
    assert rec["last_rc"] == CUDA_ERROR_OUT_OF_MEMORY and rec["bytes"] == GiB - 64 * MiB, rec
    assert "HAMI_PROCESS_MEMORY_LIMIT" in capped.stderr()
    # Another process of the slice has the rest of the slice's 4 GiB.
    other = cudrive.start(s.env)
    other.ok("init")
    other.ok("ctx 0")
    rec = other.ok("fill 64m")
    assert rec["bytes"] == 3 * GiB - 64 * MiB, rec
    assert s.used(0) == 4 * GiB
    # What the capped process frees, it may take again; never more, even with
    # the slice's room free again.
    capped.ok("freeall")
    other.ok("freeall")
    rec = capped.ok("fill 64m")
    assert rec["bytes"] == GiB - 64 * MiB, rec
    assert s.used(0) == 2 * 64 * MiB + GiB - 64 * MiB


def test_a_malformed_process_cap_fails_closed(cudrive, make_slice):
    s = make_slice(limit="4g")
    for bad in ("0", "1 g", "-1", "lots"):
        res = cudrive.run("init", {**s.env, "HAMI_PROCESS_MEMORY_LIMIT": bad})
        assert res.rcs("init") == [CUDA_ERROR_INVALID_VALUE], (bad, res)
        assert "HAMI_PROCESS_MEMORY_LIMIT" in res.stderr, bad
