"""The last minutes of this server's slices, for the JupyterLab panel's charts.

The panel draws each GPU's and each kernel's memory and SM use over the last
minutes. Kept in the browser alone, that history started over at every page
load; so the server keeps it, as the hub view's service keeps its own:
:class:`HistoryRecorder` reads the slices of the server's kernels every
``SliceDisplay.history_interval`` seconds and keeps ``history_minutes`` of
samples per GPU and per kernel (:class:`SliceHistory`), and
``GET hami/v1/kernels/<id>/history?minutes=N`` answers those of the kernel's
slice. A sample has the fields of the panel's own (labextension
``history.ts``, ``ISample``), so the browser adds them in front of what it
polls itself: ``t`` (ms since the epoch), ``gap`` (no reading: the slice file
could not be read), ``used``, ``sm``, ``cap``, ``share``, ``real`` (the
guard's bytes; GPUs only), ``parked`` and ``state`` (a kernel's parking
state; None for GPUs). A cap holds per GPU, so a kernel's ``cap`` is that of
the GPUs it holds memory on, added up as its ``used`` is (on one GPU, that
GPU's cap; before it holds any, the slice's fullest GPU's): a kernel with
2.6 GiB over two GPUs of 2.0 GiB caps is at 2.6 of 4.0 GiB, never "over" a
single cap no GPU is over. On several GPUs its ``split`` lists them:
``[{"gpu", "used", "cap"}]`` (else None).

Beside them, per GPU of the slice, the whole GPU (:mod:`.whole_gpu`): ``t``,
``gap``, ``util`` (percent), ``used`` and ``total`` (bytes NVML sees, every
process's), ``slice`` (this slice's bytes), ``power`` and ``power_limit``
(watts), ``temp`` (degrees Celsius); each None where NVML does not say.
"""

import os
import time
from collections import deque

from .kernel_slices import fullest_gpu, read_slice, server_slices
from .periodic import Periodic
from .whole_gpu import whole_gpus

MAX_MINUTES = 60  # the panel's longest history (labextension history.ts)


def _gap(t):
    return {"t": t, "gap": True, "used": None, "sm": None, "cap": 0, "share": 0, "real": None,
            "parked": 0, "state": None}


def _whole_gap(t):
    return {"t": t, "gap": True, "util": None, "used": None, "total": None, "slice": None,
            "power": None, "power_limit": None, "temp": None}


_KINDS = ("gpus", "kernels", "whole")
_GAPS = {"gpus": _gap, "kernels": _gap, "whole": _whole_gap}


def kernel_gpus(kernel, gpus):
    """``[(gpu entry, bytes)]`` of the GPUs where *kernel*'s processes hold
    memory, in the slice's order."""
    held = {}
    for p in kernel.get("processes") or []:
        for uuid, n in (p.get("memory_used") or {}).items():
            held[uuid] = held.get(uuid, 0) + n
    return [(g, held[g["uuid"]]) for g in gpus if held.get(g["uuid"])]


def kernel_cap(kernel, gpus, default_cap):
    """``(cap, split)`` a kernel's memory is charted against: the caps of the
    GPUs it holds memory on, added up (0 where one has no cap: no line), and
    on several GPUs each one's ``{"gpu", "used", "cap"}``; on none,
    *default_cap* (the slice's fullest GPU's) and None."""
    held = kernel_gpus(kernel, gpus)
    if not held:
        return default_cap, None
    caps = [g["memory_limit"] for g, _ in held]
    cap = sum(caps) if all(caps) else 0
    split = ([{"gpu": g["index"], "used": n, "cap": g["memory_limit"]} for g, n in held]
             if len(held) > 1 else None)
    return cap, split


def whole_samples(entries, t):
    """``{gpu index: whole-GPU sample}`` of :func:`.whole_gpu.whole_gpus`'s entries at *t*."""
    return {str(w["index"]): {"t": t, "gap": False, "util": w["utilization"],
                              "used": w["memory_used"], "total": w["memory_total"],
                              "slice": w["slice_used"], "power": w["power_w"],
                              "power_limit": w["power_limit_w"], "temp": w["temperature_c"]}
            for w in entries}


