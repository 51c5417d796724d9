"""A hub-owned limits file beside the slice file is the authority on limits."""

import os

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB

from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.layout import limits_file_path
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.change import limits_target, set_memory_limit
from hami_jupyter.slice.create import create_limits_file, create_slice


def hub_slice(s, memory, in_file=None):
    """The slice file with its own limits block at *in_file* (or none) and a
    limits file at *memory*, as the hub makes them."""
    create_slice(s.path, "team", Limits(memory_limit=in_file or 0))
    create_limits_file(s.path, Limits(memory_limit=memory))


def test_limits_file_wins_over_the_slice_files_own_block(cudrive, make_slice):
    s = make_slice(name="team.slice", limit="4g", overhead="0")  # the env's 4g is not used
    hub_slice(s, memory=GiB, in_file=8 * GiB)
    res = cudrive.run("init ctx 0 meminfo alloc 1g alloc 1", s.env)
    assert res.one("meminfo")["total"] == GiB, res.describe()
    assert res.rcs("alloc") == [0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    snap = read_snapshot(s.path)
    assert snap.limits_file == limits_file_path(s.path)
    assert snap.devices[0].limit.memory_limit == GiB


def test_a_change_to_the_limits_file_applies_live(cudrive, make_slice):
    s = make_slice(name="team.slice", limit=None, overhead="0")
    hub_slice(s, memory=GiB)
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    assert p.cmd("alloc 1536m big")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert limits_target(s.path)[0] == limits_file_path(s.path)
    set_memory_limit(s.path, None, 2 * GiB)  # written to the limits file
    p.ok("alloc 1536m big")
    with open(s.path, "rb") as f:  # the slice file's own block was not touched
        assert read_snapshot(s.path).fallback_limit.memory_limit == 2 * GiB
        assert f.read(64)[:8] == b"HAMISLCE"


def test_a_damaged_limits_file_fails_closed(cudrive, make_slice):
    s = make_slice(name="team.slice", limit="4g", overhead="0")
    create_slice(s.path, "team", Limits(memory_limit=4 * GiB))
    with open(limits_file_path(s.path), "wb") as f:
        f.write(b"garbage" * 10)
    res = cudrive.run("init ctx 0 alloc 1m", s.env)
    # CUDA does not start in the process: no allocation, limited or not.
    assert res.one("init")["rc"] != 0 and res.rcs("alloc") != [0], res.describe()
    assert "is not a hami limits file" in res.stderr


def test_a_limits_file_of_an_unknown_version_is_refused(cudrive, make_slice):
    s = make_slice(name="team.slice", limit="4g", overhead="0")
    create_slice(s.path, "team", Limits(memory_limit=4 * GiB))
    path, _ = create_limits_file(s.path, Limits(memory_limit=GiB))
    data = bytearray(path.read_bytes())
    data[8:12] = (2).to_bytes(4, "little")
    os.unlink(path)
    path.write_bytes(bytes(data))
    res = cudrive.run("init ctx 0 alloc 1m", s.env)
    # CUDA does not start in the process: no allocation, limited or not.
    assert res.one("init")["rc"] != 0 and res.rcs("alloc") != [0], res.describe()
    assert "layout version 2.0" in res.stderr
