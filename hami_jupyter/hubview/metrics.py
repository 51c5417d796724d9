"""Prometheus: per-node GPU totals of the hub view, and where every server's
``/metrics`` is.

The service's own ``{prefix}metrics`` carries what no single server can say:
each node's GPUs summed over every slice on them, as the last refresh saw
them, and whether each server answered. The per-slice and per-kernel gauges
stay with the servers (``hami_slice_*``, ``hami_kernel_*`` on each server's
``{base_url}metrics``); ``{prefix}api/targets`` lists those in Prometheus's
HTTP service discovery format, so that Prometheus finds every server the
hub runs, through the proxy, without a list kept by hand.
"""

from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

GPU_LABELS = ("node", "gpu_uuid", "gpu_name")

# (name, help, key of a document GPU entry)
GPU_GAUGES = (
    ("hami_hub_gpu_memory_total_bytes", "Memory of the GPU", "memory_total"),
    ("hami_hub_gpu_memory_used_bytes", "GPU memory all slices on the GPU use, as they count it",
     "memory_used"),
    ("hami_hub_gpu_memory_limit_bytes", "Sum of the memory caps of the slices on the GPU "
     "(slices without a cap add nothing)", "memory_limits"),
    ("hami_hub_gpu_memory_guarantee_bytes", "Sum of the memory guarantees of the slices on the "
     "GPU (a slice's cap where it has no guarantee of its own)", "memory_guarantees"),
    ("hami_hub_gpu_room_waiting_processes", "Processes waiting for room on the GPU (the memory "
     "broker makes it by parking idle kernels)", "room_waiters"),
    ("hami_hub_gpu_room_waiting_bytes", "Bytes the processes waiting for room on the GPU asked "
     "for", "room_wait_bytes"),
    ("hami_hub_gpu_memory_parked_bytes", "GPU memory of parked kernels of the GPU, held in host "
     "memory", "memory_parked"),
    ("hami_hub_gpu_memory_real_bytes", "GPU memory the slices on the GPU really use, as the "
     "guard reads it (only when the guard knows every slice there)", "memory_real"),
    ("hami_hub_gpu_sm_utilization_percent", "SM utilization of all slices on the GPU, percent",
     "sm_util"),
    ("hami_hub_gpu_slices", "Slices with a process on the GPU", None),
    ("hami_hub_gpu_kernels", "Kernels holding memory on the GPU", "kernels"),
)


def _families(document):
    families = [GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc, _ in GPU_GAUGES]
    up = GaugeMetricFamily("hami_hub_server_up", "1 when the server answered the last refresh",
                           labels=("user", "server", "node"))
    stamp = GaugeMetricFamily("hami_hub_refreshed_timestamp_seconds",
                              "When the hub view was last refreshed (Unix time)")
    for node in document.get("nodes", []):
        for gpu in node["gpus"]:
            labels = (node["node"], gpu["uuid"], gpu.get("name") or "")
            for family, (_, _, key) in zip(families, GPU_GAUGES):
                if key is None:
                    value = len(gpu["slices"])
                elif key == "room_waiters":
                    value = len(gpu.get("waiting") or [])
                else:
                    value = gpu.get(key)
                if value is not None:
                    family.add_metric(labels, value)
    for s in document.get("servers", []):
        if s["state"] != "pending":
            up.add_metric((s["user"], s["server"], s.get("node") or ""),
                          1 if s["state"] == "ready" else 0)
    if document.get("refreshed_unix"):
        stamp.add_metric((), document["refreshed_unix"])
    return families + [up, stamp]


class _DocumentCollector:
    def __init__(self, get_document):
        self.get_document = get_document

    def collect(self):
        return _families(self.get_document())


def registry(get_document):
    """A registry whose collector reads ``get_document()`` at every scrape."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_DocumentCollector(get_document))
    return reg


def exposition(reg):
    """The text Prometheus scrapes."""
    return generate_latest(reg)


def targets(document, proxy_url):
    """Every server of *document* as an HTTP service discovery target group:
    the proxy's address, the server's ``metrics`` path, and user, server and
    node as labels."""
    proxy = urlparse(proxy_url)
    groups = []
    for s in document.get("servers", []):
        url = urlparse(s["url"])
        origin = url if url.netloc else proxy
        path = (url.path if url.netloc else s["url"]).rstrip("/") + "/metrics"
        groups.append({"targets": [origin.netloc],
                       "labels": {"__scheme__": origin.scheme or "http",
                                  "__metrics_path__": path,
                                  "user": s["user"], "server": s["server"],
                                  "node": s.get("node") or ""}})
    return groups
