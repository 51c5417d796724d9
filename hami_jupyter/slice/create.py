"""Creating a slice file, and giving an idle slice the limits it is configured with.

The preload library creates a slice file itself when a process first needs
one; this module does the same from Python so that a slice exists, with its
limits, before its first kernel starts: ``%hami status``, the CLI and the
admin panel can show and resize it at once. Both write the same layout
(``native/src/slice.c`` ``fill_new_slice``) and publish the finished file with
``link(2)``, so nobody ever sees half of one and two creators racing leave
exactly one.

GPUs are not listed at creation: each process claims its GPUs' entries by
UUID on first sight, and the *fallback* limit (every GPU without limits of
its own) carries what was configured.
"""

import ctypes
import os
import time
from pathlib import Path

from .change import update_limits
from .file import SliceFile, limits_lookup_error
from .layout import (
    FILE_SIZE,
    HAMI_DEVICE_READY,
    HAMI_LIMIT_SET,
    HAMI_LIMITS_MAGIC,
    HAMI_LIMITS_VERSION_MAJOR,
    HAMI_LIMITS_VERSION_MINOR,
    HAMI_SLICE_MAGIC,
    HAMI_SLICE_MAX_DEVICES,
    HAMI_SLICE_MAX_SLOTS,
    HAMI_SLICE_NAME_LEN,
    HAMI_SLICE_VERSION_MAJOR,
    HAMI_SLICE_VERSION_MINOR,
    LIMITS_FILE_SIZE,
    HamiDeviceLimit,
    HamiLimitsFile,
    HamiSliceDevice,
    HamiSliceFile,
    HamiSliceHeader,
    HamiSlot,
    limits_file_path,
)
from .paths import UntrustedPath, check_folder, ensure_folder, stat_trusted
from .settings import AskedLimits


def _entry(limits):
    """A limit entry in force, carrying *limits* (a :class:`~.limits.Limits`)."""
    return limits.fill_entry(HamiDeviceLimit(), HAMI_LIMIT_SET)


def _new_file(name, limits, devices=()):
    """The bytes of a new slice file; *devices* are ``(uuid, memory_total)`` of
    GPUs entered up front (slice device indices 0, 1, ... in that order), so
    that limits can name them before any process has met them."""
    f = HamiSliceFile()
    h = f.header
    h.magic = HAMI_SLICE_MAGIC
    h.version_major = HAMI_SLICE_VERSION_MAJOR
    h.version_minor = HAMI_SLICE_VERSION_MINOR
    h.file_size = FILE_SIZE
    h.header_size = ctypes.sizeof(HamiSliceHeader)
    h.max_devices = HAMI_SLICE_MAX_DEVICES
    h.max_slots = HAMI_SLICE_MAX_SLOTS
    h.device_size = ctypes.sizeof(HamiSliceDevice)
    h.slot_size = ctypes.sizeof(HamiSlot)
    h.limits_offset = HamiSliceFile.limits.offset
    h.devices_offset = HamiSliceFile.device.offset
    h.slots_offset = HamiSliceFile.slot.offset
    h.created_unix_ns = time.time_ns()
    h.name = name.encode()[: HAMI_SLICE_NAME_LEN - 1]
    for copy in f.limits.copy:
        copy.fallback = _entry(limits)
    f.limits.changed_unix_ns = h.created_unix_ns
    for i, (uuid, memory_total) in enumerate(devices):
        d = f.device[i]
        d.uuid = uuid.encode()
        d.memory_total = memory_total
        d.state = HAMI_DEVICE_READY
    return f


def _publish(path, data, mode, what="slice file", owner_only=False):
    """Write *data* under a temporary name, then link(2) it to *path*.
    True if this call created *path*; False if it existed (left untouched,
    once it passed the trust rule: a file another user planted there is
    UntrustedPath, never taken for ours)."""
    path = Path(path)
    check_folder(path.parent)  # never write into someone else's folder
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # whatever the umask says
            os.write(fd, data)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            stat_trusted(path, what, owner_only=owner_only)
            return False
        return True
    finally:
        os.unlink(tmp)


