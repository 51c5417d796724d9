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
state; None for GPUs).
"""

import os
import time
from collections import deque

from .kernel_slices import fullest_gpu, read_slice, server_slices
from .periodic import Periodic

MAX_MINUTES = 60  # the panel's longest history (labextension history.ts)


def _gap(t):
    return {"t": t, "gap": True, "used": None, "sm": None, "cap": 0, "share": 0, "real": None,
            "parked": 0, "state": None}


def kernel_gpu(kernel, gpus):
    """The GPU (a ``gpus`` entry) where *kernel*'s processes hold the most
    memory; None while they hold none."""
    held = {}
    for p in kernel.get("processes") or []:
        for uuid, n in (p.get("memory_used") or {}).items():
            held[uuid] = held.get(uuid, 0) + n
    if not held or not max(held.values()):
        return None
    uuid = max(held, key=held.get)
    return next((g for g in gpus if g["uuid"] == uuid), None)


def samples_of(status, t):
    """``({gpu index: sample}, {kernel id: sample})`` of one reading at *t* (ms)."""
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
        own = kernel_gpu(k, gpus)
        by_kernel[k["kernel_id"]] = {
            "t": t, "gap": False, "used": k["memory_used"], "sm": k["sm_util"],
            "cap": own["memory_limit"] if own else default_cap, "share": share, "real": None,
            "parked": k.get("memory_parked", 0), "state": k.get("park_state", "running")}
    return by_gpu, by_kernel


class SliceHistory:
    """Samples per slice file, per GPU and per kernel, for *minutes*."""

    def __init__(self, minutes=MAX_MINUTES):
        self.window_ms = max(1, minutes) * 60_000
        self._slices = {}  # absolute path -> {"gpus": {key: deque}, "kernels": {id: deque}}

    def record(self, path, status, t=None):
        """One reading of the slice at *path* (``read_slice``'s answer; one with
        ``error`` is a gap in each of its series) at *t* ms (now by default)."""
        t = int(time.time() * 1000) if t is None else t
        series = self._slices.setdefault(os.path.abspath(path), {"gpus": {}, "kernels": {}})
        if "error" in status:
            by_gpu, by_kernel = {}, {}
        else:
            by_gpu, by_kernel = samples_of(status, t)
        for kind, found in (("gpus", by_gpu), ("kernels", by_kernel)):
            for key, sample in found.items():
                series[kind].setdefault(key, deque()).append(sample)
            for key, kept in series[kind].items():
                if key not in found and kept and not kept[-1]["gap"]:
                    kept.append(_gap(t))
        self.prune(t)

    def prune(self, now):
        """Drops what is older than the window (but the last sample before it)
        and forgets series, then slices, without a reading in it."""
        start = now - self.window_ms
        for path in list(self._slices):
            for kind in ("gpus", "kernels"):
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
        """``{"gpus": {index: [sample...]}, "kernels": {id: [sample...]}}`` of the
        slice at *path*, oldest first, the last *minutes* (the whole window by default)."""
        now = int(time.time() * 1000) if now is None else now
        start = now - min(self.window_ms, (minutes or MAX_MINUTES) * 60_000)
        series = self._slices.get(os.path.abspath(path), {"gpus": {}, "kernels": {}})
        return {kind: {key: [s for s in kept if s["t"] >= start]
                       for key, kept in series[kind].items()}
                for kind in ("gpus", "kernels")}


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
            self.history.record(path, read_slice(path, set(by_kernel), self.fractions))
