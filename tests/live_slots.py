"""Slots of a real slice file written from the test, as a process of the slice would.

A reader believes a slot is live while an open file description holds the
OFD write lock on its first byte (docs/slice-file.md): :func:`live_slot`
writes the slot's fields and takes that lock; closing the returned fd is the
process's death. Views (status, REST, the hub's admission) then read a real
file, with no GPU and no preload library.
"""

import ctypes
import fcntl
import mmap
import os

from hami_jupyter.slice import layout, locks


def live_slot(path, index, *, pid, kernel_id="", used=None, **fields):
    """Fill slot *index* of the slice file *path* as live, with *used*
    ({slice device index: bytes}) and any other field of ``hami_slot``
    (``room_wait_bytes=...``); returns the fd holding its lock."""
    fd = os.open(path, os.O_RDWR)
    with mmap.mmap(fd, layout.FILE_SIZE, mmap.MAP_SHARED) as m:
        slot = layout.HamiSlot.from_buffer(m, layout.slot_offset(index))
        slot.state = layout.HAMI_SLOT_LIVE
        slot.pid = pid
        slot.kernel_id = kernel_id.encode()
        slot.comm = b"python3"
        for device, n in (used or {}).items():
            slot.memory_used[device] = n
            d = layout.HamiSliceDevice.from_buffer(
                m, layout.DEVICES_OFFSET + device * ctypes.sizeof(layout.HamiSliceDevice))
            d.memory_used += n
            del d
        for name, value in fields.items():
            setattr(slot, name, value)
        del slot
    fcntl.fcntl(fd, locks.F_OFD_SETLK, locks.flock_bytes(fcntl.F_WRLCK, layout.slot_offset(index)))
    return fd


def enter_gpu(path, index, uuid, memory_total):
    """Enter GPU *uuid* at slice device index *index*, as the first process of
    the slice to use it does (its UUID and memory, state ready)."""
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, layout.FILE_SIZE, mmap.MAP_SHARED) as m:
            d = layout.HamiSliceDevice.from_buffer(
                m, layout.DEVICES_OFFSET + index * ctypes.sizeof(layout.HamiSliceDevice))
            d.uuid = uuid.encode()
            d.memory_total = memory_total
            d.state = layout.HAMI_DEVICE_READY
            del d
    finally:
        os.close(fd)
