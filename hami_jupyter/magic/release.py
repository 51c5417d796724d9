"""Give a framework's cached GPU memory back to the slice (``%hami release``).

PyTorch and CuPy keep freed blocks in their own pools so the next allocation
is fast; under a memory cap those blocks count against the slice, so another
kernel of the same slice (or a framework in this one) can be refused memory
that nobody uses. :func:`release` empties those pools.

Only frameworks already in ``sys.modules`` are touched: importing torch to
release nothing would take seconds and, worse, could create a CUDA context,
which itself costs slice memory. For the same reason nothing here selects a
GPU: both frameworks release on the current device only, and switching
devices would create contexts on GPUs the kernel never used.

What was freed is measured where the cap counts it, the slice file: this
process's slot (found by PID), or the slice's total when the slot cannot be
found (a process in another PID namespace), each step read before and after.
"""

import gc
import os
import sys
from dataclasses import dataclass, field

from ..slice.file import SliceFileError
from ..slice.paths import SliceNameError, slice_path
from ..slice.size import format_size
from ..slice.status import slice_status


@dataclass
class Step:
    """One thing :func:`release` did. *freed* is None when it could not be measured."""

    name: str
    freed: int | None
    note: str = ""


@dataclass
class ReleaseReport:
    """What :func:`release` did and what the slice got back.

    *scope* says what was measured ("this process" or "the whole slice");
    *problem* says why nothing was, when *before* is None.
    """

    steps: list[Step] = field(default_factory=list)
    not_imported: list[str] = field(default_factory=list)
    scope: str | None = None
    before: int | None = None
    after: int | None = None
    problem: str = ""

    @property
    def freed(self):
        """Total bytes the slice got back, or None when not measured."""
        if self.before is None or self.after is None:
            return None
        return sum(s.freed or 0 for s in self.steps)

    def text(self):
        freed = self.freed
        if freed is None:
            head = f"hami release: caches released, but {self.problem}"
        elif freed == 0 and len(self.not_imported) == len(FRAMEWORKS):
            head = ("hami release: nothing freed: no framework that caches GPU memory is "
                    "imported here, and memory freed otherwise is back in the slice at once")
        elif freed == 0:
            head = "hami release: nothing freed: the frameworks' caches were empty"
        else:
            head = f"hami release: {format_size(freed)} returned to the slice"
        if freed is not None:
            head += f" ({self.scope}: {format_size(self.before)} -> {format_size(self.after)})"
        lines = [head]
        for s in self.steps:
            amount = "not measured" if s.freed is None else format_size(s.freed)
            lines.append(f"  {s.name}: {amount}{' (' + s.note + ')' if s.note else ''}")
        if self.not_imported:
            lines.append(f"  not imported, left alone: {', '.join(self.not_imported)}")
        return "\n".join(lines)


def _release_torch(torch):
    if not torch.cuda.is_initialized():
        return "CUDA not initialised by PyTorch: no cache"
    # Current device only: synchronize(d) on another GPU would create a context there.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return "torch.cuda.empty_cache()"


def _release_cupy(cupy):
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return "default and pinned memory pools emptied"


# (module, name shown, how to release it)
FRAMEWORKS = (
    ("torch", "PyTorch", _release_torch),
    ("cupy", "CuPy", _release_cupy),
)


def _default_path():
    ref = os.environ.get("HAMI_SLICE")
    return slice_path(ref) if ref else None


def _memory_used(path):
    """``(bytes, scope)``: this process's usage in the slice, else the slice's total."""
    status = slice_status(path)
    processes = [p for k in status["kernels"] for p in k["processes"]] + status["other_processes"]
    for p in processes:
        if p["pid"] == os.getpid():
            return sum(p["memory_used"].values()), "this process"
    return sum(g["memory_used"] for g in status["gpus"]), "the whole slice"


def release(path=None):
    """Empty the caches of imported frameworks; return a :class:`ReleaseReport`.

    *path* is the slice file to measure in (default: ``$HAMI_SLICE``). Without
    a readable slice the caches are still released; only the amounts are
    unknown. A framework that fails is reported in its step, never raised.
    """
    report = ReleaseReport()
    try:
        path = path or _default_path()
        if path is None:
            raise LookupError("this kernel is not in a slice ($HAMI_SLICE is not set), "
                              "so what was freed cannot be measured")
        report.before, report.scope = _memory_used(path)
    except (LookupError, OSError, SliceFileError, SliceNameError) as e:
        report.problem = str(e)

    actions = [("gc.collect()", lambda: f"{gc.collect()} objects collected")]
    for module, name, fn in FRAMEWORKS:
        loaded = sys.modules.get(module)
        if loaded is None:
            report.not_imported.append(name)
        else:
            actions.append((name, lambda fn=fn, loaded=loaded: fn(loaded)))

    used = report.before
    for name, action in actions:
        try:
            note = action()
        except Exception as e:  # a broken CUDA state must not stop the other steps
            note = f"failed: {type(e).__name__}: {e}"
        freed = None
        if used is not None:
            try:
                now, _ = _memory_used(path)
            except (OSError, SliceFileError) as e:
                report.problem, used = f"the slice could not be read again: {e}", None
            else:
                freed, used = max(0, used - now), now
        report.steps.append(Step(name, freed, note))
    report.after = used
    if used is None:
        report.before = None
    return report
