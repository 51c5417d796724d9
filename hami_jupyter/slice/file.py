"""Read a slice file: what its processes use and the limits that hold them.

:class:`SliceFile` only reads. It maps the file read-only, never takes a lock,
never waits and never writes, so it cannot disturb the kernels of the slice
and cannot hang on one that died mid-update. Opening and reading a slice of a
few processes takes about 0.15 ms; with all 256 slots in use, about 1-2 ms
(one ``fcntl`` per used slot dominates). The layout it reads is :mod:`.layout`.

Which processes are alive is decided exactly as the C side decides it: a slot
belongs to a live process while some open file description holds an OFD write
lock on the slot's first byte (:mod:`.locks`). The kernel drops that lock when
the owner dies, whatever PID namespace it ran in, so a recycled PID cannot
make a dead slot look alive. A slot whose state says live while nobody holds
its lock belongs to a process that died: it is reported as *stale* until a
process of the slice reclaims it.

A slice whose limits a hub owns keeps them in a companion limits file; the
reader maps it too, and fails closed when it cannot be looked for.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import struct
from dataclasses import dataclass

from .layout import (
    FILE_SIZE,
    HAMI_DEVICE_READY,
    HAMI_FAST_DONE,
    HAMI_PARK_PARKED,
    HAMI_PARK_PARKING,
    HAMI_LIMITS_MAGIC,
    HAMI_LIMITS_VERSION_MAJOR,
    HAMI_SLICE_MAGIC,
    HAMI_SLICE_MAX_DEVICES,
    HAMI_SLICE_MAX_SLOTS,
    HAMI_SLICE_VERSION_MAJOR,
    HAMI_SLOT_LIVE,
    HAMI_LIMIT_SET,
    DEVICES_OFFSET,
    LIMITS_FILE_BLOCK_OFFSET,
    LIMITS_FILE_SIZE,
    LIMITS_OFFSET,
    SLOTS_OFFSET,
    HamiLimitSet,
    HamiLimitsFile,
    HamiSliceDevice,
    HamiSliceHeader,
    HamiSliceLimits,
    HamiSlot,
    limits_file_path,
    slot_offset,
)
from .limits import Limits
from .locks import write_locked
from .paths import UntrustedPath, open_trusted


def limits_lookup_error(path, error):
    """The error for a limits file that cannot even be looked for (*error*: the
    OSError of the look). The slice then fails closed, as in the preload library."""
    return SliceFileError(
        f"{os.fspath(path)}: the limits file of this slice cannot be looked for "
        f"({error.strerror or error}), so the slice is refused rather than read without its "
        "limits; use a shorter slice path, or let this user search the slice folder")


# ---- errors -----------------------------------------------------------------


class SliceFileError(Exception):
    """The file is not a slice file this reader can read."""


class UnsupportedVersion(SliceFileError):
    """The file has a layout major version this reader does not know."""


class TruncatedSliceFile(SliceFileError):
    """The file is shorter than its header or the layout says."""


class LimitsBusy(SliceFileError):
    """The limits changed on every read attempt (writers faster than the reader)."""


# ---- snapshot ---------------------------------------------------------------


@dataclass
class Device:
    """One GPU the slice has met; *index* is its slice device index."""

    index: int
    uuid: str
    sm_count: int
    memory_total: int
    memory_used: int  # the whole slice's charge, reservations included
    memory_peak: int
    sm_util: int
    decoders: int
    limit: Limits  # the limits in force: the device's own entry, else the fallback
    limit_is_fallback: bool


# The reader's slot is the mirror's hami_slot (layout.HamiSlot, which
# test_slice_layout.py holds to the C header), field for field: a field added
# there reaches every reader with no second list to keep. Each field is read by
# a rule its ctypes type picks; a type with no rule fails at import.

_INTEGERS = (ctypes.c_int8, ctypes.c_uint8, ctypes.c_int16, ctypes.c_uint16,
             ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64)
# kind of field -> (python type, default)
_KINDS = {"int": (int, int), "text": (str, str), "per_gpu": (dict[int, int], dict)}


def _slot_kind(name, ctype):
    """How a reader shows one field of the mirror's slot: an int, text, or a
    per-GPU array as ``{slice device index: value}``."""
    if ctype in _INTEGERS:
        return "int"
    if issubclass(ctype, ctypes.Array) and ctype._type_ is ctypes.c_char:
        return "text"
    if (issubclass(ctype, ctypes.Array) and ctype._type_ in _INTEGERS
            and ctype._length_ == HAMI_SLICE_MAX_DEVICES):
        return "per_gpu"
    raise TypeError(f"layout.HamiSlot.{name} ({ctype.__name__}): {__name__} has no rule to read it")


_SLOT_FIELDS = tuple((name, _slot_kind(name, ctype)) for name, ctype in HamiSlot._fields_
                     if not name.startswith("reserved"))  # spare bytes: zero, nothing to show
_SLOT_INTS, _SLOT_TEXTS, _SLOT_PER_GPU = (tuple(name for name, k in _SLOT_FIELDS if k == kind)
                                          for kind in ("int", "text", "per_gpu"))


class _SlotReading:
    """What readers ask of a slot beyond its fields."""

    def charge_unmoved(self):
        """The parking tool publishes PARKED when the driver has checkpointed
        the process; the process then moves its charge to *parked*. True in
        between: the memory still counts as on the GPU. A process that parked
        itself (the fast park) moved the charge before PARKED was published:
        what stays in *memory_used* then is what it left on the GPU."""
        return (self.park_state == HAMI_PARK_PARKED and self.park_fast != HAMI_FAST_DONE
                and any((self.memory_used or {}).values()))

    def park_stage(self):
        """park_state as a reader should see it: still parking until the
        charge has moved."""
        return HAMI_PARK_PARKING if self.charge_unmoved() else self.park_state


Slot = dataclasses.make_dataclass(
    "Slot",
    [("index", int)] + [(name, _KINDS[kind][0], dataclasses.field(default_factory=_KINDS[kind][1]))
                        for name, kind in _SLOT_FIELDS],
    bases=(_SlotReading,),
    kw_only=True,  # the mirror's order is no part of the API
)
Slot.__module__ = __name__
Slot.__doc__ = """One process of the slice: slot *index* of the file, with every field of
layout.HamiSlot but its spare bytes. Text fields are str; a per-GPU array
(*memory_used*, *parked*, ...) maps slice device index to its value, for the
slice's ready GPUs; *pid* is in the owner's PID namespace (*pid_ns*);
*park_wanted* is nonzero while someone wants the process's memory back on
the GPU, as in the C header."""


def _read_slot(raw, index, devices):
    """The :class:`Slot` of mirror slot *raw* at *index*; per-GPU fields keep *devices*."""
    values = {name: getattr(raw, name) for name in _SLOT_INTS}
    for name in _SLOT_TEXTS:
        values[name] = _text(getattr(raw, name))
    for name in _SLOT_PER_GPU:
        array = getattr(raw, name)
        values[name] = {d: array[d] for d in devices}
    return Slot(index=index, **values)


@dataclass
class SliceSnapshot:
    """What a slice file said at one moment.

    *slots* are processes alive now; *stale_slots* belong to processes that
    died and whose usage no process of the slice has reclaimed yet (it is
    still counted in the devices' ``memory_used``).
    """

    path: str
    name: str
    version: tuple[int, int]
    flags: int
    created_unix_ns: int
    limits_generation: int
    limits_changed_unix_ns: int
    fallback_limit: Limits  # every GPU without an entry of its own
    devices: tuple[Device, ...]
    slots: tuple[Slot, ...]
    stale_slots: tuple[Slot, ...]
    limits_file: str | None = None  # the hub-owned limits file in force, if any


# ---- limits ------------------------------------------------------------------

_LIMIT_READ_ATTEMPTS = 64


def map_limits_file(slice_path):
    """``(read-only mmap, path)`` of the hub-owned limits file beside the slice
    at *slice_path*, or None when there is none.

    Fails closed, as the preload library does: a limits file that cannot even
    be looked for (its path too long, a folder we may not search, a dangling
    link, any error but "absent") is an error, never a reason to fall back on
    the user-owned block in the slice file. It must be root's or ours
    (UntrustedPath otherwise).
    """
    path = limits_file_path(slice_path)
    try:
        fd, st, _ = open_trusted(path, os.O_RDONLY, "limits file", owner_only=True)
    except FileNotFoundError:
        return None
    except UntrustedPath:
        raise
    except OSError as e:
        raise limits_lookup_error(path, e) from None
    try:
        head = HamiLimitsFile.from_buffer_copy(
            os.pread(fd, LIMITS_FILE_SIZE, 0).ljust(LIMITS_FILE_SIZE, b"\0"))
        if head.magic != HAMI_LIMITS_MAGIC:
            raise SliceFileError(f"{path}: not a hami limits file; ask whoever manages "
                                 "the slices to recreate it")
        if head.version_major != HAMI_LIMITS_VERSION_MAJOR:
            raise UnsupportedVersion(
                f"{path}: limits file layout version {head.version_major}.{head.version_minor} "
                f"is not supported; this hami-jupyter reads version {HAMI_LIMITS_VERSION_MAJOR}.x")
        if st.st_size < LIMITS_FILE_SIZE or head.file_size < LIMITS_FILE_SIZE:
            raise TruncatedSliceFile(f"{path}: truncated limits file: {st.st_size} bytes, "
                                     f"needs {LIMITS_FILE_SIZE}")
        return mmap.mmap(fd, LIMITS_FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ), path
    finally:
        os.close(fd)  # the mapping keeps the file


def read_limit_set(u64, copy_of, path):
    """``(generation, changed_unix_ns, HamiLimitSet)`` of the copy in force of a
    limits block (a slice file's, or a limits file's). *u64* reads one field of
    the block (its offset in ``HamiSliceLimits``); *copy_of* gives copy 0 or 1.

    Reads generation g, copies ``copy[g & 1]``, re-reads the generation and
    keeps the copy only if it did not move; a writer that dies half-way
    never published its copy, so this settles unless writers keep racing.
    Bounded: raises :class:`LimitsBusy` instead of spinning forever.
    """
    gen_at = HamiSliceLimits.generation.offset
    for _ in range(_LIMIT_READ_ATTEMPTS):
        generation = u64(gen_at)
        copy = copy_of(generation & 1)
        changed = u64(HamiSliceLimits.changed_unix_ns.offset)
        if u64(gen_at) == generation:
            return generation, changed, copy
    raise LimitsBusy(f"{os.fspath(path)}: limits changed on each of {_LIMIT_READ_ATTEMPTS} reads; try again")


def _limit_set_reader(buffer, base):
    """``(u64, copy_of)`` of :func:`read_limit_set` for the block at *base* of *buffer*."""
    copy_at = base + HamiSliceLimits.copy.offset
    set_size = ctypes.sizeof(HamiLimitSet)
    return (lambda at: struct.unpack_from("=Q", buffer, base + at)[0],
            lambda i: HamiLimitSet.from_buffer_copy(buffer, copy_at + i * set_size))


@dataclass
class LimitsFileReading:
    """What a limits file says on its own, without its slice file: *fallback*
    (the default entry) and *devices* (``{slice device index: Limits}`` of the
    entries set). Which GPU an index is, only the slice file says."""

    path: str
    fallback: Limits
    devices: dict

    def strictest(self):
        """The least memory cap among its entries (0, none, only when none sets
        one), with the fallback's other limits: the cap to hold a slice to
        when its slice file cannot be read (which GPU an entry is for is then
        unknown, and no GPU may get more than the hub gave any)."""
        caps = [l.memory_limit for l in (self.fallback, *self.devices.values()) if l.memory_limit]
        if not caps:
            return self.fallback
        return dataclasses.replace(self.fallback, memory_limit=min(caps),
                                   memory_guarantee=min(self.fallback.memory_guarantee, min(caps)))


def read_limits_file(slice_path):
    """The :class:`LimitsFileReading` of the limits file beside *slice_path*, or
    None when it has none. The errors of :func:`map_limits_file`."""
    found = map_limits_file(slice_path)
    if found is None:
        return None
    buffer, path = found
    try:
        _, _, limits = read_limit_set(*_limit_set_reader(buffer, LIMITS_FILE_BLOCK_OFFSET), path)
    finally:
        buffer.close()
    devices = {i: Limits.of_entry(e) for i, e in enumerate(limits.device) if e.flags & HAMI_LIMIT_SET}
    return LimitsFileReading(path, Limits.of_entry(limits.fallback), devices)


# ---- reader -----------------------------------------------------------------


def _text(raw):
    return raw.decode("utf-8", errors="replace")


class SliceFile:
    """A slice file opened for reading.

    ``with SliceFile(path) as sf: snap = sf.snapshot()``. Opening validates the
    header; :meth:`snapshot` may be called as often as wanted (``%hami watch``).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        # Who owns what (.paths): the folder and the file are looked at
        # before the open (a FIFO must not hang us, a planted file must not be
        # read), and what was opened is checked again.
        fd, st, _ = open_trusted(self.path, os.O_RDONLY, "slice file")
        try:
            self._check_size(st.st_size, ctypes.sizeof(HamiSliceHeader), "its header")
            header = HamiSliceHeader.from_buffer_copy(os.pread(fd, ctypes.sizeof(HamiSliceHeader), 0))
            self._validate(header, st.st_size)
            self._map = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.header = header
        self.limits_path = None
        self._limits_map, self._limits_base = self._map, LIMITS_OFFSET
        try:
            self._open_limits_file()
        except BaseException:
            self.close()
            raise

    def _open_limits_file(self):
        """Map the hub-owned companion limits file, when the slice has one
        (:func:`map_limits_file`: fails closed, as the preload library does)."""
        found = map_limits_file(self.path)
        if found is not None:
            self._limits_map, self.limits_path = found
            self._limits_base = LIMITS_FILE_BLOCK_OFFSET

    # -- validation --

    def _check_size(self, actual, needed, what):
        if actual < needed:
            raise TruncatedSliceFile(
                f"{self.path}: truncated slice file: {actual} bytes, {what} needs {needed}"
            )

    def _validate(self, h, actual_size):
        if h.magic != HAMI_SLICE_MAGIC:
            raise SliceFileError(
                f"{self.path}: not a slice file (magic {h.magic!r}, "
                f"expected {HAMI_SLICE_MAGIC!r})"
            )
        if h.version_major != HAMI_SLICE_VERSION_MAJOR:
            raise UnsupportedVersion(
                f"{self.path}: slice file layout version {h.version_major}.{h.version_minor} "
                f"is not supported; this hami-jupyter reads version "
                f"{HAMI_SLICE_VERSION_MAJOR}.x (upgrade hami-jupyter to read it)"
            )
        # Minor versions only add fields inside reserved space, so every
        # version 1.x file has exactly this geometry.
        expected = {
            "header_size": ctypes.sizeof(HamiSliceHeader),
            "max_devices": HAMI_SLICE_MAX_DEVICES,
            "max_slots": HAMI_SLICE_MAX_SLOTS,
            "device_size": ctypes.sizeof(HamiSliceDevice),
            "slot_size": ctypes.sizeof(HamiSlot),
            "limits_offset": LIMITS_OFFSET,
            "devices_offset": DEVICES_OFFSET,
            "slots_offset": SLOTS_OFFSET,
        }
        for field, want in expected.items():
            got = getattr(h, field)
            if got != want:
                raise SliceFileError(
                    f"{self.path}: corrupt slice file: header {field} is {got}, "
                    f"layout version 1 has {want}"
                )
        if h.file_size < FILE_SIZE:
            raise SliceFileError(
                f"{self.path}: corrupt slice file: header file_size is {h.file_size}, "
                f"layout version 1 needs at least {FILE_SIZE}"
            )
        self._check_size(actual_size, h.file_size, "its header's file_size")

    # -- reading --

    def _u64(self, offset):
        return struct.unpack_from("=Q", self._map, offset)[0]

    def _limits_u64(self, field_offset):
        return struct.unpack_from("=Q", self._limits_map, self._limits_base + field_offset)[0]

    def read_limits(self):
        """``(generation, changed_unix_ns, HamiLimitSet)`` of the copy in force
        (:func:`read_limit_set`)."""
        copy_of = _limit_set_reader(self._limits_map, self._limits_base)[1]
        return read_limit_set(self._limits_u64, copy_of, self.path)

    def snapshot(self):
        """Return a :class:`SliceSnapshot` of the file as it is now."""
        generation, changed, limits = self.read_limits()
        devices = []
        raw_devices = (HamiSliceDevice * HAMI_SLICE_MAX_DEVICES).from_buffer_copy(self._map, DEVICES_OFFSET)
        for i, d in enumerate(raw_devices):
            if d.state != HAMI_DEVICE_READY:
                continue  # empty, or another process is still filling it in
            own = limits.device[i]
            own_set = bool(own.flags & HAMI_LIMIT_SET)
            devices.append(Device(
                index=i,
                uuid=_text(d.uuid),
                sm_count=d.sm_count,
                memory_total=d.memory_total,
                memory_used=d.memory_used,
                memory_peak=d.memory_peak,
                sm_util=d.sm_util,
                decoders=d.decoders,
                limit=Limits.of_entry(own if own_set else limits.fallback),
                limit_is_fallback=not own_set,
            ))
        indexes = [d.index for d in devices]
        live, stale = [], []
        for i in range(HAMI_SLICE_MAX_SLOTS):
            offset = slot_offset(i)
            # A FREE slot has nothing to show, even if a process holds its lock
            # while it claims or reclaims it.
            if struct.unpack_from("=I", self._map, offset)[0] != HAMI_SLOT_LIVE:
                continue
            slot = _read_slot(HamiSlot.from_buffer_copy(self._map, offset), i, indexes)
            (live if write_locked(self._fd, offset) else stale).append(slot)
        h = self.header
        return SliceSnapshot(
            path=self.path,
            name=_text(h.name),
            version=(h.version_major, h.version_minor),
            flags=h.flags,
            created_unix_ns=h.created_unix_ns,
            limits_generation=generation,
            limits_changed_unix_ns=changed,
            fallback_limit=Limits.of_entry(limits.fallback),
            devices=tuple(devices),
            slots=tuple(live),
            stale_slots=tuple(stale),
            limits_file=self.limits_path,
        )

    # -- lifetime --

    def close(self):
        if self._fd is not None:
            if self._limits_map is not self._map:
                self._limits_map.close()
            self._map.close()
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            self.close()


def read_snapshot(path):
    """Open *path*, take one snapshot, close it."""
    with SliceFile(path) as sf:
        return sf.snapshot()
