"""Changing a slice's limits, the way every running process sees at once.

The limits block of a slice file is double-buffered (see docs/slice-file.md):
a writer holds an OFD lock on the block's first byte (so writers take turns,
and the kernel drops the lock if one dies), fills the copy *not* in force,
then bumps the generation. Processes read the generation on every charge, so
a new limit applies to the very next allocation; a writer that dies half-way
never published anything. The admin panel and CLI build on this module.
"""

import ctypes
import fcntl
import mmap
import os
import time

from .slice_file import (
    FILE_SIZE,
    HAMI_LIMIT_SET,
    HAMI_MODE_ELASTIC,
    HAMI_MODE_HARD,
    HAMI_SLICE_MAX_DEVICES,
    LIMITS_OFFSET,
    HamiLimitSet,
    HamiSliceLimits,
    SliceFile,
    SliceFileError,
    flock_bytes,
)

F_OFD_SETLK = 37
_LOCK_WAIT_S = 2.0
_COPY = LIMITS_OFFSET + HamiSliceLimits.copy.offset
_GENERATION = LIMITS_OFFSET + HamiSliceLimits.generation.offset
_CHANGED = LIMITS_OFFSET + HamiSliceLimits.changed_unix_ns.offset


def _device_index(path, device):
    """Slice device index for a GPU UUID or index; None means the fallback entry."""
    if device is None:
        return None
    with SliceFile(path) as sf:
        devices = sf.snapshot().devices
    for d in devices:
        if device in (d.uuid, d.index):
            return d.index
    known = ", ".join(d.uuid for d in devices) or "none yet"
    raise SliceFileError(f"{path}: slice has no GPU {device!r} (it has: {known})")


def _lock(fd, path):
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, LIMITS_OFFSET))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SliceFileError(f"{path}: another writer holds the limits for over {_LOCK_WAIT_S} s")
            time.sleep(0.005)


def update_limits(path, change):
    """Apply ``change(limit_set)`` (a :class:`HamiLimitSet`, edited in place) and publish it.

    Returns the new generation.
    """
    path = os.fspath(path)
    SliceFile(path).close()  # validates magic, version and size before we write
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        _lock(fd, path)
        with mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED) as m:
            generation = ctypes.c_uint64.from_buffer(m, _GENERATION)
            size = ctypes.sizeof(HamiLimitSet)
            current = HamiLimitSet.from_buffer_copy(m, _COPY + (generation.value & 1) * size)
            change(current)
            nxt = generation.value + 1
            m[_COPY + (nxt & 1) * size:_COPY + (nxt & 1) * size + size] = bytes(current)
            ctypes.c_uint64.from_buffer(m, _CHANGED).value = time.time_ns()
            generation.value = nxt  # one aligned 8-byte store: the publication
            del generation
        return nxt
    finally:
        os.close(fd)  # drops the lock


def _set_fields(path, device, **fields):
    """Set limit fields of one GPU (UUID or slice index), or of the fallback
    entry (every GPU without limits of its own) when *device* is None."""
    index = _device_index(path, device)

    def change(limits):
        entry = limits.fallback if index is None else limits.device[index]
        if index is not None and not entry.flags & HAMI_LIMIT_SET:
            # The GPU followed the fallback: keep its other limits as they were.
            ctypes.memmove(ctypes.addressof(entry), ctypes.addressof(limits.fallback),
                           ctypes.sizeof(entry))
        for name, value in fields.items():
            setattr(entry, name, value)
        entry.flags |= HAMI_LIMIT_SET

    return update_limits(path, change)


def set_memory_limit(path, device, memory_limit):
    """Set the memory limit in bytes (0 = none) of *device*; applies live."""
    if memory_limit < 0:
        raise ValueError(f"memory limit cannot be negative: {memory_limit}")
    return _set_fields(path, device, memory_limit=memory_limit)


MODES = {"hard": HAMI_MODE_HARD, "elastic": HAMI_MODE_ELASTIC}


def set_sm_share(path, device, percent, mode=None):
    """Set the SM share in percent (0 or 100 = none) and optionally the mode
    ("hard" or "elastic") of *device*; running processes follow within 100 ms."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise ValueError(f"SM share must be a whole percent 0..100, not {percent!r}")
    fields = {"sm_share": percent}
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"SM mode must be one of {', '.join(MODES)}, not {mode!r}")
        fields["mode"] = MODES[mode]
    return _set_fields(path, device, **fields)


__all__ = ["set_memory_limit", "set_sm_share", "update_limits", "MODES", "HAMI_SLICE_MAX_DEVICES"]