def samples_of(status, t, whole=()):
    """``({gpu index: sample}, {kernel id: sample}, {gpu index: whole-GPU sample})``
    of one reading at *t* (ms); *whole*: its whole-GPU entries."""
    gpus = status["gpus"]
    share = max((g["sm_share"] for g in gpus), default=status["default_limit"]["sm_share"])
    fullest = fullest_gpu(gpus)
    default_cap = fullest["memory_limit"] if fullest else status["default_limit"]["memory_limit"]
    by_gpu = {str(g["index"]): {"t": t, "gap": False, "used": g["memory_used"], "sm": g["sm_util"],
                                "cap": g["memory_limit"], "share": g["sm_share"],
                                "real": g.get("memory_real"), "parked": g.get("memory_parked", 0),
                                "state": None}
              for g in gpus}
    by_kernel = {}
    for k in status["kernels"]:
        cap, split = kernel_cap(k, gpus, default_cap)
        by_kernel[k["kernel_id"]] = {
            "t": t, "gap": False, "used": k["memory_used"], "sm": k["sm_util"],
            "cap": cap, "share": share, "real": None, "split": split,
            "parked": k.get("memory_parked", 0), "state": k.get("park_state", "running")}
    return by_gpu, by_kernel, whole_samples(whole, t)


class SliceHistory:
    """Samples per slice file, per GPU and per kernel, for *minutes*."""

    def __init__(self, minutes=MAX_MINUTES):
        self.window_ms = max(1, minutes) * 60_000
        self._slices = {}  # absolute path -> {"gpus": {key: deque}, "kernels": {id: deque}, "whole": ...}

    def record(self, path, status, t=None, whole=()):
        """One reading of the slice at *path* (``read_slice``'s answer; one with
        ``error`` is a gap in each of its series) at *t* ms (now by default),
        with *whole*, the entries of :func:`.whole_gpu.whole_gpus` for it."""
        t = int(time.time() * 1000) if t is None else t
        series = self._slices.setdefault(os.path.abspath(path), {k: {} for k in _KINDS})
        found = dict(zip(_KINDS, ({}, {}, {}) if "error" in status
                         else samples_of(status, t, whole)))
        for kind in _KINDS:
            for key, sample in found[kind].items():
                series[kind].setdefault(key, deque()).append(sample)
            for key, kept in series[kind].items():
                if key not in found[kind] and kept and not kept[-1]["gap"]:
                    kept.append(_GAPS[kind](t))
        self.prune(t)

    def prune(self, now):
        """Drops what is older than the window (but the last sample before it)
        and forgets series, then slices, without a reading in it."""
        start = now - self.window_ms
        for path in list(self._slices):
            for kind in _KINDS:
                series = self._slices[path][kind]
                for key in list(series):
                    kept = series[key]
                    while len(kept) > 1 and kept[1]["t"] <= start:
                        kept.popleft()
                    if not any(not s["gap"] and s["t"] >= start for s in kept):
                        del series[key]
            if not any(self._slices[path].values()):
                del self._slices[path]

    def samples(self, path, minutes=None, now=None):
        """``{"gpus": {index: [sample...]}, "kernels": {id: [sample...]}, "whole":
        {index: [whole-GPU sample...]}}`` of the slice at *path*, oldest first,
        the last *minutes* (the whole window by default)."""
        now = int(time.time() * 1000) if now is None else now
        start = now - min(self.window_ms, (minutes or MAX_MINUTES) * 60_000)
        series = self._slices.get(os.path.abspath(path), {k: {} for k in _KINDS})
        return {kind: {key: [s for s in kept if s["t"] >= start]
                       for key, kept in series[kind].items()}
                for kind in _KINDS}


class HistoryRecorder(Periodic):
    """Reads the slices of *serverapp*'s kernels every *interval* seconds into a
    :class:`SliceHistory`."""

    what = "recording the slices' history"

    def __init__(self, serverapp, fractions, interval=2.0, minutes=MAX_MINUTES):
        super().__init__(serverapp)
        self.fractions, self.interval = fractions, interval
        self.history = SliceHistory(minutes)

    def tick(self):
        by_kernel, paths = server_slices(self.serverapp.kernel_manager)
        for path in paths:
            status = read_slice(path, set(by_kernel), self.fractions)
            self.history.record(path, status, whole=whole_gpus(status)[0])
