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


# ---- how every view shows it: %hami status (text, HTML, JSON), REST, Prometheus ----

UUID = "GPU-9a7e0000-0000-4000-8000-000000000000"


@pytest.fixture
def lending(tmp_path):
    """A slice of one GPU (16 GiB) capped at 8 GiB, 2 GiB of it guaranteed."""
    path = tmp_path / "slices" / "carol.slice"
    create_slice(path, "carol", Limits(memory_limit=8 * GiB, memory_guarantee=2 * GiB),
                 devices=[(UUID, 16 * GiB)])
    return path


def test_each_gpu_of_the_status_carries_the_guarantee_in_force(lending, slice_path):
    from hami_jupyter.slice.status import slice_status

    (gpu,) = slice_status(lending)["gpus"]
    assert (gpu["memory_limit"], gpu["memory_guarantee"]) == (8 * GiB, 2 * GiB)
    # No guarantee set: the limit is the guarantee.
    change.set_limits(lending, None, memory_guarantee=0)
    assert slice_status(lending)["gpus"][0]["memory_guarantee"] == 8 * GiB


def test_the_text_and_html_say_what_is_guaranteed_of_the_cap(lending):
    from hami_jupyter.slice.status import format_text, slice_status
    from hami_jupyter.slice.status_html import format_html

    status = slice_status(lending)
    assert "guaranteed 2.0 GiB of the 8.0 GiB cap: the rest is lent" in format_text(status)
    assert "guaranteed 2.0&nbsp;GiB of the 8.0&nbsp;GiB cap" in format_html(status)
    change.set_limits(lending, None, memory_guarantee=0)  # as everywhere without oversubscription
    status = slice_status(lending)
    assert "guaranteed" not in format_text(status) and "guaranteed" not in format_html(status)


def test_a_slice_without_a_gpu_yet_says_what_each_gpu_gets(slice_path):
    from hami_jupyter.slice.status import format_text, slice_status

    assert ("each GPU gets: 8.0 GiB (guaranteed 2.0 GiB of the 8.0 GiB cap)"
            in format_text(slice_status(slice_path)))


def test_a_process_waiting_for_room_says_how_much_since_when(lending):
    import os
    import time

    from live_slots import live_slot

    from hami_jupyter.slice.status import format_text, slice_status
    from hami_jupyter.slice.status_html import format_html

    since = time.time() - 60
    fd = live_slot(lending, 0, pid=os.getpid(), kernel_id="k-waits", used={0: GiB},
                   room_wait_since_unix_ns=int(since * 1e9), room_wait_bytes=6 * GiB,
                   room_wait_device=0)
    try:
        status = slice_status(lending)
    finally:
        os.close(fd)
    clock = time.strftime("%H:%M", time.localtime(since))
    (kernel,) = status["kernels"]
    assert kernel["room_wait"]["bytes"] == 6 * GiB
    assert f"waiting for 6.0 GiB of GPU room since {clock}" in format_text(status)
    assert f"waiting for 6.0&nbsp;GiB of GPU room since {clock}" in format_html(status)


def test_rest_and_prometheus_carry_the_guarantee(lending):
    from prometheus_client.core import GaugeMetricFamily  # noqa: F401 (the server's extra)

    from hami_jupyter.server import kernel_slices, metrics
    from hami_jupyter.slice.status import slice_status

    status = slice_status(lending)
    assert kernel_slices.summary(status, "none")["memory_guarantee"] == 2 * GiB
    families = metrics._families()
    metrics.add_slice(families, status, set())
    (sample,) = families["hami_slice_memory_guarantee_bytes"].samples
    assert sample.labels["gpu_uuid"] == UUID and sample.value == 2 * GiB


def test_limits_describe_the_guarantee_only_below_the_cap():
    assert Limits(8 * GiB, memory_guarantee=2 * GiB).describe() == (
        "memory 8.0 GiB (2.0 GiB guaranteed), SM unlimited")
    assert Limits(8 * GiB, memory_guarantee=8 * GiB).describe() == "memory 8.0 GiB, SM unlimited"
    assert Limits(8 * GiB).describe() == "memory 8.0 GiB, SM unlimited"
