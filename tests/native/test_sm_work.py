"""The model behind a hard SM share of the GPU's *work* (native/src/sm_work_model.c).

A power-limited GPU busy part of the time clocks its SMs higher than under
full load, so a busy second does more work. The model estimates that
speed-up from the GPU's power; it was fitted on an H100 (driver 580, bf16
matmul loop) and these are those measurements: a 25 / 50 / 75 % time share
drew 331 / 524 / 680 W (idle 123 W, cap 700 W) and did 29.6 / 58.0 / 82.8 %
of the full-load work. The model is built on its own and called directly.
"""

import ctypes
import subprocess

import pytest

from native_helpers import REPO

CAP, IDLE = 700_000, 123_000  # milliwatts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    lib = tmp_path_factory.mktemp("sm_work") / "libsmwork.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(REPO / "native/src/sm_work_model.c"),
                    "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    fn = so.hami_sm_speedup_model
    fn.argtypes = [ctypes.c_uint32] * 4
    fn.restype = ctypes.c_uint32
    return lambda power_mw, busy, cap=CAP, idle=IDLE: fn(power_mw, cap, idle, busy) / 1000


@pytest.mark.parametrize("power_mw, busy, work_pct", [(331_000, 25, 29.6), (524_000, 50, 58.0), (680_000, 76, 82.8)])
def test_the_h100_matmul_figures_are_met_within_two_points(model, power_mw, busy, work_pct):
    # The controller holds busy x speed-up at the share: the work it then
    # predicts for this busy time is within 2 points of what was measured.
    assert abs(busy * model(power_mw, busy) - work_pct) <= 2.0


def test_work_the_cap_would_not_bind_counts_as_its_time(model):
    # A memory-bound copy kernel: 404 W at full duty, far below the cap.
    assert model(404_000, 100) == 1.0
    assert model(200_000, 25) == 1.0  # the same at a quarter of the time
    # The matmul at full load: the cap binds already, no speed-up to take away.
    assert model(697_000, 99) == pytest.approx(1.0, abs=0.01)


def test_nothing_known_means_no_speed_up(model):
    assert model(400_000, 2) == 1.0  # too little work to tell
    assert model(100_000, 50) == 1.0  # below the idle power
    assert model(400_000, 50, cap=0) == 1.0  # no power cap read
    assert model(400_000, 50, idle=CAP) == 1.0


def test_the_speed_up_is_bounded(model):
    assert model(700_000, 5) == 1.5
