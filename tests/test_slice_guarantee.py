"""A slice's memory guarantee (slice file 1.7) survives every writer of limits.

The guarantee is set by the hub and administrators (issue 28); everything
else that writes limits (a kernel start's own settings, an admin's change of
the memory cap or SM share, the admin marks that restore limits) must carry
it through as it is, and no writer may leave a guarantee above its limit.
"""

import pytest

from hami_jupyter.admin import marks
from hami_jupyter.slice import change
from hami_jupyter.slice.create import apply_if_idle, create_limits_file, create_slice
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.limits import LimitError, Limits

GiB = 1024**3


@pytest.fixture
def slice_path(tmp_path):
    folder = tmp_path / "slices"
    path = folder / "alice.slice"
    create_slice(path, "alice", Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB))
    return path


def fallback(path):
    return read_snapshot(path).fallback_limit


def test_a_new_slice_carries_its_guarantee(slice_path):
    assert fallback(slice_path) == Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB)


def test_changing_the_cap_or_share_keeps_the_guarantee(slice_path):
    change.set_memory_limit(slice_path, None, 6 * GiB)
    change.set_sm_share(slice_path, None, 30, "elastic")
    assert fallback(slice_path) == Limits(6 * GiB, 30, "elastic", 0, memory_guarantee=2 * GiB)


def test_the_guarantee_changes_alone_and_live(slice_path):
    change.set_limits(slice_path, None, memory_guarantee=3 * GiB)
    assert fallback(slice_path) == Limits(memory_limit=8 * GiB, memory_guarantee=3 * GiB)


def test_a_guarantee_above_the_limit_is_refused_whichever_moves(slice_path):
    with pytest.raises(LimitError, match="above the memory limit"):
        change.set_limits(slice_path, None, memory_guarantee=9 * GiB)
    with pytest.raises(LimitError, match="above the memory limit"):
        change.set_memory_limit(slice_path, None, 1 * GiB)
    assert fallback(slice_path) == Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB)


def test_a_guarantee_without_a_limit_is_allowed(slice_path):
    change.set_limits(slice_path, None, memory_limit=0, memory_guarantee=4 * GiB)
    assert fallback(slice_path) == Limits(memory_guarantee=4 * GiB)


def test_a_kernel_start_keeps_the_guarantee(slice_path):
    """A kernel's own settings (HAMI_MEMORY_LIMIT...) never name a guarantee."""
    assert apply_if_idle(slice_path, Limits(memory_limit=4 * GiB))
    assert fallback(slice_path) == Limits(memory_limit=4 * GiB, memory_guarantee=2 * GiB)
    assert apply_if_idle(slice_path, Limits(memory_limit=1 * GiB))  # never above the limit
    assert fallback(slice_path) == Limits(memory_limit=1 * GiB, memory_guarantee=1 * GiB)


def test_the_limits_file_and_the_admin_marks_carry_it(tmp_path):
    path = tmp_path / "slices" / "bob.slice"
    create_slice(path, "bob", Limits())
    create_limits_file(path, Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB))
    state = marks.limits_state(path)
    change.set_limits(path, None, memory_guarantee=0)
    marks.restore(path, state)
    assert fallback(path) == Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB)


def test_the_json_form_round_trips_and_old_forms_read_as_none():
    limits = Limits(8 * GiB, 25, "hard", 2, memory_guarantee=2 * GiB)
    assert Limits.from_dict(limits.as_dict()) == limits
    assert Limits.from_dict({"memory_limit": 8 * GiB}).memory_guarantee == 0
