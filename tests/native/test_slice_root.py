"""A slice named without a path is the same file for the C library and for Python.

``HAMI_SLICE=alice`` in a kernel and ``slice_path("alice")`` in a tool must
name one file, or the tool shows a slice nobody uses while the kernel's
limits are set elsewhere. The order of the slice roots and their names are
in slice_file.h, which the layout test holds against the Python mirror; this
runs both sides on every case of that order and compares where the library
really made the file with where Python looks.
"""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from hami_jupyter.slice.layout import HAMI_HUB_SLICE_ROOT, HAMI_SLICE_ROOT_TMP_PREFIX
from hami_jupyter.slice.paths import slice_path

HUB_ROOT = Path(HAMI_HUB_SLICE_ROOT)


def made_by_library(cudrive, make_slice, name, **env):
    """Where the library, in a process with ``HAMI_SLICE=name`` and *env*, made the slice."""
    s = make_slice(name=None, **{"HAMI_SLICE": name, "HAMI_SLICE_ROOT": None,
                                 "XDG_RUNTIME_DIR": None, **env})
    res = cudrive.run("init ctx 0 alloc 1m", s.env)
    assert res.rcs("alloc") == [0], res.describe()
    python_env = {k: v for k, v in s.env.items() if k in ("HAMI_SLICE_ROOT", "XDG_RUNTIME_DIR")}
    return s.env, Path(slice_path(name, env=python_env))


def test_hami_slice_root_first(cudrive, make_slice, tmp_path):
    name = f"root-{uuid.uuid4().hex[:8]}"
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    _, expected = made_by_library(cudrive, make_slice, name, HAMI_SLICE_ROOT=str(tmp_path / "mine"),
                                  XDG_RUNTIME_DIR=str(xdg))
    assert expected == tmp_path / "mine" / f"{name}.slice" and expected.is_file()
    assert not list(xdg.rglob("*.slice"))


@pytest.mark.skipif(HUB_ROOT.is_dir(), reason=f"{HUB_ROOT} exists here: it comes before XDG_RUNTIME_DIR")
def test_xdg_runtime_dir_without_a_hub(cudrive, make_slice, tmp_path):
    name = f"xdg-{uuid.uuid4().hex[:8]}"
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    _, expected = made_by_library(cudrive, make_slice, name, XDG_RUNTIME_DIR=str(xdg))
    assert expected == xdg / "hami-jupyter" / f"{name}.slice" and expected.is_file()


@pytest.mark.skipif(HUB_ROOT.is_dir(), reason=f"{HUB_ROOT} exists here: it comes before /tmp")
def test_tmp_last(cudrive, make_slice):
    name = f"tmp-{uuid.uuid4().hex[:8]}"
    _, expected = made_by_library(cudrive, make_slice, name)
    try:
        assert expected == Path(f"{HAMI_SLICE_ROOT_TMP_PREFIX}{os.getuid()}") / f"{name}.slice"
        assert expected.is_file()
    finally:
        for leftover in expected.parent.glob(f"{name}.slice*"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason=f"making {HUB_ROOT} needs root")
def test_the_hubs_root_comes_before_xdg_and_tmp(cudrive, make_slice, tmp_path):
    made = not HUB_ROOT.exists()
    if made:
        HUB_ROOT.mkdir(mode=0o755)
    name = f"hub-{uuid.uuid4().hex[:8]}"
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    try:
        _, expected = made_by_library(cudrive, make_slice, name, XDG_RUNTIME_DIR=str(xdg))
        assert expected == HUB_ROOT / f"{name}.slice" and expected.is_file()
        assert not list(xdg.rglob("*.slice"))
    finally:
        for leftover in HUB_ROOT.glob(f"{name}.slice*"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        if made:
            shutil.rmtree(HUB_ROOT)