def fill_limit_set(limit_set, limits, device_limits=None):
    """Write *limits* as the fallback of a :class:`~.layout.HamiLimitSet` and
    *device_limits* (slice device index -> :class:`~.limits.Limits`) as entries
    of their own; every other device entry is cleared (it follows the fallback)."""
    limit_set.fallback = _entry(limits)
    for i in range(HAMI_SLICE_MAX_DEVICES):
        own = (device_limits or {}).get(i)
        limit_set.device[i] = _entry(own) if own is not None else HamiDeviceLimit()


def create_limits_file(slice_path, limits, mode=0o644, device_limits=None):
    """Create the companion limits file of the slice at *slice_path* (see
    docs/slice-file.md, "Permissions"), carrying *limits* as the fallback and
    *device_limits* per slice device index. Returns its path and whether this
    call created it (an existing file is left as it is)."""
    f = HamiLimitsFile()
    f.magic = HAMI_LIMITS_MAGIC
    f.version_major = HAMI_LIMITS_VERSION_MAJOR
    f.version_minor = HAMI_LIMITS_VERSION_MINOR
    f.file_size = LIMITS_FILE_SIZE
    for copy in f.limits.copy:
        fill_limit_set(copy, limits, device_limits)
    f.limits.changed_unix_ns = time.time_ns()
    path = limits_file_path(slice_path)
    return Path(path), _publish(path, bytes(f), mode, "limits file", owner_only=True)


def create_slice(path, name, limits, mode=0o600, devices=()):
    """Create the slice file at *path* with *limits* as its fallback limit
    (and *devices* entered up front, see :func:`_new_file`), mode 0600 as the
    preload library makes it (the hub passes 0640 to let administrators read).

    Returns True if this call created it, False if it already existed (the
    existing file is left exactly as it is). The parent folder is created
    private to the user (0700) when missing. UntrustedPath when the folder or
    an existing file fails the trust rule (see :mod:`.paths`).
    """
    path = Path(path)
    ensure_folder(path.parent)
    return _publish(path, bytes(_new_file(name, limits, devices)), mode)


def apply_if_idle(path, limits):
    """Give an existing slice *limits* as its fallback, but only while no
    process of the slice is alive.

    A live slice keeps what it has: an admin may have resized it while its
    kernels run, and a kernel start must not undo that. Limits that give no
    memory guarantee keep the one the fallback has (a kernel's settings never
    name one). Returns True when the limits were written.
    """
    with SliceFile(path) as sf:
        snap = sf.snapshot()
    if snap.slots:
        return False
    limits = limits.keeping_guarantee(snap.fallback_limit)
    if snap.fallback_limit == limits and all(d.limit_is_fallback for d in snap.devices):
        return False

    def change(limit_set, _snapshot):
        limit_set.fallback = _entry(limits)
        for d in limit_set.device:
            d.flags &= ~HAMI_LIMIT_SET

    update_limits(path, change)
    return True


def ensure_slice(path, name, asked: AskedLimits):
    """Make the slice at *path* exist and, when idle and writable to us,
    carry the limits *asked*. Returns "created", "updated" or "kept".

    Per-GPU limits (HAMi's ``_<n>`` variables) name CUDA ordinals, which only
    a process that has initialised CUDA can map to GPUs: when they are set
    and the file does not exist, the first kernel creates it from its
    environment instead, and this returns "deferred".
    """
    path = Path(path)
    try:
        stat_trusted(path)  # the folder and the file, before anything is used
        exists = True
    except FileNotFoundError:
        exists = False
    if not exists:
        if asked.per_gpu:
            ensure_folder(path.parent)
            return "deferred"
        if create_slice(path, name, asked.limits):
            return "created"
    if _has_limits_file(path) or not os.access(path, os.W_OK):
        return "kept"  # the hub or an admin owns these limits: theirs stand
    if asked.per_gpu:
        return "kept"
    return "updated" if apply_if_idle(path, asked.limits) else "kept"


def _has_limits_file(path):
    """Whether the slice has a hub-owned limits file. Fails closed: a limits file
    that cannot be looked for (or fails the trust rule) is an error, not "none"."""
    lpath = limits_file_path(path)
    try:
        stat_trusted(lpath, "limits file", owner_only=True)
    except FileNotFoundError:
        return False
    except UntrustedPath:
        raise
    except OSError as e:
        raise limits_lookup_error(lpath, e) from None
    return True
