"""The host's physical GPUs, as NVML reports them: read in one place.

The admin panel and ``slice list`` show them and check memory promises
against their sizes, the hub enters a size's GPUs into a new slice, and
``doctor`` checks that NVML answers. NVML is initialised once per process and
kept: on a host without persistence mode ``nvmlInit`` can take long, and the
panel asks every second.

Inside a HAMi kernel the preload library answers NVML's memory questions with
the *slice's* size. There the physical facts are read by a child process
started without the library (``python -m hami_jupyter.gpus``), at most every
few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

_lock = threading.Lock()
_initialised = False
_CHILD_TTL_S = 5.0  # the physical facts change slowly; a child costs ~0.2 s
_child_cache = (0.0, None)


@dataclass(frozen=True)
class HostGpu:
    """One GPU of the host. *index* is NVML's (None for a GPU known only from
    a slice file); *memory_used* counts every process on it; *utilization* is
    the percent of time a kernel ran, *power_w* and *power_limit_w* its draw
    and enforced limit, *temperature_c* its core's temperature (each None
    where NVML does not say)."""

    index: int | None
    uuid: str
    name: str = ""
    memory_total: int = 0
    memory_used: int | None = None
    utilization: int | None = None
    # What the whole GPU draws and how warm it is (None where NVML does not say):
    # watts now, the power limit the driver enforces, degrees Celsius.
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None

    @property
    def label(self):
        return f"{self.name} {self.uuid}" if self.name else self.uuid


class GpuFactsError(RuntimeError):
    """NVML cannot tell. *stage*: "missing" (no nvidia-ml-py), "init" (NVML
    does not start) or "list" (it started but cannot list the GPUs)."""

    def __init__(self, stage, message):
        super().__init__(message)
        self.stage = stage


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml():
    """pynvml, initialised once for this process; GpuFactsError when it cannot be."""
    global _initialised
    try:
        import pynvml
    except ImportError:
        raise GpuFactsError("missing", "nvidia-ml-py is not installed") from None
    with _lock:
        if not _initialised:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                raise GpuFactsError("init", f"NVML: {e}") from None
            _initialised = True
    return pynvml


def _optional(pynvml, read, *args):
    """``read(*args)``, or None where this GPU or NVML cannot say (MIG, some
    vGPUs, an older library without the call)."""
    try:
        return read(*args)
    except (pynvml.NVMLError, AttributeError):
        return None


def _temperature(pynvml, handle):
    """The GPU core's temperature in degrees Celsius (None where unknown): NVML's
    versioned call, else the older one it replaces."""
    sensor = pynvml.NVML_TEMPERATURE_GPU
    versioned = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    found = _optional(pynvml, versioned, handle, sensor) if versioned else None
    return found if found is not None else _optional(pynvml, pynvml.nvmlDeviceGetTemperature,
                                                     handle, sensor)


def _watts(milliwatts):
    return None if milliwatts is None else round(milliwatts / 1000, 1)


def _one(pynvml, index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    rates = _optional(pynvml, pynvml.nvmlDeviceGetUtilizationRates, handle)
    return HostGpu(index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                   _text(pynvml.nvmlDeviceGetName(handle)), memory.total, memory.used,
                   None if rates is None else rates.gpu,
                   _watts(_optional(pynvml, pynvml.nvmlDeviceGetPowerUsage, handle)),
                   _watts(_optional(pynvml, pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
                   _temperature(pynvml, handle))


def host_gpus():
    """The GPUs NVML reports to this process, in NVML order; GpuFactsError when
    it cannot. Physical figures only outside a slice: see :func:`read_gpus`."""
    pynvml = _nvml()
    try:
        return [_one(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        raise GpuFactsError("list", f"NVML started but cannot list the GPUs: {e}") from None


def driver_version():
    """The NVIDIA driver's version as NVML reports it; GpuFactsError when it cannot."""
    pynvml = _nvml()
    try:
        return _text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as e:
        raise GpuFactsError("list", f"NVML: {e}") from None


def under_preload():
    """True when this process has the preload library loaded (a HAMi kernel)."""
    try:
        with open("/proc/self/maps") as maps:
            return any(line.rstrip().endswith("/libvgpu.so") for line in maps)
    except OSError:
        return False


def _child(env, why):
    """``(gpus, message, ran)`` read by ``python -m hami_jupyter.gpus`` in *env*
    (never under the preload library); *why* names the reading in the message
    when the child itself failed (*ran* False)."""
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run([sys.executable, "-m", "hami_jupyter.gpus"], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        found, message = json.loads(out)
        return [HostGpu(**g) for g in found], message, True
    except (OSError, subprocess.SubprocessError, ValueError, TypeError) as e:
        return [], f"GPU facts unavailable: reading them {why} failed: {e}", False


def _read_in_child():
    global _child_cache
    stamp, cached = _child_cache
    if cached is not None and time.monotonic() - stamp < _CHILD_TTL_S:
        return cached
    gpus, message, ran = _child(os.environ, "outside the slice")
    if ran:
        _child_cache = (time.monotonic(), (gpus, message))
    return gpus, message


def read_gpus_as(environment):
    """``(gpus, message)`` as a process with *environment* over this one's (a
    single-user server's: the hub passes ``Spawner.environment``) sees them.

    The hub's own process may have no NVML where its servers have one: a host
    tried out on the simulated GPU, whose driver the servers find by
    ``LD_LIBRARY_PATH`` and ``HAMI_SIM_STATE``. Admission and a size's
    ``per_gpu`` limits then count the GPUs the servers will use. Read in a
    child (about 0.2 s), only when the hub's own NVML knows no GPU."""
    extra = {k: v for k, v in (environment or {}).items() if isinstance(k, str) and isinstance(v, str)}
    return _child({**os.environ, **extra}, "with the servers' environment")[:2]


def _read_here():
    try:
        return host_gpus(), None
    except GpuFactsError as e:
        return [], f"GPU facts unavailable: {e}"


def read_gpus():
    """``(gpus, None)``, or ``([], why)`` when NVML cannot be used; never raises.

    Physical figures, also inside a slice (read in a child process there).
    """
    if under_preload():
        return _read_in_child()
    return _read_here()


if __name__ == "__main__":  # the child of _read_in_child
    gpus, message = _read_here()
    print(json.dumps([[asdict(g) for g in gpus], message]))
