"""The slice file's layout: the Python mirror of ``native/include/hami/slice_file.h``.

The C header is the source of truth. The constants and ctypes classes below
repeat it, same names, types, array sizes and values; ``tests/test_slice_layout.py``
compiles a program against the header and fails if any offset, size or
``#define`` disagrees. ``docs/slice-file.md`` explains the rules.

Nothing here reads or writes a file: :mod:`.file` reads slices, :mod:`.create`
makes them, :mod:`.change` changes their limits.
"""

import ctypes
import os

# ---- constants: the #defines of slice_file.h, same names -------------------

HAMI_SLICE_MAGIC = b"HAMISLCE"  # 8 bytes, no terminator
HAMI_SLICE_VERSION_MAJOR = 1
HAMI_SLICE_VERSION_MINOR = 8

HAMI_LIMITS_MAGIC = b"HAMILIMT"  # the companion limits file, 8 bytes
HAMI_LIMITS_VERSION_MAJOR = 1
HAMI_LIMITS_VERSION_MINOR = 0

HAMI_SLICE_MAX_DEVICES = 16
HAMI_SLICE_MAX_SLOTS = 256
HAMI_SLICE_NAME_LEN = 64
HAMI_SLICE_UUID_LEN = 48
HAMI_SLICE_KERNEL_ID_LEN = 48
HAMI_SLICE_COMM_LEN = 16

# Where a slice named without a path lives (paths.default_root follows this order).
HAMI_HUB_SLICE_ROOT = "/run/hami-jupyter"
HAMI_SLICE_ROOT_SUBDIR = "hami-jupyter"
HAMI_SLICE_ROOT_TMP_PREFIX = "/tmp/hami-jupyter-"
HAMI_SLICE_SUFFIX = ".slice"
HAMI_LIMITS_SUFFIX = ".limits"

HAMI_SLICE_FLAG_PRIVATE = 0x1  # anonymous slice of one process tree

HAMI_MODE_HARD = 0
HAMI_MODE_ELASTIC = 1

HAMI_LIMIT_SET = 0x1  # hami_device_limit.flags: this entry is in force (else: the fallback)

HAMI_DEVICE_EMPTY = 0
HAMI_DEVICE_CLAIMING = 1
HAMI_DEVICE_READY = 2

HAMI_SLOT_FREE = 0
HAMI_SLOT_LIVE = 1

HAMI_PARK_RUNNING = 0  # hami_slot.park_state: on the GPU
HAMI_PARK_PARKING = 1  # a parker is moving it to host memory
HAMI_PARK_PARKED = 2  # in host memory
HAMI_PARK_RESUMING = 3  # the process is bringing it back

HAMI_PARK_WAIT_NONE = 0  # hami_slot.park_wait: why a wanted resume waits
HAMI_PARK_WAIT_SLICE = 1  # no room under the slice's cap now
HAMI_PARK_WAIT_GPU = 2  # not that much free memory on the GPU now

HAMI_PARK_REASON_NONE = 0  # hami_slot.park_reason (1.7): not parked, or no reason given
HAMI_PARK_REASON_IDLE = 1  # the Jupyter server's idle policy
HAMI_PARK_REASON_ASKED = 2  # a user or administrator asked (REST, CLI, panel)
HAMI_PARK_REASON_ROOM = 3  # the memory broker: to make room for another user's work
HAMI_PARK_REASON_GUARD = 4  # the guard: over the cap by the driver's figures

# hami-park's own refusals ("error <code> <why>"), apart from the driver's CUresults (below 1000)
HAMI_PARK_REFUSED_STATE = 1001  # the slot says the process is not running on the GPU
HAMI_PARK_REFUSED_PARKER = 1002  # another parker holds the slot
HAMI_PARK_REFUSED_HOST = 1003  # host memory too low for the slot's charge

# The room ledger (its own file, written by the node agent; see slice_file.h).
HAMI_LEDGER_MAGIC = b"HAMIROOM"  # 8 bytes, no terminator
HAMI_LEDGER_VERSION_MAJOR = 1
HAMI_LEDGER_VERSION_MINOR = 0
HAMI_LEDGER_NAME = "room.ledger"
HAMI_LEDGER_MAX_GPUS = 16
HAMI_LEDGER_MAX_GRANTS = 16
HAMI_LEDGER_STALE_NS = 5000000000  # the agent writes every 0.5 s

# hami_slot.park_fast (1.8): the fast park, which the process does itself
HAMI_FAST_NONE = 0
HAMI_FAST_ASKED = 1  # a parker asks the process to park itself
HAMI_FAST_TAKEN = 2  # the process works at it
HAMI_FAST_COPYING = 3  # it moves its memory; no withdrawal any more
HAMI_FAST_DONE = 4  # parked by itself: the charge of what it moved is in parked[]
HAMI_FAST_REFUSED = 5  # it cannot: the parker checkpoints it
HAMI_FAST_FAILED = 6  # a step failed; nothing lost, it runs on unparked
HAMI_FAST_WITHDRAWN = 7  # the parker stopped waiting before COPYING


