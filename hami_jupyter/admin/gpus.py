"""The host's physical GPUs, as NVML reports them.

The admin panel shows them above the slices, and the memory check of a change
needs each GPU's size. NVML is initialised once per process and kept: on a
host without persistence mode ``nvmlInit`` can take long, and the panel asks
every second. Without NVML (no driver, a CI machine) :func:`read_gpus` returns
no GPUs and says why; callers then fall back to what the slice files recorded
about the GPUs their processes used.
"""

import threading

_lock = threading.Lock()
_initialised = False


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _one(pynvml, index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except pynvml.NVMLError:  # not supported on this GPU (MIG, some vGPUs)
        utilization = None
    return {
        "index": index,
        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
        "name": _text(pynvml.nvmlDeviceGetName(handle)),
        "memory_total": memory.total,
        "memory_used": memory.used,
        "utilization": utilization,
    }


def read_gpus():
    """``(gpus, None)``, or ``([], why)`` when NVML cannot be used.

    Each GPU is a dict: index, uuid, name, memory_total, memory_used (bytes,
    every process on the GPU) and utilization (percent of time a kernel ran,
    None when unsupported).
    """
    global _initialised
    try:
        import pynvml
    except ImportError:
        return [], "GPU facts unavailable: nvidia-ml-py is not installed"
    try:
        with _lock:
            if not _initialised:
                pynvml.nvmlInit()
                _initialised = True
            return [_one(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())], None
    except pynvml.NVMLError as e:
        return [], f"GPU facts unavailable: NVML: {e}"
