"""One grammar for settings, held by both sides over the same table.

The preload library (native/src/config.c, size.c) reads limits and slice names
from a process's environment; the Jupyter side (hami_jupyter.limits,
hami_jupyter.slice.paths) reads the same settings before it starts a kernel.
If the two disagree, a value Python accepts can make a kernel whose CUDA is
refused, or, worse, a value C ignores can leave a GPU less limited than the
kernel was promised. Every case below runs through both, and both must give
the answer in the table.
"""

import pytest

from hami_jupyter.slice.limits import LimitError
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.slice.paths import SliceNameError, slice_path

from native_helpers import CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS

OK, BAD = True, False

SETTINGS = [
    # sizes (native/src/size.c is the reference; tests/test_size.py has the rest)
    ("CUDA_DEVICE_MEMORY_LIMIT", "4g", OK),
    ("CUDA_DEVICE_MEMORY_LIMIT", "1536MiB", OK),
    ("CUDA_DEVICE_MEMORY_LIMIT", "1.5g", OK),
    ("CUDA_DEVICE_MEMORY_LIMIT", " 4g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "4g ", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "\t4g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "4g\n", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "0", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "-1", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "4x", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT", "", BAD),
    # SM shares: 1-3 ASCII digits, at most 100
    ("CUDA_DEVICE_SM_LIMIT", "50", OK),
    ("CUDA_DEVICE_SM_LIMIT", "0", OK),
    ("CUDA_DEVICE_SM_LIMIT", "100", OK),
    ("CUDA_DEVICE_SM_LIMIT", "050", OK),
    ("CUDA_DEVICE_SM_LIMIT", "\t50", BAD),
    ("CUDA_DEVICE_SM_LIMIT", " 50", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "50 ", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "+50", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "101", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "0050", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "5.0", BAD),
    ("CUDA_DEVICE_SM_LIMIT", "\u0665\u0660", BAD),  # Arabic-Indic digits: isdigit() says yes
    ("CUDA_DEVICE_SM_LIMIT", "", BAD),
    # decoder caps: 1-3 ASCII digits, at most 255
    ("HAMI_MAX_DECODERS", "3", OK),
    ("HAMI_MAX_DECODERS", "255", OK),
    ("HAMI_MAX_DECODERS", "256", BAD),
    ("HAMI_MAX_DECODERS", " 3", BAD),
    # modes
    ("HAMI_SM_MODE", "hard", OK),
    ("HAMI_SM_MODE", "elastic", OK),
    ("HAMI_SM_MODE", "Hard", BAD),
    ("HAMI_SM_MODE", "hard ", BAD),
    # per-GPU variables: an ordinal 0-15, no leading zeros
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g", OK),
    ("CUDA_DEVICE_MEMORY_LIMIT_15", "1g", OK),
    ("CUDA_DEVICE_MEMORY_LIMIT_16", "1g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT_00", "1g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT_01", "1g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT_x", "1g", BAD),
    ("CUDA_DEVICE_MEMORY_LIMIT_", "1g", BAD),
    ("CUDA_DEVICE_SM_LIMIT_1", "25", OK),
    ("CUDA_DEVICE_SM_LIMIT_64", "25", BAD),
    ("CUDA_DEVICE_SM_LIMIT_1", "\t25", BAD),
    ("HAMI_MAX_DECODERS_2", "4", OK),
    ("HAMI_MAX_DECODERS_16", "4", BAD),
]

SLICES = [
    ("team", OK),
    ("alice.smith", OK),
    ("a@b+c-d_e", OK),
    ("x" * 63, OK),
    ("x" * 64, BAD),
    ("..", BAD),
    (".hidden", BAD),
    (" ", BAD),
    ("a b", BAD),
    ("line\nbreak", BAD),
    ("team.slice", BAD),
    ("-team", BAD),
    ("{dir}/team.slice", OK),
    ("{dir}/cudevshr.cache", OK),
    ("{dir}/..", BAD),
    ("{dir}/a b.slice", BAD),
    ("{dir}/", BAD),
    ("{dir}/x.slice.slice", BAD),
]


def python_accepts_setting(name, value):
    try:
        resolve_limits({}, {name: value})
    except LimitError:
        return False
    return True


def c_accepts(cudrive, env):
    res = cudrive.run("init", env)
    rc = res.one("init")["rc"]
    assert rc in (CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE), res.describe()
    if rc != CUDA_SUCCESS:
        assert res.hami_lines(), f"refused without a word:\n{res.describe()}"
    return rc == CUDA_SUCCESS


@pytest.mark.parametrize("name, value, accepted", SETTINGS, ids=[f"{n}={v!r}" for n, v, _ in SETTINGS])
def test_both_sides_read_a_setting_alike(cudrive, make_slice, name, value, accepted):
    env = make_slice(limit=None).env
    env[name] = value
    assert python_accepts_setting(name, value) is accepted, "hami_jupyter.limits"
    assert c_accepts(cudrive, env) is accepted, "libvgpu.so"


@pytest.mark.parametrize("ref, accepted", SLICES, ids=[repr(r) for r, _ in SLICES])
def test_both_sides_read_a_slice_name_alike(cudrive, make_slice, tmp_path, ref, accepted):
    ref = ref.format(dir=tmp_path / "slices")
    (tmp_path / "slices").mkdir(mode=0o700)
    try:
        slice_path(ref, root=tmp_path / "slices")
        python = True
    except SliceNameError:
        python = False
    env = make_slice(limit="1g").env
    env.update(HAMI_SLICE=ref, HAMI_SLICE_ROOT=str(tmp_path / "slices"))
    assert python is accepted, "hami_jupyter.slice.paths"
    assert c_accepts(cudrive, env) is accepted, "libvgpu.so"
