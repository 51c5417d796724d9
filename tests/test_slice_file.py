"""SliceFile reads what the C side writes, refuses what it cannot read, never hangs.

The slice files here are built in Python with the ctypes classes (whose layout
test_slice_layout.py proves equal to the C header). Slot ownership is real: a
slot is made live by taking the OFD write lock on its first byte, in this
process or in a child process that is then killed.
"""

import ctypes
import dataclasses
import fcntl
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from hami_jupyter.slice import file as sf
from hami_jupyter.slice import layout, locks
from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.paths import UntrustedPath

GiB = 1024**3
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID2 = "GPU-22222222-1111-2222-3333-444444444444"


def build_slice(name="alice", version=(layout.HAMI_SLICE_VERSION_MAJOR, layout.HAMI_SLICE_VERSION_MINOR)):
    """A valid, empty version-1 slice file image."""
    f = layout.HamiSliceFile()
    h = f.header
    h.magic = layout.HAMI_SLICE_MAGIC
    h.version_major, h.version_minor = version
    h.file_size = layout.FILE_SIZE
    h.header_size = ctypes.sizeof(layout.HamiSliceHeader)
    h.max_devices = layout.HAMI_SLICE_MAX_DEVICES
    h.max_slots = layout.HAMI_SLICE_MAX_SLOTS
    h.device_size = ctypes.sizeof(layout.HamiSliceDevice)
    h.slot_size = ctypes.sizeof(layout.HamiSlot)
    h.limits_offset = layout.LIMITS_OFFSET
    h.devices_offset = layout.DEVICES_OFFSET
    h.slots_offset = layout.SLOTS_OFFSET
    h.created_unix_ns = 1_700_000_000_000_000_000
    h.name = name.encode()
    return f


def populated_slice():
    """Two ready GPUs (slice indexes 0 and 2), one being claimed; limits at generation 3
    with an own limit for GPU 0 and the fallback for GPU 2; slot 0 in use (pid 4242)
    and slot 5 free but not wiped."""
    f = build_slice()
    f.limits.generation = 3  # copy[1] is in force
    f.limits.changed_unix_ns = 1_700_000_001_000_000_000
    old, new = f.limits.copy
    old.device[0].memory_limit = 1 * GiB  # the copy not in force: must not be read
    old.device[0].flags = layout.HAMI_LIMIT_SET
    new.device[0].memory_limit = 4 * GiB
    new.device[0].sm_share = 50
    new.device[0].mode = layout.HAMI_MODE_ELASTIC
    new.device[0].flags = layout.HAMI_LIMIT_SET
    new.device[2].max_decoders = 2  # no HAMI_LIMIT_SET: the fallback applies
    new.fallback.memory_limit = 2 * GiB
    for i, uuid, used in ((0, UUID0, 3 * GiB), (2, UUID2, 0)):
        d = f.device[i]
        d.state = layout.HAMI_DEVICE_READY
        d.uuid = uuid.encode()
        d.sm_count = 132
        d.memory_total = 80 * GiB
        d.memory_used = used
        d.memory_peak = used + GiB
        d.sm_util = 37
    f.device[1].state = layout.HAMI_DEVICE_CLAIMING
    s = f.slot[0]
    s.state = layout.HAMI_SLOT_LIVE
    s.pid = 4242
    s.pid_ns = 4026531836
    s.uid = 1000
    s.started_unix_ns = 1_700_000_002_000_000_000
    s.active_unix_ns = 1_700_000_003_000_000_000
    s.kernel_id = b"5c1f1e6e-0a35-4c43-8f7e-6b0f1e3f9a11"
    s.comm = b"python3"
    s.memory_used[0] = 3 * GiB
    s.sm_util[0] = 37
    f.slot[5].pid = 99  # FREE: ignored whatever it holds
    return f


def write(path, image):
    path.write_bytes(bytes(image))
    return path


def lock_slot(path, index):
    """Take slot *index*'s OFD write lock as its owner would; returns the fd holding it."""
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, locks.F_OFD_SETLK, locks.flock_bytes(fcntl.F_WRLCK, layout.slot_offset(index)))
    return fd


@pytest.fixture
def slice_path(tmp_path):
    return write(tmp_path / "alice.slice", populated_slice())


