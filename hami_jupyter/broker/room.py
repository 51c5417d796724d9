"""Room on a GPU, as the driver counts it: NVML's free bytes and who holds what.

The broker's measure of room is NVML's free memory of the GPU, not the
slices' books: memory a process without the preload library holds, or that
a slice file does not count yet, is just as missing for the process that
waits. Who holds what is NVML's per-process figure, the bytes a park frees.

The reader is the guard's (:class:`hami_jupyter.guard.nvml.NvmlReader`); the
broker serves each GPU from its own thread, so every NVML call goes through
one lock here (NVML itself is thread-safe, the reader's restart after a
driver reload is not).
"""

from __future__ import annotations

import threading

from ..guard.nvml import NvmlReader


class Room:
    """NVML for the broker; *reader* for tests that want another one."""

    def __init__(self, reader=None):
        self.reader = reader if reader is not None else NvmlReader()
        self._lock = threading.Lock()

    def start(self):
        """Start NVML (NvmlUnavailable, with the reason, when it cannot)."""
        with self._lock:
            self.reader.start()

    def free(self, uuid, errors):
        """Free bytes on GPU *uuid* now; None (the reason in *errors*) when NVML cannot say."""
        with self._lock:
            found = self.reader.memory(uuid, errors)
        return None if found is None else found[1]

    def holders(self, uuid, errors):
        """``{host pid: bytes}`` of every process on GPU *uuid*; None when its
        process list could not be read (the reason in *errors*)."""
        with self._lock:
            reading = self.reader.read()
        errors.extend(reading.errors)
        if uuid not in reading.gpus:
            if not reading.errors:
                errors.append(f"NVML lists no GPU {uuid}")
            return None
        return reading.by_gpu().get(uuid, {})
