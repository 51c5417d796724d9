"""The room policy's plan: from the facts of one GPU, the next step for a request or the headroom.

Everything here is decided from figures the room loop (:mod:`hami_jupyter.agent.rooms`)
gathered: NVML's free bytes, what the room ledger keeps (the reserve, and
the grants of other requesters), the kernels on the GPU (:mod:`.kernels`);
nothing is read here. A step is one of:

- :class:`Grant`: the room is there: the requester gets it, kept for it in the
  ledger while it takes it;
- :class:`Park`: park this kernel, then look again;
- :class:`Refuse`: no kernel that may be parked covers what is missing, so
  none is parked (a park that would not do is a kernel stopped for nothing).

Sizes are compared in bytes, and said in bytes where the rounded figures
would read alike ("could free only 18.8 GiB" against "18.8 GiB needed" said
nothing on an H200).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...slice.size import format_size
from .kernels import judge, plan, why_none

# A wait that comes back after an OK: the driver refused what NVML called free
# (the driver takes memory of its own beside an allocation). It is asked this
# much more, once: never more than what the driver refused again.
STEP = 256 << 20


@dataclass(frozen=True)
class Grant:
    bytes: int


@dataclass(frozen=True)
class Park:
    kernel: object  # kernels.Kernel


@dataclass(frozen=True)
class Refuse:
    why: str
    kind: str


def wanted(asked, oks, room=None, parked_bytes=0):
    """The free bytes that serve a request of *asked* bytes whose wait was answered
    OK *oks* times already: once one OK did not do, :data:`STEP` more (at most
    *asked* more: repeated OKs to one wait do not grow it past what the driver
    refused); at least what the agent saw its process hold before it parked it
    (*parked_bytes*: a resume needs its context back too); never more than its
    slice's *room* (limit less use) allows plus that step."""
    extra = min(STEP, asked) if oks else 0
    want = max(asked + extra, parked_bytes)
    if room is not None:
        want = min(want, max(asked, room) + extra)
    return want


def room_there(free, kept, want):
    """Whether *want* bytes are free beyond the *kept* ones (the reserve, others' grants)."""
    return free is not None and free - kept >= want


def choose(kernels, requester, *, need, min_idle, now, left_out=()):
    """:class:`Park` of the idlest kernel toward *need* missing bytes, or
    :class:`Refuse` saying why none. *left_out*: ``{kernel key: why}`` of
    kernels not to try now, *why* completing "N ..." (``park(s) failed`` for
    this request, or ``whose park failed in the last 30 s not tried again yet``)."""
    eligible, skipped = judge(kernels, requester, min_idle, now)
    counts = {}
    for k in eligible:
        if key(k) in left_out:
            counts[left_out[key(k)]] = counts.get(left_out[key(k)], 0) + 1
    eligible = [k for k in eligible if key(k) not in left_out]
    chosen = plan(eligible, need)
    if chosen:
        return Park(chosen[0])
    note = "".join(f" ({n} {why})" for why, n in sorted(counts.items()))
    return Refuse(why_none(eligible, skipped, note, need), "nothing-to-park")


def key(kernel):
    """What identifies a kernel across looks: its slice, id and processes."""
    return (kernel.slice, kernel.kernel_id, kernel.pids)


def sizes(a, b):
    """*a* and *b* as people read them, in bytes too where the rounding makes them read alike."""
    fa, fb = format_size(a), format_size(b)
    if fa == fb and a != b:
        return f"{fa} ({a} bytes)", f"{fb} ({b} bytes)"
    return fa, fb


def short_of(uuid, free, kept, want):
    """``GPU ... has X free (Y of it kept ...), Z short of the W needed``."""
    short = want - (free - kept)
    fs, fw = sizes(short, want)
    kept_note = f" ({format_size(kept)} of it kept for parks and for others)" if kept else ""
    return f"GPU {uuid} has {format_size(free)} free{kept_note}, {fs} short of the {fw} needed"


def headroom_short(free, target):
    """``X free, Y short``: the headroom's."""
    fs, _ = sizes(target - free, target)
    return f"{format_size(free)} free, {fs} short"
