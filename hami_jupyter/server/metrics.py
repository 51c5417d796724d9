"""Prometheus gauges of this server's slices, on the server's own ``/metrics``.

jupyter_server serves prometheus_client's default registry at
``{base_url}metrics``. A custom collector puts the slices there without a
thread or a timer: it reads the slice files when Prometheus scrapes, so the
values are as fresh as the scrape, and an idle server does no work. A scrape
must answer even when a slice file is damaged, so reading never raises: what
cannot be read is left out (and logged).

The registry refuses the same metric names twice, so there is one collector
per process; loading the extension again only points it at the newer server.

The guard's figures (``guard.json`` in the slice root, see
:mod:`hami_jupyter.slice.guard_report`) come beside the slices' own:
``hami_slice_memory_real_bytes`` per slice and GPU, only while the guard's
report is fresh, and ``hami_guard_up`` per slice root (the default one, and
each of the slices' roots): 1 while a guard writes a fresh report there, else 0.
"""

import os
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from ..slice.guard_report import GuardReportError, read_report
from ..slice.paths import default_root
from ..slice.status import slice_status
from .kernel_slices import server_slices

SLICE_LABELS = ("slice", "user", "gpu_uuid")
KERNEL_LABELS = (*SLICE_LABELS, "kernel_id")
GUARD_LABELS = ("slice_root",)

REAL_GAUGE = ("hami_slice_memory_real_bytes",
              "GPU memory the slice's processes really use on the GPU, as the guard reads it "
              "from NVML (only while the guard's report is fresh)", "memory_real")
GUARD_UP = ("hami_guard_up", "1 while the guard writes a fresh report in the slice root, else 0")

# (metric name, help, key of a slice_status()["gpus"] entry)
SLICE_GAUGES = (
    ("hami_slice_memory_used_bytes", "GPU memory the slice uses on the GPU", "memory_used"),
    ("hami_slice_memory_limit_bytes", "GPU memory cap of the slice on the GPU (0: none)",
     "memory_limit"),
    ("hami_slice_memory_guarantee_bytes",
     "GPU memory the slice is guaranteed on the GPU: never parked to make room for others "
     "(the cap when no guarantee is set)", "memory_guarantee"),
    ("hami_slice_memory_parked_bytes",
     "GPU memory of the slice's parked kernels, held in host memory, for the GPU", "memory_parked"),
    ("hami_slice_sm_share_percent", "SM share of the slice on the GPU, percent (0: none)",
     "sm_share"),
    ("hami_slice_sm_utilization_percent", "SM utilization of the slice on the GPU, percent",
     "sm_util"),
)
# (metric name, help, key of a process's per-GPU dicts in slice_status()["kernels"])
KERNEL_GAUGES = (
    ("hami_kernel_memory_used_bytes", "GPU memory a kernel's processes use on the GPU",
     "memory_used"),
    ("hami_kernel_sm_utilization_percent",
     "SM utilization of a kernel's processes on the GPU, percent", "sm_util"),
    ("hami_kernel_parked_bytes",
     "GPU memory of a parked kernel, held in host memory until it runs again", "parked"),
)


def _families():
    families = {name: GaugeMetricFamily(name, doc, labels=SLICE_LABELS)
                for name, doc, _ in SLICE_GAUGES}
    families.update({name: GaugeMetricFamily(name, doc, labels=KERNEL_LABELS)
                     for name, doc, _ in KERNEL_GAUGES})
    families[REAL_GAUGE[0]] = GaugeMetricFamily(REAL_GAUGE[0], REAL_GAUGE[1], labels=SLICE_LABELS)
    families[GUARD_UP[0]] = GaugeMetricFamily(GUARD_UP[0], GUARD_UP[1], labels=GUARD_LABELS)
    return families


def guard_up(root):
    """1 when a fresh guard report lies in *root*, else 0 (none, stale or unreadable)."""
    try:
        report = read_report(root)
    except (GuardReportError, OSError):
        return 0
    return 1 if report is not None and not report.get("stale") else 0


def add_guard(families, roots):
    """One ``hami_guard_up`` sample per slice root in *roots*."""
    for root in roots:
        families[GUARD_UP[0]].add_metric((str(root),), guard_up(root))


def _per_gpu(kernel, key):
    """{gpu uuid: sum over the kernel's processes} of the per-GPU dict *key*."""
    total = {}
    for p in kernel["processes"]:
        for uuid, value in p[key].items():
            total[uuid] = total.get(uuid, 0) + value
    return total


def add_slice(families, status, server_kernels):
    """Add the samples of one slice_status() dict: every GPU, and every GPU of
    each of this server's kernels (other servers report their own)."""
    user = os.environ.get("JUPYTERHUB_USER") or status["slice"]
    for g in status["gpus"]:
        for name, _, key in SLICE_GAUGES:
            families[name].add_metric((status["slice"], user, g["uuid"]), g[key])
        if g.get(REAL_GAUGE[2]) is not None:  # a fresh report of the guard: see slice_status
            families[REAL_GAUGE[0]].add_metric((status["slice"], user, g["uuid"]), g[REAL_GAUGE[2]])
    for g in (status.get("guard") or {}).get("elsewhere") or []:
        families[REAL_GAUGE[0]].add_metric((status["slice"], user, g["uuid"]), g["memory_real"])
    for k in status["kernels"]:
        if k["kernel_id"] not in server_kernels:
            continue
        for name, _, key in KERNEL_GAUGES:
            for uuid, value in _per_gpu(k, key).items():
                labels = (status["slice"], k["user"] or user, uuid, k["kernel_id"])
                families[name].add_metric(labels, value)


class SliceCollector:
    """Reads the slices of :attr:`serverapp`'s kernels at every scrape."""

    def __init__(self):
        self.serverapp = None

    def describe(self):
        # Names only: the registry checks them without reading any slice.
        return list(_families().values())

    def collect(self):
        families = _families()
        app = self.serverapp
        if app is None:
            return list(families.values())
        try:
            by_kernel, paths = server_slices(app.kernel_manager)
        except Exception as e:  # a scrape must answer whatever happens
            app.log.warning("hami-jupyter: cannot list the kernels' slices: %s", e)
            return list(families.values())
        for path in paths:
            try:
                add_slice(families, slice_status(path), set(by_kernel))
            except Exception as e:
                app.log.debug("hami-jupyter: slice %s left out of /metrics: %s", path, e)
        try:
            roots = {os.path.abspath(default_root()): None}
            roots.update((os.path.dirname(os.path.abspath(p)), None) for p in paths)
            add_guard(families, [Path(r) for r in roots])
        except Exception as e:
            app.log.debug("hami-jupyter: hami_guard_up left out of /metrics: %s", e)
        return list(families.values())


COLLECTOR = SliceCollector()
_registered = False


def attach(serverapp):
    """Point the collector at *serverapp*; register it the first time only."""
    global _registered
    COLLECTOR.serverapp = serverapp
    if not _registered:
        REGISTRY.register(COLLECTOR)
        _registered = True
