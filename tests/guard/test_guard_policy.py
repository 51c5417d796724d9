"""The guard's policy alone: when a slice is over, and whom the guard acts on, in which order."""

import os

import pytest

from hami_jupyter.agent.guard.policy import (
    SliceGpu, ProcessUse, is_over, plan_kills, victim_order)

MiB = 1 << 20
GiB = 1 << 30


def proc(pid, mib, preload=False, start=None, by="environ", allowed_mib=None, charged_mib=None):
    """A process holding *mib*; *allowed_mib*: what the agent saw it hold while its
    slice was within the cap (None: never); *charged_mib*: what its slot claims."""
    return ProcessUse(pid, start if start is not None else pid, mib * MiB, preload, by,
                      charged_bytes=None if charged_mib is None else charged_mib * MiB,
                      allowed_bytes=None if allowed_mib is None else allowed_mib * MiB)


def gpu(processes, limit_mib=1024, tolerance_mib=64, uuid="GPU-0", reported_mib=0, allowance_mib=None):
    return SliceGpu("alice", "/r/alice.slice", uuid, 0, sum(p.real_bytes for p in processes),
                    reported_mib * MiB, limit_mib * MiB, tolerance_mib * MiB, list(processes),
                    None if allowance_mib is None else allowance_mib * MiB)


def pids(plan):
    return [k.process.pid for k in plan]


def test_over_means_past_the_cap_by_more_than_the_tolerance():
    assert not is_over(GiB + 64 * MiB, GiB, 64 * MiB)
    assert is_over(GiB + 64 * MiB + 1, GiB, 64 * MiB)
    assert not is_over(100 * GiB, 0, 0)  # no cap: never over


def test_a_slice_within_its_cap_loses_nothing():
    assert plan_kills([gpu([proc(10, 500), proc(11, 500)])]) == []  # 1000 MiB of 1024 + 64
    assert plan_kills([gpu([proc(10, 5000)], limit_mib=0)]) == []  # no cap


def test_processes_without_the_preload_go_first_then_the_newest():
    older_bypass = proc(10, 300, preload=False, start=100)
    newer_bypass = proc(11, 300, preload=False, start=200)
    newest_counted = proc(12, 300, preload=True, start=300, allowed_mib=300)
    oldest_counted = proc(13, 300, preload=True, start=50, allowed_mib=300)
    # Under the library and holding no more than they were seen allowed: never candidates.
    assert [p.pid for p in victim_order([oldest_counted, newest_counted, older_bypass, newer_bypass])] == [11, 10]
    # 1200 MiB: ending the newer bypass is enough.
    assert pids(plan_kills([gpu([older_bypass, newer_bypass, newest_counted, oldest_counted])])) == [11]
    # 2000 MiB with the preloaded ones bigger, each seen allowed what it holds:
    # both bypasses, and nobody else.
    big = [proc(10, 100, start=100), proc(11, 100, start=200), proc(12, 900, True, start=300, allowed_mib=900),
           proc(13, 900, True, start=50, allowed_mib=900)]
    assert pids(plan_kills([gpu(big, allowance_mib=1800)])) == [11, 10]


def test_it_stops_as_soon_as_the_slice_is_within_cap_and_tolerance():
    ps = [proc(20 + i, 200, start=i) for i in range(8)]  # 1600 MiB, none of it seen allowed
    plan = plan_kills([gpu(ps)])
    assert pids(plan) == [27, 26, 25]  # 1600 -> 1400 -> 1200 -> 1000 MiB, within 1024 + 64
    assert [k.real_before for k in plan] == [1600 * MiB, 1400 * MiB, 1200 * MiB]


def test_pid_1_the_agent_and_processes_holding_nothing_there_are_never_chosen():
    me = os.getpid()
    ps = [proc(1, 900, start=500), proc(me, 900, start=400), proc(30, 0, start=300),
          proc(31, 900, True, start=1)]
    assert pids(plan_kills([gpu(ps)])) == [31]
    assert pids(plan_kills([gpu(ps[:3])])) == []  # nothing else to end: none of them is touched


def test_only_the_gpus_asked_for_are_acted_on():
    g0 = gpu([proc(40, 2000)], uuid="GPU-0")
    g1 = gpu([proc(41, 2000)], uuid="GPU-1")
    assert pids(plan_kills([g0, g1], only={"GPU-1"})) == [41]


