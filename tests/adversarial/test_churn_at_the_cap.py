"""A loop that frees and makes again one buffer size, while the slice's other processes press on its cap.

Every refusal at the cap sweeps the slice, and a sweep recounts each device's
total from the live slots to take back what processes killed half-way left.
A recount that read the total, then the slots, and swapped the total for the
sum when the total looked unchanged, was fooled by a free and a new
allocation of the same size on either side of its look at that process's
slot: the total came back to the very value it read, the sum missed the
buffer, and the slice charged less than its processes held (here: 8 MiB
short after six seconds, every run). That is room past the cap.
"""

import time

from native_helpers import MiB, slice_device

CHURNERS = 2
PRESSERS = 4
SECONDS = 6
CHURN_SIZE = "8m"


def test_a_slice_never_charges_less_than_its_processes_hold(cudrive, make_slice, gpu, report):
    s = make_slice(limit="1g", overhead="64m")
    churners = [cudrive.with_context(s.env) for _ in range(CHURNERS)]
    pressers = [cudrive.with_context(s.env) for _ in range(PRESSERS)]
    for p in churners:
        p.send(f"churn {CHURN_SIZE} {SECONDS}")
    for i, p in enumerate(pressers):
        p.send(f"race 1000000000 64m {i + 1} {SECONDS}")
    churned = [p.read(timeout=SECONDS + 120) for p in churners]
    pressed = [p.read(timeout=SECONDS + 120) for p in pressers]
    for rec in churned + pressed:
        assert rec["rc"] == 0 and rec["other"] == 0, rec
    assert sum(rec["oom"] for rec in pressed) > 0, "the pressers never reached the cap"
    # Everyone is idle now, holding only a context: the books must balance.
    time.sleep(0.2)
    snap = s.snapshot()
    charged = slice_device(snap, gpu.uuid(0)).memory_used
    held = sum(slot.memory_used.get(0, 0) for slot in snap.slots)
    report(f"{sum(r['ok'] for r in churned)} churned {CHURN_SIZE} buffers, "
           f"{sum(r['oom'] for r in pressed)} refusals at the cap; slice charges {charged / MiB:.1f} MiB, "
           f"its processes hold {held / MiB:.1f} MiB")
    assert charged >= held, (f"the slice charges {(held - charged) / MiB:.1f} MiB less than its processes "
                             f"hold ({charged} < {held} bytes)")
    assert charged == held == (CHURNERS + PRESSERS) * 64 * MiB