def test_snapshot_of_a_valid_file(slice_path):
    owner = lock_slot(slice_path, 0)  # another open file description, same process
    try:
        snap = sf.read_snapshot(slice_path)
    finally:
        os.close(owner)

    assert snap.name == "alice"
    assert snap.path == str(slice_path)
    assert snap.version == (1, layout.HAMI_SLICE_VERSION_MINOR)
    assert snap.flags == 0
    assert snap.limits_generation == 3
    assert snap.limits_changed_unix_ns == 1_700_000_001_000_000_000
    assert snap.fallback_limit == Limits(2 * GiB, 0, "hard", 0)

    assert [d.index for d in snap.devices] == [0, 2]  # the CLAIMING device is not shown
    d0, d2 = snap.devices
    assert d0.uuid == UUID0 and d2.uuid == UUID2
    assert (d0.memory_total, d0.memory_used, d0.memory_peak) == (80 * GiB, 3 * GiB, 4 * GiB)
    assert d0.sm_count == 132 and d0.sm_util == 37
    assert d0.limit == Limits(4 * GiB, 50, "elastic", 0)  # from copy[1]
    assert not d0.limit_is_fallback
    assert d2.limit == snap.fallback_limit
    assert d2.limit_is_fallback

    assert snap.stale_slots == ()
    (slot,) = snap.slots
    assert slot.index == 0
    assert (slot.pid, slot.pid_ns, slot.uid) == (4242, 4026531836, 1000)
    assert slot.kernel_id == "5c1f1e6e-0a35-4c43-8f7e-6b0f1e3f9a11"
    assert slot.comm == "python3"
    assert slot.memory_used == {0: 3 * GiB, 2: 0}
    assert slot.sm_util == {0: 37, 2: 0}
    assert slot.started_unix_ns == 1_700_000_002_000_000_000
    assert slot.active_unix_ns == 1_700_000_003_000_000_000


def mirror_slot_fields():
    """``(name, ctypes type)`` of every field of the mirror's hami_slot but its spare bytes."""
    return [(name, ctype) for name, ctype in layout.HamiSlot._fields_ if not name.startswith("reserved")]


def test_the_readers_slot_has_the_fields_of_the_mirrors_slot():
    """Slot is hami_slot as readers see it: the mirror's fields, plus where it sits."""
    mirror = {name for name, _ in mirror_slot_fields()}
    reader = {field.name for field in dataclasses.fields(sf.Slot)} - {"index"}
    assert reader == mirror, (f"only in layout.HamiSlot: {sorted(mirror - reader)}; "
                              f"only in file.Slot: {sorted(reader - mirror)}")


def test_every_slot_field_reads_back_what_the_file_holds(tmp_path):
    """Each field of the mirror's slot, set to a value of its own, reaches the reader's
    Slot: text as text, per-device arrays by slice device index (the ready GPUs 0 and 2)."""
    image = populated_slice()
    raw = image.slot[0]
    expected = {"state": layout.HAMI_SLOT_LIVE}  # a slot a reader shows is live or stale
    for n, (name, ctype) in enumerate(mirror_slot_fields(), 1):
        if name == "state":
            continue
        if issubclass(ctype, ctypes.Array) and ctype._type_ is ctypes.c_char:
            text = f"{name}-{n}"[: ctype._length_ - 1]
            setattr(raw, name, text.encode())
            expected[name] = text
        elif issubclass(ctype, ctypes.Array):
            values = getattr(raw, name)
            for d in range(ctype._length_):
                values[d] = (n * 16 + d) % 255 + 1  # fits a uint8 too
            expected[name] = {d: values[d] for d in (0, 2)}
        else:
            setattr(raw, name, n)
            expected[name] = n
    # Nobody holds the slot's lock: a stale slot, read field for field like a live one.
    (slot,) = sf.read_snapshot(write(tmp_path / "alice.slice", image)).stale_slots
    assert slot.index == 0
    assert {name: getattr(slot, name, "(missing)") for name in expected} == expected


def test_limits_follow_the_generation(slice_path):
    with sf.SliceFile(slice_path) as reader:
        assert reader.snapshot().devices[0].limit.memory_limit == 4 * GiB
        # A writer fills the copy not in force, then bumps the generation.
        image = populated_slice()
        image.limits.copy[0].device[0].memory_limit = 6 * GiB
        image.limits.copy[0].device[0].flags = layout.HAMI_LIMIT_SET
        image.limits.generation = 4
        with open(slice_path, "r+b") as f:
            f.write(bytes(image))
        snap = reader.snapshot()
    assert snap.limits_generation == 4
    assert snap.devices[0].limit.memory_limit == 6 * GiB


