"""Which kernels the broker would park for a need, from given kernels (no processes)."""

from pathlib import Path

from hami_jupyter.agent.room.kernels import Kernel, Requester, judge, plan

GiB = 1 << 30
NOW = 1_800_000_000.0


def kernel(slice_, kid, size_gib, idle_s, held_gib=None, guarantee_gib=1, **extra):
    return Kernel(slice=slice_, path=Path(f"/r/{slice_}.slice"), kernel_id=kid, pids=(hash(kid) % 1000 + 1,),
                  user=slice_, bytes=int(size_gib * GiB), last_active_unix=NOW - idle_s,
                  held=int((held_gib if held_gib is not None else size_gib) * GiB),
                  guarantee=int(guarantee_gib * GiB), **extra)


REQUESTER = Requester("carol", "k-carol", 42)


def chosen(kernels, need_gib, min_idle=60):
    eligible, _ = judge(kernels, REQUESTER, min_idle, NOW)
    found = plan(eligible, int(need_gib * GiB))
    return None if found is None else [k.kernel_id for k in found]


def test_the_idlest_first_and_none_after_the_one_that_covers_the_rest():
    ks = [kernel("a", "k-a", 2, idle_s=100), kernel("b", "k-b", 4, idle_s=300), kernel("c", "k-c", 4, idle_s=200)]
    assert chosen(ks, 3) == ["k-b"]
    assert chosen(ks, 5) == ["k-b", "k-c"]
    assert chosen(ks, 10) == ["k-b", "k-c", "k-a"]
    assert chosen(ks, 11) is None  # all of them cannot cover it: park none


def test_a_slices_kernels_count_only_down_to_its_guarantee():
    # Slice s holds 6 GiB over two kernels with a 3 GiB guarantee: parking the
    # first takes it to 3 GiB, so its second may not be parked.
    ks = [kernel("s", "k-s1", 3, idle_s=500, held_gib=6, guarantee_gib=3),
          kernel("s", "k-s2", 3, idle_s=400, held_gib=6, guarantee_gib=3),
          kernel("t", "k-t", 3, idle_s=300)]
    assert chosen(ks, 5) == ["k-s1", "k-t"]
    assert chosen(ks, 7) is None


def test_who_is_never_parked():
    ks = [kernel("carol", "k-carol", 8, idle_s=900),  # the requester's own kernel
          kernel("e", "k-e", 8, idle_s=30),  # active half a minute ago
          kernel("f", "k-f", 8, idle_s=900, held_gib=8, guarantee_gib=8),  # at its guarantee
          kernel("g", "k-g", 8, idle_s=900, state="parking"),  # being parked already
          kernel("h", "k-h", 8, idle_s=900, waiting=True),  # asks for room itself
          kernel("i", "k-i", 8, idle_s=900, guarantee_gib=0)]  # neither limit nor guarantee
    eligible, skipped = judge(ks, REQUESTER, 60, NOW)
    assert eligible == []
    assert [why.split(" ")[0] for _, why in skipped] == ["the", "active", "slice", "parking", "it", "slice"]
    assert chosen(ks + [kernel("k", "k-k", 1, idle_s=61, held_gib=2)], 1) == ["k-k"]


def test_a_slice_whose_limits_are_its_users_word_has_no_guarantee():
    """No limits file: its guarantee (or limit) is what its user wrote: it keeps nothing from a park."""
    own_word = kernel("u", "k-u", 4, idle_s=900, held_gib=4, guarantee_gib=8, limits_trusted=False)
    own_word.guarantee = 0  # what gather gives a slice whose limits are not trusted
    assert chosen([own_word], 2) == ["k-u"]