# ---- layout: the structs of slice_file.h, same names and order -------------
# Each class names its C struct in _c_name_ so the layout test can pair them.


class HamiSliceHeader(ctypes.Structure):
    _c_name_ = "hami_slice_header"
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("version_major", ctypes.c_uint32),
        ("version_minor", ctypes.c_uint32),
        ("file_size", ctypes.c_uint64),
        ("header_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("max_devices", ctypes.c_uint32),
        ("max_slots", ctypes.c_uint32),
        ("device_size", ctypes.c_uint32),
        ("slot_size", ctypes.c_uint32),
        ("limits_offset", ctypes.c_uint64),
        ("devices_offset", ctypes.c_uint64),
        ("slots_offset", ctypes.c_uint64),
        ("created_unix_ns", ctypes.c_uint64),
        ("name", ctypes.c_char * HAMI_SLICE_NAME_LEN),
        ("reserved", ctypes.c_uint8 * 112),
    ]


class HamiDeviceLimit(ctypes.Structure):
    _c_name_ = "hami_device_limit"
    _fields_ = [
        ("memory_limit", ctypes.c_uint64),
        ("sm_share", ctypes.c_uint32),
        ("mode", ctypes.c_uint32),
        ("max_decoders", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("memory_guarantee", ctypes.c_uint64),  # 1.7: 0 = the limit is the guarantee
    ]


class HamiLimitSet(ctypes.Structure):
    _c_name_ = "hami_limit_set"
    _fields_ = [
        ("device", HamiDeviceLimit * HAMI_SLICE_MAX_DEVICES),
        ("fallback", HamiDeviceLimit),
    ]


class HamiSliceLimits(ctypes.Structure):
    _c_name_ = "hami_slice_limits"
    _fields_ = [
        ("generation", ctypes.c_uint64),
        ("changed_unix_ns", ctypes.c_uint64),
        ("copy", HamiLimitSet * 2),
    ]


class HamiSliceDevice(ctypes.Structure):
    _c_name_ = "hami_slice_device"
    _fields_ = [
        ("state", ctypes.c_uint32),
        ("sm_count", ctypes.c_uint32),
        ("uuid", ctypes.c_char * HAMI_SLICE_UUID_LEN),
        ("memory_total", ctypes.c_uint64),
        ("memory_used", ctypes.c_uint64),
        ("memory_peak", ctypes.c_uint64),
        ("sm_util", ctypes.c_uint32),
        ("decoders", ctypes.c_uint32),
        ("sm_sample_us", ctypes.c_uint64),
        ("sm_open_ppm", ctypes.c_uint32),
        ("sm_tuned_for", ctypes.c_uint32),
        ("sm_others_util", ctypes.c_uint32),
        ("sm_waits", ctypes.c_uint32),
        ("sm_waits_steered", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("sm_restart_ns", ctypes.c_uint64),  # 1.8: when sm_open_ppm was last started afresh
    ]


class HamiSlot(ctypes.Structure):
    _c_name_ = "hami_slot"
    _fields_ = [
        ("state", ctypes.c_uint32),
        ("pid", ctypes.c_int32),
        ("pid_ns", ctypes.c_uint64),
        ("uid", ctypes.c_uint32),
        ("txn", ctypes.c_uint32),
        ("started_unix_ns", ctypes.c_uint64),
        ("active_unix_ns", ctypes.c_uint64),
        ("kernel_id", ctypes.c_char * HAMI_SLICE_KERNEL_ID_LEN),
        ("comm", ctypes.c_char * HAMI_SLICE_COMM_LEN),
        ("memory_used", ctypes.c_uint64 * HAMI_SLICE_MAX_DEVICES),
        ("sm_util", ctypes.c_uint32 * HAMI_SLICE_MAX_DEVICES),
        ("decoders", ctypes.c_uint8 * HAMI_SLICE_MAX_DEVICES),
        ("frames_decoded", ctypes.c_uint64),
        ("frames_mapped", ctypes.c_uint64),
        ("decode_ns", ctypes.c_uint64),
        ("park_state", ctypes.c_uint32),
        ("park_wanted", ctypes.c_uint32),
        ("park_wait", ctypes.c_uint32),
        ("park_error", ctypes.c_int32),
        ("park_unix_ns", ctypes.c_uint64),
        ("gpu_active_unix_ns", ctypes.c_uint64),
        ("parked", ctypes.c_uint64 * HAMI_SLICE_MAX_DEVICES),
        ("driver_bytes", ctypes.c_uint64 * HAMI_SLICE_MAX_DEVICES),
        ("changes", ctypes.c_uint64),  # 1.6: charges, credits and reclaims finished (the recount's check)
        ("park_reason", ctypes.c_uint32),  # 1.7: HAMI_PARK_REASON_*
        ("room_wait_device", ctypes.c_uint32),  # 1.7: slice device index of a wait for GPU room
        ("room_wait_since_unix_ns", ctypes.c_uint64),  # 1.7: nonzero while waiting for GPU room
        ("room_wait_bytes", ctypes.c_uint64),  # 1.7: the bytes it waits for
        ("park_fast", ctypes.c_uint32),  # 1.8: HAMI_FAST_*, a parker's request and the process's answer
        ("park_fast_able", ctypes.c_uint32),  # 1.8: nonzero: the process parks itself when asked
        ("reserved", ctypes.c_uint8 * 360),
    ]


class HamiSliceFile(ctypes.Structure):
    _c_name_ = "hami_slice_file"
    _fields_ = [
        ("header", HamiSliceHeader),
        ("limits", HamiSliceLimits),
        ("device", HamiSliceDevice * HAMI_SLICE_MAX_DEVICES),
        ("slot", HamiSlot * HAMI_SLICE_MAX_SLOTS),
    ]


class HamiLimitsFile(ctypes.Structure):
    _c_name_ = "hami_limits_file"
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("version_major", ctypes.c_uint32),
        ("version_minor", ctypes.c_uint32),
        ("file_size", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 40),
        ("limits", HamiSliceLimits),
    ]


class HamiRoomGrant(ctypes.Structure):
    _c_name_ = "hami_room_grant"
    _fields_ = [
        ("ticket", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("expires_unix_ns", ctypes.c_uint64),
        ("pid", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
    ]


class HamiLedgerGpu(ctypes.Structure):
    _c_name_ = "hami_ledger_gpu"
    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("uuid", ctypes.c_char * HAMI_SLICE_UUID_LEN),
        ("reserve_bytes", ctypes.c_uint64),
        ("granted_bytes", ctypes.c_uint64),
        ("free_bytes", ctypes.c_uint64),
        ("looked_unix_ns", ctypes.c_uint64),
        ("moving_until_unix_ns", ctypes.c_uint64),
        ("turns", ctypes.c_uint32),
        ("waiting", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 4),
        ("grant", HamiRoomGrant * HAMI_LEDGER_MAX_GRANTS),
    ]


class HamiRoomLedger(ctypes.Structure):
    _c_name_ = "hami_room_ledger"
    _fields_ = [
        ("magic", ctypes.c_char * 8),
        ("version_major", ctypes.c_uint32),
        ("version_minor", ctypes.c_uint32),
        ("file_size", ctypes.c_uint64),
        ("written_unix_ns", ctypes.c_uint64),
        ("agent_pid", ctypes.c_int32),
        ("reserved0", ctypes.c_uint32),
        ("reserved", ctypes.c_uint8 * 24),
        ("gpu", HamiLedgerGpu * HAMI_LEDGER_MAX_GPUS),
    ]


STRUCTS = (
    HamiSliceHeader,
    HamiDeviceLimit,
    HamiLimitSet,
    HamiSliceLimits,
    HamiSliceDevice,
    HamiSlot,
    HamiSliceFile,
    HamiLimitsFile,
    HamiRoomGrant,
    HamiLedgerGpu,
    HamiRoomLedger,
)

LIMITS_OFFSET = HamiSliceFile.limits.offset
DEVICES_OFFSET = HamiSliceFile.device.offset
SLOTS_OFFSET = HamiSliceFile.slot.offset
FILE_SIZE = ctypes.sizeof(HamiSliceFile)


LIMITS_FILE_SIZE = ctypes.sizeof(HamiLimitsFile)
LIMITS_FILE_BLOCK_OFFSET = HamiLimitsFile.limits.offset
LEDGER_SIZE = ctypes.sizeof(HamiRoomLedger)


def limits_file_path(slice_path):
    """The companion limits file of a slice: ``x/alice.slice`` -> ``x/alice.limits``."""
    p = os.fspath(slice_path)
    if p.endswith(HAMI_SLICE_SUFFIX) and len(p) > len(HAMI_SLICE_SUFFIX):
        p = p[: -len(HAMI_SLICE_SUFFIX)]
    return p + HAMI_LIMITS_SUFFIX


def slot_offset(index):
    """File offset of slot *index*; its first byte is the one its owner locks."""
    return SLOTS_OFFSET + index * ctypes.sizeof(HamiSlot)