def test_limit_reads_are_bounded(slice_path, monkeypatch):
    """A generation that moves on every read ends in an error, not an endless loop."""
    ticks = iter(range(10**6))
    with sf.SliceFile(slice_path) as reader:
        monkeypatch.setattr(reader, "_limits_u64", lambda offset: next(ticks))
        with pytest.raises(sf.LimitsBusy, match="limits changed"):
            reader.snapshot()


def test_live_state_without_lock_is_stale(slice_path):
    before = slice_path.read_bytes()
    snap = sf.read_snapshot(slice_path)
    assert snap.slots == ()
    assert [s.pid for s in snap.stale_slots] == [4242]
    assert slice_path.read_bytes() == before  # the reader reclaims nothing


def test_slot_locked_by_a_child_is_live_until_it_is_killed(slice_path):
    # The child speaks the raw protocol (struct flock by hand), not our helpers.
    child_code = textwrap.dedent(
        """
        import fcntl, os, struct, sys, time
        F_OFD_SETLK = 37
        fd = os.open(sys.argv[1], os.O_RDWR)
        lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[2]), 1, 0)
        fcntl.fcntl(fd, F_OFD_SETLK, lock)
        print("locked", flush=True)
        time.sleep(120)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code, str(slice_path), str(layout.slot_offset(0))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        with sf.SliceFile(slice_path) as reader:
            assert [s.pid for s in reader.snapshot().slots] == [4242]
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            snap = reader.snapshot()
        assert snap.slots == ()
        assert [s.index for s in snap.stale_slots] == [0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_wrong_magic_is_refused(tmp_path):
    image = build_slice()
    image.header.magic = b"NOTSLICE"
    path = write(tmp_path / "x", image)
    with pytest.raises(sf.SliceFileError, match="not a slice file"):
        sf.SliceFile(path)


def test_unknown_major_version_is_refused_clearly(tmp_path):
    path = write(tmp_path / "future.slice", build_slice(version=(2, 0)))
    with pytest.raises(sf.UnsupportedVersion) as info:
        sf.SliceFile(path)
    message = str(info.value)
    assert str(path) in message
    assert "version 2.0" in message
    assert "1.x" in message


def test_newer_minor_version_is_read(tmp_path):
    path = write(tmp_path / "minor.slice", build_slice(name="bob", version=(1, 9)))
    snap = sf.read_snapshot(path)
    assert snap.version == (1, 9)
    assert snap.name == "bob"


@pytest.mark.parametrize("length", [0, 7, 100, 255, 256, 1000, layout.SLOTS_OFFSET, layout.FILE_SIZE - 1])
def test_truncated_file_is_refused(tmp_path, length):
    path = tmp_path / "short.slice"
    path.write_bytes(bytes(populated_slice())[:length])
    with pytest.raises(sf.TruncatedSliceFile, match="truncated"):
        sf.SliceFile(path)


def test_file_shorter_than_its_header_says_is_refused(tmp_path):
    image = build_slice()
    image.header.file_size = layout.FILE_SIZE + 4096
    path = write(tmp_path / "short.slice", image)
    with pytest.raises(sf.TruncatedSliceFile, match="truncated"):
        sf.SliceFile(path)


@pytest.mark.parametrize(
    "field, value",
    [("slot_size", 512), ("max_slots", 1024), ("slots_offset", 0), ("file_size", 4096)],
)
def test_inconsistent_geometry_is_refused(tmp_path, field, value):
    image = build_slice()
    setattr(image.header, field, value)
    path = write(tmp_path / "bad.slice", image)
    with pytest.raises(sf.SliceFileError, match=field):
        sf.SliceFile(path)


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UntrustedPath, match="is a FIFO .named pipe., not a regular file"):
        sf.SliceFile(fifo)


def test_garbage_never_crashes(tmp_path):
    """Random bytes, with and without a valid header in front, give SliceFileError only."""
    rng = random.Random(1234)
    valid_header = bytes(build_slice())[:256]
    path = tmp_path / "garbage"
    for trial in range(200):
        size = rng.choice([0, 1, 255, 256, 4096, layout.FILE_SIZE, layout.FILE_SIZE + 10])
        data = bytearray(rng.getrandbits(8) for _ in range(min(size, 512))) + bytes(max(0, size - 512))
        if trial % 2 and size >= 256:
            data[:256] = valid_header
            data[rng.randrange(256)] = rng.getrandbits(8)  # one damaged byte
        path.write_bytes(data)
        try:
            sf.read_snapshot(path)
        except sf.SliceFileError:
            pass
