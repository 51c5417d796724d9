"""What the driver tells about the benchmark's GPU while bench/sm_share.py runs.

The share's work model turns GPU time into work through the clock a share
lets the GPU run at; issue 29 asks whether that holds where power draw
differs (constant data, fp32, fp8, ...). So every scenario records, every
100 ms, NVML's SM and memory clocks, power draw and enforced limit, the
clock event (throttle) reasons, device utilization and temperature: the
figures a later fit of the model needs. A missing pynvml, or a driver that
does not answer one query, leaves those fields None; the run goes on.

Imports nothing outside the standard library at module level: pynvml is
loaded by Telemetry.open() only.
"""
import os
import statistics
import threading
import time

# NVML's clock event reason bits (nvml.h, nvmlClocksEventReason* /
# nvmlClocksThrottleReason*: the same values under both names).
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_SLOWDOWN = REASON_HW_SLOWDOWN | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_POWER_BRAKE

FIELDS = ("sm_mhz", "mem_mhz", "power_mw", "power_instant_mw", "power_limit_mw", "reasons", "util_gpu", "util_mem",
          "temp_c")
FIELD_POWER_INSTANT = 186  # nvml.h NVML_FI_DEV_POWER_INSTANT (mW): not the 1-s average nvmlDeviceGetPowerUsage gives
FAST_PERIOD = 0.01  # s: ten looks per 50 ms window period, so that busy and idle parts can be told apart


