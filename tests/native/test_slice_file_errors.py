"""A slice file the library cannot trust is refused clearly: never a crash, never unlimited."""

import struct

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, SIM_CONTEXT

VERSION_MAJOR_OFFSET = 8  # after the 8-byte magic (slice_file.h)


def _valid_slice(cudrive, make_slice):
    s = make_slice(name="team", limit="1g", overhead="64m")
    res = cudrive.run("init ctx 0", s.env)
    assert res.rcs("ctx") == [CUDA_SUCCESS], res.describe()
    assert s.path.stat().st_size > 4096
    return s


def _check_refused(cudrive, gpu, s, problem):
    p = cudrive.start(s.env)
    init = p.cmd("init")
    assert init["rc"] == CUDA_ERROR_INVALID_VALUE, (init, p.stderr())
    p.cmd("ctx 0")
    assert p.cmd("alloc 1m")["rc"] != CUDA_SUCCESS
    assert gpu.process_used(p.pid, 0) <= SIM_CONTEXT  # the GPU never saw the allocation
    assert p.close() == 0
    lines = [line for line in p.stderr().splitlines() if line.startswith("hami:")]
    assert any(str(s.path) in line and problem in line for line in lines), p.stderr()


def test_bad_magic(cudrive, make_slice, gpu):
    s = _valid_slice(cudrive, make_slice)
    with open(s.path, "r+b") as f:
        f.write(b"NOTASLCE")
    _check_refused(cudrive, gpu, s, "not a hami slice file")


def test_foreign_file(cudrive, make_slice, gpu):
    s = make_slice(name="notes.txt")
    s.path.write_bytes(b"some notes, not a slice\n" * 1000)
    _check_refused(cudrive, gpu, s, "not a hami slice file")
    assert s.path.read_bytes() == b"some notes, not a slice\n" * 1000  # left untouched


@pytest.mark.parametrize("keep", [100, 4096], ids=["inside-header", "after-header"])
def test_truncated(cudrive, make_slice, gpu, keep):
    s = _valid_slice(cudrive, make_slice)
    with open(s.path, "r+b") as f:
        f.truncate(keep)
    _check_refused(cudrive, gpu, s, "truncated")


def test_unknown_major_version(cudrive, make_slice, gpu):
    s = _valid_slice(cudrive, make_slice)
    with open(s.path, "r+b") as f:
        f.seek(VERSION_MAJOR_OFFSET)
        f.write(struct.pack("=II", 2, 0))
    _check_refused(cudrive, gpu, s, "version 2.0")