def test_a_process_ended_for_one_gpu_frees_its_bytes_on_the_others():
    both = 50  # on both GPUs
    g0 = gpu([proc(both, 800, start=9), proc(51, 400, True, start=1, allowed_mib=400)], uuid="GPU-0")  # 1200
    g1 = gpu([proc(both, 700, start=9), proc(52, 500, True, start=2, allowed_mib=500)], uuid="GPU-1")  # 1200
    # Ending 50 for GPU-0 brings GPU-1 to 500 MiB as well: nothing more is ended.
    assert pids(plan_kills([g0, g1])) == [both]


@pytest.mark.parametrize("limit_mib, expect", [(1024, [61]), (2048, []), (256, [61, 60])])
def test_the_cap_in_force_decides(limit_mib, expect):
    ps = [proc(60, 500, start=1), proc(61, 700, start=2)]
    assert pids(plan_kills([gpu(ps, limit_mib=limit_mib)])) == expect


def test_memory_of_a_process_already_ended_counts_as_freed():
    ps = [proc(70, 1500, start=9), proc(71, 300, True, start=1, allowed_mib=300)]  # 70 ended; NVML lists it
    assert pids(plan_kills([gpu(ps)], ended={70})) == []
    assert pids(plan_kills([gpu(ps + [proc(72, 900, start=5)])], ended={70})) == [72]


# ---- memory got within the cap in force is never a reason to act ----------------

def test_a_kernel_over_a_lowered_cap_by_what_it_held_before_is_held_not_over():
    # alice's kernel holds 26 GiB, seen within a 40 GiB cap; an administrator lowers the cap to 20 GiB.
    before = gpu([proc(10, 26 * 1024, True, start=5)], limit_mib=40 * 1024)
    assert before.state == "ok" and before.next_allowance() == 26 * GiB  # all it holds
    after = gpu([proc(10, 26 * 1024, True, start=5, allowed_mib=26 * 1024)], limit_mib=20 * 1024,
                allowance_mib=26 * 1024)
    assert not after.over and after.state == "held"
    assert plan_kills([after]) == []


def test_a_slice_first_seen_past_its_cap_is_over_not_held():
    """Issue 33: with no history of it, nothing it holds past its cap was seen
    allowed (a restarted agent has its report's history)."""
    fresh = gpu([proc(10, 26 * 1024, True, start=5, charged_mib=26 * 1024)], limit_mib=20 * 1024)
    assert fresh.over and fresh.state == "over"
    assert pids(plan_kills([fresh])) == [10]


def test_a_bypass_beside_a_held_kernel_is_chosen_and_the_kernel_is_not():
    kernel = proc(10, 26 * 1024, True, start=5, allowed_mib=26 * 1024)
    bypass = proc(11, 3 * 1024, start=9)
    g = gpu([kernel, bypass], limit_mib=20 * 1024, allowance_mib=26 * 1024)
    assert g.over
    assert pids(plan_kills([g])) == [11]


def test_held_bytes_only_shrink_while_the_slice_is_over():
    # The kernel freed 6 GiB (20 left, at the new cap), then took 6 GiB again.
    g = gpu([proc(10, 20 * 1024, True, start=5, allowed_mib=26 * 1024)], limit_mib=20 * 1024,
            allowance_mib=26 * 1024)
    assert g.next_allowance() == 20 * GiB  # within the cap: what it holds now
    g2 = gpu([proc(10, 26 * 1024, True, start=5, allowed_mib=20 * 1024)], limit_mib=20 * 1024,
             allowance_mib=20 * 1024)
    assert g2.over and g2.state == "over" and g2.next_allowance() == 20 * GiB
    assert g2.processes[0].next_allowed(g2.within_cap) == 20 * GiB


def test_a_process_grown_past_its_allowance_is_chosen_whatever_its_slot_claims():
    """Issue 33, finding 2: the slice's counter zeroed by hand, the process's slot
    charged all it holds. What it holds beyond what it was seen allowed is what
    no cap allowed: it is chosen, and the honest process beside it is not."""
    honest = proc(10, 600, True, start=1, allowed_mib=600, charged_mib=600)
    grown = proc(11, 900, True, start=2, allowed_mib=300, charged_mib=900)
    g = gpu([honest, grown], allowance_mib=900)
    assert g.over
    assert pids(plan_kills([g])) == [11]
