"""Every process on every GPU, with the device memory the driver says it holds.

Why NVML and not the slice file: the slice file holds what the preload
library charged, written by the slice's own processes; NVML's per-process
figure is the driver's (what ``nvidia-smi`` shows), which a process without
the library still has and a user cannot rewrite. The agent runs without the
preload library, so NVML answers it physically.

Each read also asks the driver which processes used each GPU since the last
read (``nvmlDeviceGetProcessUtilization``: a sample of a process whose
kernels or copies kept the GPU busy): the driver's word on activity, which
:mod:`.activity` trusts where a slot's "last GPU call" is only a claim. A
driver that keeps no such samples says nothing, and the agent then goes by
what it sees change between its looks.

What one read does, per GPU: the compute *and* the graphics running
processes (a process drawing through OpenGL or Vulkan holds memory too; one
with both kinds of context is listed twice with the same figure, so the
larger of the two is kept, never their sum). The GPU list is read afresh each
time: GPUs that fall off the bus, are reset or come back are simply what NVML
lists at that moment, keyed by UUID, never by index.

The agent must not die of the thing it watches, so nothing here raises once
NVML has started: what could not be read becomes a line in
:attr:`Reading.errors` (the report's ``"errors"``), and a GPU whose process
list could not be read is named in :attr:`Reading.unread`, so that the
policy neither acts on it nor forgets that it was over. When NVML itself
stops answering (the driver was unloaded or reloaded), the next read starts
it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE for an unsigned long long


class NvmlUnavailable(RuntimeError):
    """NVML cannot be started at all: no driver, no library, no nvidia-ml-py."""


@dataclass(frozen=True)
class GpuProcess:
    """One process on one GPU. *pid* is as NVML gives it: a host PID when the
    agent runs in the host's PID namespace (as it must, see docs/guard.md)."""

    pid: int
    uuid: str
    used_bytes: int


@dataclass
class Reading:
    """One look at every GPU.

    *gpus*: UUID -> NVML index of every GPU whose processes were read;
    *unread*: UUIDs (or ``"index N"``) whose process list could not be read
    this time; *errors*: what went wrong, one line each.
    """

    gpus: dict = field(default_factory=dict)
    processes: list = field(default_factory=list)
    unread: set = field(default_factory=set)
    errors: list = field(default_factory=list)
    busy: set = field(default_factory=set)  # pids the driver saw using a GPU since the last read

    def by_gpu(self):
        """``{uuid: {pid: used_bytes}}``."""
        out = {uuid: {} for uuid in self.gpus}
        for p in self.processes:
            out.setdefault(p.uuid, {})[p.pid] = p.used_bytes
        return out


def _code(error):
    return getattr(error, "value", None)


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlReader:
    """Reads :class:`Reading` from NVML through pynvml (*pynvml*: the module,
    for tests that want to make it fail; default: the real one)."""

    def __init__(self, pynvml=None):
        self._pynvml = pynvml
        self._started = False
        self._sampled = {}  # uuid -> the newest utilization sample's time stamp seen

    def start(self):
        """Start NVML; :class:`NvmlUnavailable` with the reason when it cannot.

        The service calls this once before its first look and refuses to
        run without it: an agent that cannot see the GPUs guards nothing and
        measures no room, and should say so at once rather than write empty
        reports.
        """
        if self._pynvml is None:
            try:
                import pynvml
            except ImportError:
                raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
            self._pynvml = pynvml
        try:
            self._pynvml.nvmlInit()
        except self._pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML does not start: {e} (is the NVIDIA driver loaded, and "
                                  "libnvidia-ml.so.1 on the library path?)") from None
        self._started = True

    def _restart(self, errors):
        nv = self._pynvml
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            errors.append(f"NVML does not start again: {e}")
            return False
        self._started = True
        return True

    def read(self):
        """One :class:`Reading` of every GPU; never raises an NVML error."""
        nv = self._pynvml
        reading = Reading()
        if not self._started and not self._restart(reading.errors):
            reading.unread.add("all")
            return reading
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            reading.errors.append(f"NVML cannot count the GPUs: {e}; it is started again next time")
            reading.unread.add("all")
            self._started = False
            return reading
        for index in range(count):
            self._read_gpu(index, reading)
        return reading

    def memory(self, uuid, errors):
        """``(total, free)`` bytes of GPU *uuid* now, as the driver counts them
        (the memory broker's measure of room); None, with the reason appended
        to *errors*, when NVML cannot say."""
        nv = self._pynvml
        if not self._started and not self._restart(errors):
            return None
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            info = nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError as e:
            errors.append(f"GPU {uuid}: NVML cannot tell its free memory: {e}")
            if _code(e) in (nv.NVML_ERROR_UNINITIALIZED, nv.NVML_ERROR_DRIVER_NOT_LOADED):
                self._started = False
            return None
        return int(info.total), int(info.free)

    def _read_gpu(self, index, reading):
        nv = self._pynvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        except nv.NVMLError as e:  # fell off the bus, being reset, or gone since the count
            reading.errors.append(f"GPU index {index}: NVML: {e}")
            reading.unread.add(f"index {index}")
            return
        seen = {}
        complete = True
        for kind, call in (("compute", nv.nvmlDeviceGetComputeRunningProcesses),
                           ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses)):
            try:
                listed = call(handle)
            except nv.NVMLError as e:
                if kind == "graphics" and _code(e) == nv.NVML_ERROR_NOT_SUPPORTED:
                    continue  # a compute-only GPU: nothing draws there
                reading.errors.append(f"GPU {uuid}: NVML cannot list its {kind} processes: {e}")
                complete = False
                continue
            for info in listed:
                pid, used = int(info.pid), info.usedGpuMemory
                if pid <= 0:
                    continue
                if used is None or used == NOT_AVAILABLE:
                    reading.errors.append(f"GPU {uuid}: NVML does not say how much memory pid {pid} "
                                          "holds (counted as 0)")
                    used = 0
                seen[pid] = max(seen.get(pid, 0), int(used))
        if not complete:  # half a list would show the slice using less than it does
            reading.unread.add(uuid)
            return
        reading.gpus[uuid] = index
        reading.processes.extend(GpuProcess(pid, uuid, used) for pid, used in seen.items())
        self._read_busy(handle, uuid, reading)

    def _read_busy(self, handle, uuid, reading):
        """The pids the driver's utilization samples show busy on GPU *uuid* since the
        last read. Nothing is an error here: no sample (NVML_ERROR_NOT_FOUND), or a
        driver without them, only leaves the agent to what it sees itself."""
        nv = self._pynvml
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, self._sampled.get(uuid, 0))
        except (nv.NVMLError, AttributeError):
            return
        for sample in samples:
            stamp = int(getattr(sample, "timeStamp", 0) or 0)
            self._sampled[uuid] = max(self._sampled.get(uuid, 0), stamp)
            if any(getattr(sample, name, 0) for name in ("smUtil", "memUtil", "encUtil", "decUtil")):
                reading.busy.add(int(sample.pid))
