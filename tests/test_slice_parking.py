"""How a parked kernel reads while its processes finish parking.

hami-park publishes PARKED once the driver has checkpointed a process; the
process's own parking thread then moves its charge from memory_used to
parked. A reader in between saw "parked" with 0 bytes parked (a GPU test of
the server's idle park caught it): until the charge has moved, the kernel is
still parking.
"""

from types import SimpleNamespace

from hami_jupyter.slice.file import Slot
from hami_jupyter.slice.layout import HAMI_PARK_PARKED, HAMI_PARK_RUNNING
from hami_jupyter.slice.parking import park_state

GiB = 1 << 30


def _slot(state, used, parked, kernel="k1"):
    return Slot(index=0, pid=100, pid_ns=0, uid=0, kernel_id=kernel, comm="python", memory_used=used,
                sm_util={}, started_unix_ns=0, active_unix_ns=0, park_state=state, parked=parked)


def _state(*slots):
    return park_state(SimpleNamespace(slots=list(slots)), "k1")


def test_checkpointed_but_not_yet_moved_reads_as_parking():
    assert _state(_slot(HAMI_PARK_PARKED, {0: 8 * GiB}, {})) == "parking"


def test_moved_reads_as_parked():
    assert _state(_slot(HAMI_PARK_PARKED, {0: 0}, {0: 8 * GiB})) == "parked"


def test_a_process_with_nothing_on_the_gpu_is_parked_at_once():
    assert _state(_slot(HAMI_PARK_PARKED, {}, {})) == "parked"


def test_a_kernel_reads_as_its_process_furthest_from_the_gpu():
    moved = _slot(HAMI_PARK_PARKED, {0: 0}, {0: GiB})
    moving = _slot(HAMI_PARK_PARKED, {0: 2 * GiB}, {})
    running = _slot(HAMI_PARK_RUNNING, {0: GiB}, {})
    assert _state(moving, running) == "parking"
    assert _state(moved, moving) == "parked"