def nvml_device(pynvml):
    """(handle, how it was chosen): the GPU CUDA calls device 0, as far as the
    environment tells: the first CUDA_VISIBLE_DEVICES entry (a UUID or an
    index), else NVML index 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(first), f"NVML UUID {first} (CUDA_VISIBLE_DEVICES)"
    if first.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(first)), f"NVML index {first} (CUDA_VISIBLE_DEVICES)"
    return pynvml.nvmlDeviceGetHandleByIndex(0), "NVML index 0"


class Telemetry(threading.Thread):
    """Polls NVML every *period* seconds from open() until close(); samples()
    gives what was read between two times (time.monotonic()). The period may
    be changed while it runs (bench/sm_share.py's --fast-telemetry: every
    FAST_PERIOD for some workloads, to see the SM clock and the instant power
    inside and outside the share's windows)."""

    def __init__(self, period=0.1):
        super().__init__(daemon=True)
        self.period = self.base_period = period
        self.pynvml = None
        self.handle = None
        self.device = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._samples = []

    def open(self):
        """Start sampling; returns None, or a note saying why there will be no telemetry."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle, self.device = nvml_device(pynvml)
            self.pynvml = pynvml
        except Exception as e:  # no pynvml, no driver, no such device
            return f"no GPU telemetry ({type(e).__name__}: {e})"
        self.start()
        return None

    def close(self):
        if self.pynvml is None:
            return
        self._stop_event.set()
        self.join(timeout=5)
        try:
            self.pynvml.nvmlShutdown()
        except Exception:
            pass

    def _ask(self, fn, *args):
        try:
            return fn(self.handle, *args)
        except Exception:  # NotSupported, FunctionNotFound, ...: that field stays None
            return None

    def _reasons(self):
        nv = self.pynvml
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)
            if fn is not None:
                value = self._ask(fn)
                if value is not None:
                    return int(value)
        return None

    def _power_instant(self):
        """Instant power (mW) where the driver has the field (Hopper, driver 535+), else None."""
        fn = getattr(self.pynvml, "nvmlDeviceGetFieldValues", None)
        got = self._ask(fn, [getattr(self.pynvml, "NVML_FI_DEV_POWER_INSTANT", FIELD_POWER_INSTANT)]) if fn else None
        if not got or getattr(got[0], "nvmlReturn", 1) != 0:
            return None
        v, kind = got[0].value, getattr(got[0], "valueType", 1)
        return {0: getattr(v, "dVal", None), 2: getattr(v, "ulVal", None), 3: getattr(v, "ullVal", None),
                4: getattr(v, "sllVal", None)}.get(kind, getattr(v, "uiVal", None))

    def read(self):
        nv = self.pynvml
        util = self._ask(nv.nvmlDeviceGetUtilizationRates)
        return {"t": time.monotonic(),
                "sm_mhz": self._ask(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
                "mem_mhz": self._ask(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
                "power_mw": self._ask(nv.nvmlDeviceGetPowerUsage),
                "power_instant_mw": self._power_instant(),
                "power_limit_mw": self._ask(nv.nvmlDeviceGetEnforcedPowerLimit),
                "reasons": self._reasons(),
                "util_gpu": util.gpu if util is not None else None,
                "util_mem": util.memory if util is not None else None,
                "temp_c": self._ask(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)}

    def run(self):
        while True:
            try:
                sample = self.read()
            except Exception:  # a sample lost, never the sampler
                sample = None
            if sample is not None:
                with self._lock:
                    self._samples.append(sample)
            if self._stop_event.wait(self.period):
                return

    def samples(self, t_from, t_to):
        with self._lock:
            return [s for s in self._samples if t_from <= s["t"] <= t_to]


def series(samples, t_ref):
    """Samples as columns (for the JSON), times in seconds from *t_ref*."""
    out = {"t": [round(s["t"] - t_ref, 3) for s in samples]}
    for f in FIELDS:
        out[f] = [s.get(f) for s in samples]
    return out


def _mean(samples, key, scale=1.0):
    values = [s[key] for s in samples if s.get(key) is not None]
    return round(statistics.mean(values) / scale, 1) if values else None


def _share_with(reasons, bits):
    return round(100.0 * sum(1 for r in reasons if r & bits) / len(reasons), 1) if reasons else None


def summary(samples):
    """Means over *samples* (the measured part), and the percent of samples
    whose clock event reasons include the SW power cap, or any thermal or HW
    slowdown. None without samples."""
    if not samples:
        return None
    reasons = [s["reasons"] for s in samples if s.get("reasons") is not None]
    clocks = sorted(s["sm_mhz"] for s in samples if s.get("sm_mhz") is not None)
    return {"samples": len(samples),
            "sm_mhz": _mean(samples, "sm_mhz"),
            # the spread of the SM clock: with fast telemetry, the busy and the idle parts of the windows
            "sm_mhz_p10": clocks[len(clocks) // 10] if clocks else None,
            "sm_mhz_p90": clocks[(9 * len(clocks)) // 10] if clocks else None,
            "power_instant_w": _mean(samples, "power_instant_mw", 1000.0),
            "mem_mhz": _mean(samples, "mem_mhz"),
            "power_w": _mean(samples, "power_mw", 1000.0),
            "power_limit_w": _mean(samples, "power_limit_mw", 1000.0),
            "sw_power_cap_pct": _share_with(reasons, REASON_SW_POWER_CAP),
            "slowdown_pct": _share_with(reasons, REASON_SLOWDOWN),
            "util_gpu": _mean(samples, "util_gpu"),
            "util_mem": _mean(samples, "util_mem"),
            "temp_c": _mean(samples, "temp_c")}


def _fmt(value, unit):
    return "?" if value is None else f"{value:.0f}{unit}"


def text(s):
    """One line for the console and one cell of the table."""
    if not s:
        return "no telemetry"
    power = _fmt(s["power_w"], " W")
    if s["power_limit_w"] is not None:
        power += f" of {s['power_limit_w']:.0f}"
    clock = _fmt(s["sm_mhz"], " MHz")
    if s.get("sm_mhz_p10") is not None and s.get("sm_mhz_p90") != s.get("sm_mhz_p10"):
        clock += f" (p10-p90 {s['sm_mhz_p10']:.0f}-{s['sm_mhz_p90']:.0f})"
    if s.get("power_instant_w") is not None:
        power += f", instant {s['power_instant_w']:.0f} W"
    return (f"SM {clock}, {power}, SW power cap {_fmt(s['sw_power_cap_pct'], ' %')}, "
            f"thermal/HW slowdown {_fmt(s['slowdown_pct'], ' %')}, util {_fmt(s['util_gpu'], ' %')} "
            f"({s['samples']} samples)")
