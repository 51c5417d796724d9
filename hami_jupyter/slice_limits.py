"""Changing a slice's limits, the way every running process sees at once.

The limits block of a slice file is double-buffered (see docs/slice-file.md):
a writer holds an OFD lock on the block's first byte (so writers take turns,
and the kernel drops the lock if one dies), fills the copy *not* in force,
then bumps the generation. Processes read the generation on every charge, so
a new limit applies to the very next allocation; a writer that dies half-way
never published anything. The admin panel and CLI build on this module.

A slice whose limits a hub owns keeps them in a companion file,
``<name>.limits`` (:func:`~hami_jupyter.slice_file.limits_file_path`), with the
same block and the same lock on its first byte; this module writes there when
that file exists, and only those allowed to write it (the hub, administrators)
can change the limits.
"""

import ctypes
import fcntl
import mmap
import os
import time

from .slice_file import (
    FILE_SIZE,
    LIMITS_FILE_BLOCK_OFFSET,
    LIMITS_FILE_SIZE,
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
    limits_file_path,
)
from .slice_paths import open_trusted

F_OFD_SETLK = 37
_LOCK_WAIT_S = 2.0


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


def _lock(fd, path, at):
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, at))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SliceFileError(f"{path}: another writer holds the limits for over {_LOCK_WAIT_S} s")
            time.sleep(0.005)


def limits_target(path):
    """``(file, size, block offset)`` of where the slice's limits live: the
    hub-owned limits file when there is one, else the slice file itself."""
    companion = limits_file_path(path)
    if os.path.exists(companion):
        return companion, LIMITS_FILE_SIZE, LIMITS_FILE_BLOCK_OFFSET
    return os.fspath(path), FILE_SIZE, LIMITS_OFFSET


def update_limits(path, change):
    """Apply ``change(limit_set)`` (a :class:`HamiLimitSet`, edited in place) and publish it.

    Returns the new generation. PermissionError when this process may not
    change the limits (see :func:`limits_writable`).
    """
    path = os.fspath(path)
    SliceFile(path).close()  # validates both files before we write
    target, size, base = limits_target(path)
    hub_owned = target != path
    fd, _, _ = open_trusted(target, os.O_RDWR, "limits file" if hub_owned else "slice file",
                            owner_only=hub_owned)
    try:
        _lock(fd, target, base)
        with mmap.mmap(fd, size, mmap.MAP_SHARED) as m:
            copy_at = base + HamiSliceLimits.copy.offset
            generation = ctypes.c_uint64.from_buffer(m, base + HamiSliceLimits.generation.offset)
            set_size = ctypes.sizeof(HamiLimitSet)
            current = HamiLimitSet.from_buffer_copy(m, copy_at + (generation.value & 1) * set_size)
            change(current)
            nxt = generation.value + 1
            at = copy_at + (nxt & 1) * set_size
            m[at:at + set_size] = bytes(current)
            ctypes.c_uint64.from_buffer(m, base + HamiSliceLimits.changed_unix_ns.offset).value = time.time_ns()
            generation.value = nxt  # one aligned 8-byte store: the publication
            del generation
        return nxt
    finally:
        os.close(fd)  # drops the lock


def limits_writable(path):
    """True when this process may change the slice's limits (the hub or an
    administrator, or the owner of a slice no hub manages); False for a
    read-only viewer."""
    return os.access(limits_target(path)[0], os.W_OK, effective_ids=os.access in os.supports_effective_ids)


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
        raise ValueError(f"SM share must be a whole percent of each GPU (1-99; 0 or 100: no share), not {percent!r}")
    fields = {"sm_share": percent}
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"SM mode must be one of {', '.join(MODES)}, not {mode!r}")
        fields["mode"] = MODES[mode]
    return _set_fields(path, device, **fields)


__all__ = ["set_memory_limit", "set_sm_share", "update_limits", "limits_writable", "MODES",
           "HAMI_SLICE_MAX_DEVICES"]
