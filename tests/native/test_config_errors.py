"""Malformed limits fail closed: a clear error, never a crash, never "no limit"."""

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, SIM_CONTEXT, SIM_MEMORY

BAD_VALUES = ["4x", "-1g", "0", "", "1.5.3g", "99999999999t"]


def _quoted(value, text):
    return f'"{value}"' in text or f"'{value}'" in text


def _check_refused(cudrive, gpu, env, variable, value):
    p = cudrive.start(env)
    init = p.cmd("init")
    assert init["rc"] == CUDA_ERROR_INVALID_VALUE, (init, p.stderr())
    p.cmd("ctx 0")
    alloc = p.cmd("alloc 1m")
    assert alloc["rc"] != CUDA_SUCCESS, "a malformed limit must not mean 'no limit'"
    # The GPU agrees: the allocation never happened.
    assert gpu.process_used(p.pid, 0) <= SIM_CONTEXT
    assert p.close() == 0  # no crash, cudrive went on to the end
    lines = [line for line in p.stderr().splitlines() if line.startswith("hami:")]
    naming = [line for line in lines if variable in line]
    assert len(naming) == 1, f"expected one hami: line naming {variable}, got:\n{p.stderr()}"
    assert _quoted(value, naming[0]), naming[0]


@pytest.mark.parametrize("value", BAD_VALUES, ids=[v or "empty" for v in BAD_VALUES])
def test_malformed_limit_is_refused(cudrive, make_slice, gpu, value):
    s = make_slice(limit=value, overhead="64m")
    _check_refused(cudrive, gpu, s.env, "CUDA_DEVICE_MEMORY_LIMIT", value)


@pytest.mark.parametrize("value", ["abc", "1.5.3g", "0"])
def test_malformed_per_device_limit_is_refused(cudrive, make_slice, gpu, value):
    s = make_slice(limit="4g", overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_1=value)
    _check_refused(cudrive, gpu, s.env, "CUDA_DEVICE_MEMORY_LIMIT_1", value)


def test_malformed_limit_refused_without_a_slice_file(cudrive, make_slice, gpu):
    s = make_slice(name=None, limit="4x", overhead="64m")
    _check_refused(cudrive, gpu, s.env, "CUDA_DEVICE_MEMORY_LIMIT", "4x")


def test_unset_limit_means_no_limit(cudrive, make_slice):
    s = make_slice(limit=None, overhead="64m")
    res = cudrive.run("init totalmem 0 ctx 0 alloc 15g", s.env)
    assert res.one("init")["rc"] == CUDA_SUCCESS, res.describe()
    assert res.one("totalmem")["total"] == SIM_MEMORY, res.describe()
    assert res.rcs("alloc") == [CUDA_SUCCESS], res.describe()
    assert not res.hami_lines(), res.describe()


@pytest.mark.parametrize("value", ["2s", "-1", "", " 5", "1.5", "86401", "999999"])
def test_malformed_room_wait_is_refused(cudrive, make_slice, gpu, value):
    """HAMI_ROOM_WAIT (seconds to wait for the memory broker) fails closed like a limit."""
    s = make_slice(limit="1g", overhead="64m", HAMI_ROOM_WAIT=value)
    _check_refused(cudrive, gpu, s.env, "HAMI_ROOM_WAIT", value)


@pytest.mark.parametrize("value", ["", "broker.sock", "/" + "x" * 120])
def test_malformed_broker_socket_is_refused(cudrive, make_slice, gpu, value):
    s = make_slice(limit="1g", overhead="64m", HAMI_BROKER_SOCKET=value)
    _check_refused(cudrive, gpu, s.env, "HAMI_BROKER_SOCKET", value)


@pytest.mark.parametrize("value", ["0", "2", "86400"])
def test_room_wait_takes_whole_seconds(cudrive, make_slice, value):
    s = make_slice(limit="1g", overhead="64m", HAMI_ROOM_WAIT=value)
    res = cudrive.run("init ctx 0 alloc 64m", s.env)
    assert res.rcs("alloc") == [CUDA_SUCCESS] and not res.hami_lines(), res.describe()


@pytest.mark.parametrize("value", ["", "2", "yes", " 1"])
def test_malformed_fast_park_is_refused(cudrive, make_slice, gpu, value):
    """HAMI_FAST_PARK is 0 or 1: anything else fails closed like a limit."""
    s = make_slice(limit="1g", overhead="64m", HAMI_FAST_PARK=value)
    _check_refused(cudrive, gpu, s.env, "HAMI_FAST_PARK", value)


def test_malformed_fast_park_keep_is_refused(cudrive, make_slice, gpu):
    s = make_slice(limit="1g", overhead="64m", HAMI_FAST_PARK="1", HAMI_FAST_PARK_KEEP="lots")
    _check_refused(cudrive, gpu, s.env, "HAMI_FAST_PARK_KEEP", "lots")
