"""Changing a slice's limits, the way every running process sees at once.

The limits block of a slice file is double-buffered (see docs/slice-file.md):
a writer holds an OFD lock on the block's first byte (so writers take turns,
and the kernel drops the lock if one dies), fills the copy *not* in force,
then bumps the generation. Processes read the generation on every charge, so
a new limit applies to the very next allocation; a writer that dies half-way
never published anything. The admin panel and CLI build on this module.

A slice whose limits a hub owns keeps them in a companion file,
``<name>.limits`` (:func:`~.layout.limits_file_path`), with the
same block and the same lock on its first byte; this module writes there when
that file exists, and only those allowed to write it (the hub, administrators)
can change the limits.
"""

import ctypes
import mmap
import os
import time

from .file import SliceFile, SliceFileError
from .layout import (
    FILE_SIZE,
    HAMI_LIMIT_SET,
    LIMITS_FILE_BLOCK_OFFSET,
    LIMITS_FILE_SIZE,
    LIMITS_OFFSET,
    HamiLimitSet,
    HamiSliceLimits,
    limits_file_path,
)
from .limits import MODE_NUMBERS, MODES, check_guarantee
from .locks import LockTimeout, lock_byte
from .paths import open_trusted

_LOCK_WAIT_S = 2.0


def _device_index(snapshot, device):
    """Slice device index for a GPU UUID or index; None means the fallback entry."""
    if device is None:
        return None
    for d in snapshot.devices:
        if device in (d.uuid, d.index):
            return d.index
    known = ", ".join(d.uuid for d in snapshot.devices) or "none yet"
    raise SliceFileError(f"{snapshot.path}: slice has no GPU {device!r} (it has: {known})")


def limits_target(path):
    """``(file, size, block offset)`` of where the slice's limits live: the
    hub-owned limits file when there is one, else the slice file itself."""
    companion = limits_file_path(path)
    if os.path.exists(companion):
        return companion, LIMITS_FILE_SIZE, LIMITS_FILE_BLOCK_OFFSET
    return os.fspath(path), FILE_SIZE, LIMITS_OFFSET


def update_limits(path, change):
    """Apply ``change(limit_set, snapshot)`` and publish it: *limit_set* is the
    :class:`~.layout.HamiLimitSet` in force, edited in place; *snapshot* the
    slice as read just before (its GPUs and their slice device indices).

    Returns the new generation. PermissionError when this process may not
    change the limits (see :func:`limits_writable`).
    """
    path = os.fspath(path)
    with SliceFile(path) as sf:  # validates the slice file and its limits file before a write
        snapshot = sf.snapshot()
    target, size, base = limits_target(path)
    hub_owned = target != path
    fd, _, _ = open_trusted(target, os.O_RDWR, "limits file" if hub_owned else "slice file",
                            owner_only=hub_owned)
    try:
        try:
            lock_byte(fd, base, _LOCK_WAIT_S, poll_s=0.005)
        except LockTimeout:
            raise SliceFileError(f"{target}: another writer holds the limits for over "
                                 f"{_LOCK_WAIT_S:g} s") from None
        with mmap.mmap(fd, size, mmap.MAP_SHARED) as m:
            copy_at = base + HamiSliceLimits.copy.offset
            generation_at = base + HamiSliceLimits.generation.offset
            # Writers take turns under the lock: the generation stays as read.
            in_force = ctypes.c_uint64.from_buffer_copy(m, generation_at).value
            set_size = ctypes.sizeof(HamiLimitSet)
            current = HamiLimitSet.from_buffer_copy(m, copy_at + (in_force & 1) * set_size)
            change(current, snapshot)  # may refuse (raise): nothing is written then
            nxt = in_force + 1
            at = copy_at + (nxt & 1) * set_size
            m[at:at + set_size] = bytes(current)
            ctypes.c_uint64.from_buffer(m, base + HamiSliceLimits.changed_unix_ns.offset).value = time.time_ns()
            generation = ctypes.c_uint64.from_buffer(m, generation_at)
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


def set_limits(path, device, memory_limit=None, sm_share=None, mode=None, memory_guarantee=None):
    """Set some limits of one GPU (UUID or slice index), or of the fallback
    entry (every GPU without limits of its own) when *device* is None, in one
    publication; a field left None keeps its value (the memory guarantee
    too). Running processes follow at their next allocation (memory) and
    within 100 ms (SM share). A guarantee above the limit is refused
    (:class:`~.limits.LimitError`), whichever of the two changes."""
    fields = {}
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < 0:
            raise ValueError(f"memory limit must be a whole number of bytes (0: none), not {memory_limit!r}")
        fields["memory_limit"] = memory_limit
    if memory_guarantee is not None:
        if (isinstance(memory_guarantee, bool) or not isinstance(memory_guarantee, int)
                or memory_guarantee < 0):
            raise ValueError(f"memory guarantee must be a whole number of bytes (0: the limit), "
                             f"not {memory_guarantee!r}")
        fields["memory_guarantee"] = memory_guarantee
    if sm_share is not None:
        if isinstance(sm_share, bool) or not isinstance(sm_share, int) or not 0 <= sm_share <= 100:
            raise ValueError(f"SM share must be a whole percent of each GPU (1-99; 0 or 100: no "
                             f"share), not {sm_share!r}")
        fields["sm_share"] = sm_share
    if mode is not None:
        if mode not in MODES:
            raise ValueError(f"SM mode must be one of {', '.join(MODES)}, not {mode!r}")
        fields["mode"] = MODE_NUMBERS[mode]

    def change(limits, snapshot):
        index = _device_index(snapshot, device)
        entry = limits.fallback if index is None else limits.device[index]
        if index is not None and not entry.flags & HAMI_LIMIT_SET:
            # The GPU followed the fallback: keep its other limits as they were.
            ctypes.memmove(ctypes.addressof(entry), ctypes.addressof(limits.fallback),
                           ctypes.sizeof(entry))
        for name, value in fields.items():
            setattr(entry, name, value)
        check_guarantee(entry.memory_limit, entry.memory_guarantee)  # before anything is published
        entry.flags |= HAMI_LIMIT_SET

    return update_limits(path, change)


def set_memory_limit(path, device, memory_limit):
    """Set the memory limit in bytes (0 = none) of *device*; applies live."""
    return set_limits(path, device, memory_limit=memory_limit)


def set_sm_share(path, device, percent, mode=None):
    """Set the SM share in percent (0 or 100 = none) and optionally the mode
    ("hard" or "elastic") of *device*; running processes follow within 100 ms."""
    return set_limits(path, device, sm_share=percent, mode=mode)
