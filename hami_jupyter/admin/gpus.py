"""The host's physical GPUs, as NVML reports them.

The admin panel shows them above the slices, and the memory check of a change
needs each GPU's size. NVML is initialised once per process and kept: on a
host without persistence mode ``nvmlInit`` can take long, and the panel asks
every second. Without NVML (no driver, a CI machine) :func:`read_gpus` returns
no GPUs and says why; callers then fall back to what the slice files recorded
about the GPUs their processes used.

An administrator's notebook kernel runs inside a slice itself, under the
preload library, which answers NVML's memory questions with the *slice's*
size. There the facts are read by a child process started without the
library (``python -m hami_jupyter.admin.gpus``), at most every few seconds.
"""

import json
import os
import subprocess
import sys
import threading
import time

_lock = threading.Lock()
_initialised = False
_CHILD_TTL_S = 5.0  # the physical facts change slowly; a child costs ~0.2 s
_child_cache = (0.0, None)


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


def under_preload():
    """True when this process has the preload library loaded (a HAMi kernel)."""
    try:
        with open("/proc/self/maps") as maps:
            return any(line.rstrip().endswith("/libvgpu.so") for line in maps)
    except OSError:
        return False


def _read_in_child():
    global _child_cache
    stamp, cached = _child_cache
    if cached is not None and time.monotonic() - stamp < _CHILD_TTL_S:
        return cached
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run([sys.executable, "-m", "hami_jupyter.admin.gpus"], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        gpus, message = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return [], f"GPU facts unavailable: reading them outside the slice failed: {e}"
    _child_cache = (time.monotonic(), (gpus, message))
    return gpus, message


def read_gpus():
    """``(gpus, None)``, or ``([], why)`` when NVML cannot be used.

    Each GPU is a dict: index, uuid, name, memory_total, memory_used (bytes,
    every process on the GPU) and utilization (percent of time a kernel ran,
    None when unsupported). Physical figures, also inside a slice.
    """
    if under_preload():
        return _read_in_child()
    return _read_here()


def _read_here():
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


if __name__ == "__main__":  # the child of _read_in_child
    print(json.dumps(_read_here()))
