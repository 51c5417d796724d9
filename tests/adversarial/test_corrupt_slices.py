"""Hundreds of corrupted slice files, and garbage limits files beside good ones.

A real slice file is made first (two GPUs met, a process killed holding
memory, so it has a stale slot), and its two limit copies are made equal so
that only corruption, never an older limit, can be in force. Then each case is
a copy of it, damaged one way: random byte flips in the header, in the device
and slot tables, or in the limits block (anything but the memory limits
themselves, which are the slice's to change), crafted header fields (magic,
versions, sizes, counts, the three offsets, flags, name), truncations, oversized
files, random garbage, and garbage companion ``.limits`` files (random bytes,
truncated, wrong magic, version or size, a folder, a FIFO, a dangling link).

A process asking for a 1 GiB cap then opens each file and tries to fill the
GPU. It must either run capped (the simulated GPU never gives it more than the
cap) or refuse CUDA with a "hami:" line on stderr: never crash (a signal or a
sanitizer report), never hang, never allocate past the cap. How the Python
reader judged the same file is counted beside it (where the two disagree).
"""

import ctypes
import os
import random
import struct
import time

from adversarial_helpers import (
    CAPPED,
    CRASH,
    FAIL_OPEN,
    HANG,
    REFUSED,
    SILENT_REFUSAL,
    Tally,
    hami_lines,
    run_fill,
    sanitizer_report,
)
from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, SIM_CONTEXT

from hami_jupyter.slice import file as sf
from hami_jupyter.slice import layout

CAP = GiB
RUN_TIMEOUT = 10.0
FILL = "fill 64m"

HEADER = layout.HamiSliceHeader
LIMITS = layout.LIMITS_OFFSET
SET_SIZE = ctypes.sizeof(layout.HamiLimitSet)
LIMIT_SIZE = ctypes.sizeof(layout.HamiDeviceLimit)
COPY0 = LIMITS + layout.HamiSliceLimits.copy.offset
LIMITS_END = LIMITS + ctypes.sizeof(layout.HamiSliceLimits)


def _field(name):
    f = getattr(HEADER, name)
    return f.offset, f.size


def _put(data, offset, size, value):
    data[offset:offset + size] = value.to_bytes(size, "little")


def _memory_limit_bytes():
    """Offsets of every memory_limit field of the limits block (never flipped)."""
    out = set()
    for copy in range(2):
        base = COPY0 + copy * SET_SIZE
        for entry in range(layout.HAMI_SLICE_MAX_DEVICES + 1):  # 16 devices, then the fallback
            start = base + entry * LIMIT_SIZE + layout.HamiDeviceLimit.memory_limit.offset
            out.update(range(start, start + 8))
    return out


PROTECTED = _memory_limit_bytes()


def _flip(rng, data, lo, hi, count, avoid=frozenset()):
    for _ in range(count):
        while True:
            at = rng.randrange(lo, hi)
            if at not in avoid:
                break
        data[at] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)


def _limits_file(memory_limit):
    """A well-formed companion limits file holding *memory_limit* in force, as bytes."""
    lf = layout.HamiLimitsFile()
    lf.magic = layout.HAMI_LIMITS_MAGIC
    lf.version_major = layout.HAMI_LIMITS_VERSION_MAJOR
    lf.version_minor = layout.HAMI_LIMITS_VERSION_MINOR
    lf.file_size = layout.LIMITS_FILE_SIZE
    for copy in range(2):
        lf.limits.copy[copy].fallback.memory_limit = memory_limit
        lf.limits.copy[copy].fallback.flags = layout.HAMI_LIMIT_SET
    return bytearray(bytes(lf))


def _cases(rng, base):
    """(class, slice file bytes, limits file: None | bytes | "dir" | "fifo" | "dangling") for every case."""
    size = len(base)
    cases = []

    def add(cls, data, limits=None):
        cases.append((cls, bytes(data), limits))

    # Random flips: the header, the device and slot tables, the limits block (not its memory limits).
    for _ in range(100):
        d = bytearray(base)
        _flip(rng, d, 0, ctypes.sizeof(HEADER), rng.randint(1, 4))
        add("flip-header", d)
    for _ in range(40):
        d = bytearray(base)
        _flip(rng, d, layout.DEVICES_OFFSET, layout.DEVICES_OFFSET + 2 * ctypes.sizeof(layout.HamiSliceDevice),
              rng.randint(1, 8))
        add("flip-devices", d)
    for _ in range(40):
        d = bytearray(base)
        _flip(rng, d, layout.SLOTS_OFFSET, layout.SLOTS_OFFSET + 4 * ctypes.sizeof(layout.HamiSlot), rng.randint(1, 8))
        add("flip-slots", d)
    for _ in range(40):
        d = bytearray(base)
        _flip(rng, d, LIMITS, LIMITS_END, rng.randint(1, 6), avoid=PROTECTED)
        add("flip-limits", d)
    for _ in range(40):
        d = bytearray(base)
        _flip(rng, d, 0, size, rng.randint(2, 32), avoid=PROTECTED)
        add("flip-anywhere", d)

    # Crafted header fields.
    big = (1 << 64) - 1
    crafted = {
        "magic": [b"\0" * 8, b"HAMISLCF", b"hamislce", b"HAMILIMT"],
        "version_major": [0, 2, 3, 0x80000001, (1 << 32) - 1],
        "version_minor": [0, 4, 99, (1 << 32) - 1],
        "file_size": [0, 1, 256, layout.FILE_SIZE - 1, layout.FILE_SIZE + 1, layout.FILE_SIZE * 2, 1 << 40, big],
        "header_size": [0, 255, 257, 4096, (1 << 32) - 1],
        "flags": [layout.HAMI_SLICE_FLAG_PRIVATE, 0xFFFFFFFF, 0x80000000],
        "max_devices": [0, 1, 15, 17, 64, (1 << 32) - 1],
        "max_slots": [0, 1, 255, 257, 1 << 20, (1 << 32) - 1],
        "device_size": [0, 64, 127, 129, 256],
        "slot_size": [0, 512, 1023, 1025, 2048],
        "limits_offset": [0, 8, 255, 257, 264, layout.DEVICES_OFFSET, layout.SLOTS_OFFSET, layout.FILE_SIZE,
                          layout.FILE_SIZE - 8, 1 << 32, big],
        "devices_offset": [0, 256, layout.DEVICES_OFFSET - 8, layout.DEVICES_OFFSET + 8, layout.SLOTS_OFFSET,
                           layout.FILE_SIZE, layout.FILE_SIZE - 128, 1 << 40, big],
        "slots_offset": [0, layout.DEVICES_OFFSET, layout.SLOTS_OFFSET - 1024, layout.SLOTS_OFFSET + 1024,
                         layout.FILE_SIZE, layout.FILE_SIZE - 1024, big],
        "created_unix_ns": [0, big],
    }
    for name, values in crafted.items():
        offset, width = _field(name)
        for value in values:
            d = bytearray(base)
            if isinstance(value, bytes):
                d[offset:offset + width] = value
            else:
                _put(d, offset, width, value)
            add(f"header-{name}", d)
    name_at, name_len = _field("name")
    for name in [b"A" * name_len, b"", b"../../etc/passwd", b"\xff\xfe\x00", b"a\nb", b" "]:
        d = bytearray(base)
        d[name_at:name_at + name_len] = name[:name_len].ljust(name_len, b"\0")
        add("header-name", d)
    # Several header fields wrong at once, in ways that agree with each other.
    for _ in range(10):
        d = bytearray(base)
        for name in rng.sample(sorted(n for n in crafted if n != "magic"), 3):
            offset, width = _field(name)
            _put(d, offset, width, rng.choice(crafted[name]))
        add("header-several", d)

    # Limits block fields other than the memory limits.
    gen_at = LIMITS + layout.HamiSliceLimits.generation.offset
    for value in [1, 2, 3, (1 << 64) - 1, (1 << 63) + 1, rng.randrange(1 << 64)]:
        d = bytearray(base)
        _put(d, gen_at, 8, value)
        add("limits-generation", d)
    for field, values in [("mode", [2, 7, 0xFFFFFFFF]), ("sm_share", [101, 255, 0xFFFFFFFF]),
                          ("max_decoders", [256, 0xFFFFFFFF]), ("flags", [0, 2, 0xFFFFFFFE, 0xFFFFFFFF]),
                          ("memory_guarantee", [(1 << 64) - 1])]:
        f = getattr(layout.HamiDeviceLimit, field)
        for value in values:
            for entry in (0, layout.HAMI_SLICE_MAX_DEVICES):  # device 0's entry, the fallback
                d = bytearray(base)
                for copy in range(2):
                    _put(d, COPY0 + copy * SET_SIZE + entry * LIMIT_SIZE + f.offset, f.size, value)
                add(f"limits-{field}", d)

    # Truncated and oversized.
    cuts = [0, 1, 7, 8, 16, 255, 256, LIMITS + 8, layout.DEVICES_OFFSET, layout.DEVICES_OFFSET + 64, layout.SLOTS_OFFSET,
            layout.SLOTS_OFFSET + 1024, layout.FILE_SIZE // 2, layout.FILE_SIZE - 1024, layout.FILE_SIZE - 1]
    cuts += [rng.randrange(1, layout.FILE_SIZE) for _ in range(25)]
    for cut in cuts:
        add("truncated", base[:cut])
    for extra in (1, 8, 4096, 1 << 20):
        add("oversized", base + os.urandom(extra) if rng.random() < 0.5 else base + b"\0" * extra)
        d = bytearray(base + b"\0" * extra)
        _put(d, *_field("file_size"), len(d))
        add("oversized-declared", d)

    # Garbage.
    for _ in range(12):
        add("garbage", rng.randbytes(layout.FILE_SIZE))
    for _ in range(12):
        d = bytearray(rng.randbytes(layout.FILE_SIZE))
        d[:ctypes.sizeof(HEADER)] = base[:ctypes.sizeof(HEADER)]
        add("garbage-behind-header", d)

    # Garbage limits files beside a good slice file.
    good = _limits_file(CAP)
    limits_cases = [b"", b"HAMILIMT", bytes(good[:64]), bytes(good[:-1]), rng.randbytes(layout.LIMITS_FILE_SIZE),
                    "dir", "fifo", "dangling"]
    for _ in range(20):
        limits_cases.append(rng.randbytes(rng.randrange(1, 8192)))
    for field, value in [("magic", b"HAMISLCE"), ("magic", b"\0" * 8), ("version_major", 0),
                         ("version_major", 2), ("version_major", (1 << 32) - 1), ("file_size", 0),
                         ("file_size", layout.LIMITS_FILE_SIZE - 1)]:
        f = getattr(layout.HamiLimitsFile, field)
        d = bytearray(good)
        if isinstance(value, bytes):
            d[f.offset:f.offset + f.size] = value
        else:
            _put(d, f.offset, f.size, value)
        limits_cases.append(bytes(d))
    for _ in range(20):
        d = bytearray(good)
        _flip(rng, d, 0, layout.LIMITS_FILE_BLOCK_OFFSET, rng.randint(1, 3))
        limits_cases.append(bytes(d))
    for limits in limits_cases:
        add("limits-file-garbage", base, limits)
    # A well-formed limits file with a smaller cap is the hub's word: capped lower, not refused.
    add("limits-file-smaller", base, bytes(_limits_file(CAP // 2)))
    return cases


def _make_base(cudrive, make_slice, gpu):
    s = make_slice(name="base.slice", limit="1g", overhead="64m")
    keeper = cudrive.start(s.env)
    keeper.ok("init")
    keeper.ok("ctx 0")
    keeper.ok("ctx 1")
    keeper.ok("ctx 0")
    keeper.ok("alloc 100m")
    keeper.kill9()  # leaves a stale slot holding its context and 100 MiB
    data = bytearray(s.path.read_bytes())
    assert len(data) == layout.FILE_SIZE
    # Both limit copies equal, every device entry holding the fallback's limit:
    # a flip of the generation or of a flag then lands on the same cap.
    gen = struct.unpack_from("=Q", data, LIMITS)[0]
    live = COPY0 + (gen & 1) * SET_SIZE
    other = COPY0 + ((gen & 1) ^ 1) * SET_SIZE
    fallback = bytes(data[live + 16 * LIMIT_SIZE:live + 17 * LIMIT_SIZE])
    assert struct.unpack_from("=Q", fallback, 0)[0] == CAP
    for entry in range(layout.HAMI_SLICE_MAX_DEVICES):
        at = live + entry * LIMIT_SIZE
        if not struct.unpack_from("=I", data, at + layout.HamiDeviceLimit.flags.offset)[0] & layout.HAMI_LIMIT_SET:
            data[at:at + LIMIT_SIZE] = fallback[:layout.HamiDeviceLimit.flags.offset] + b"\0" * 4 + \
                fallback[layout.HamiDeviceLimit.flags.offset + 4:]
    data[other:other + SET_SIZE] = data[live:live + SET_SIZE]
    return s, bytes(data)


def _python_verdict(path):
    try:
        sf.read_snapshot(path)
        return "accepts"
    except Exception:
        return "refuses"


def classify(rc, out, err):
    """The outcome of `init ctx 0 fill 64m` against a 1 GiB cap, and the bytes it got."""
    import json

    if rc is None:
        return HANG, 0
    if rc < 0 or sanitizer_report(err):
        return CRASH, 0
    recs = {}
    for line in out.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            recs[rec["op"]] = rec
    if "fill" not in recs:
        return CRASH, 0  # exited before its script ended
    ran = recs["init"]["rc"] == 0 and recs["ctx"]["rc"] == 0
    got = recs["fill"]["bytes"] + (SIM_CONTEXT if ran else 0)
    if got > CAP:
        return FAIL_OPEN, got
    if ran and recs["fill"]["last_rc"] == CUDA_ERROR_OUT_OF_MEMORY:
        return CAPPED, got
    return (REFUSED if hami_lines(err) else SILENT_REFUSAL), got


def test_corrupted_slice_files_never_fail_open(cudrive, make_slice, gpu, seed, report, tmp_path):
    base_seed, rng_seed = seed
    rng = random.Random(rng_seed)
    report(f"seed {base_seed} (HAMI_ADVERSARIAL_SEED), stream {rng_seed}")
    s, base = _make_base(cudrive, make_slice, gpu)
    cases = _cases(rng, base)
    folder = tmp_path / "corrupt"
    folder.mkdir(mode=0o700)
    gpu.reset_peak()
    outcomes = Tally()
    by_class = {}
    disagreements = Tally()
    bad = []
    started = time.monotonic()
    for n, (cls, data, limits) in enumerate(cases):
        path = folder / f"c{n:04d}.slice"
        path.write_bytes(data)
        path.chmod(0o600)
        lpath = folder / f"c{n:04d}.limits"
        if limits == "dir":
            lpath.mkdir()
        elif limits == "fifo":
            os.mkfifo(lpath, 0o600)
        elif limits == "dangling":
            lpath.symlink_to(folder / "nowhere")
        elif limits is not None:
            lpath.write_bytes(limits)
            lpath.chmod(0o644)
        python = _python_verdict(path)
        env = dict(s.env, HAMI_SLICE=str(path))
        rc, out, err = run_fill(cudrive, env, RUN_TIMEOUT, FILL)
        outcome, got = classify(rc, out, err)
        outcomes[outcome] += 1
        by_class.setdefault(cls, Tally())[outcome] += 1
        if outcome in (CAPPED,) and python == "refuses":
            disagreements[f"C runs, Python refuses: {cls}"] += 1
        if outcome in (REFUSED, SILENT_REFUSAL) and python == "accepts":
            disagreements[f"C refuses, Python reads: {cls}"] += 1
        if os.environ.get("HAMI_ADVERSARIAL_VERBOSE"):
            print(f"case {n} {cls} limits={limits if isinstance(limits, str) else (limits or b'')[:24]!r}: "
                  f"{outcome} got {got} python {python}: {' | '.join(hami_lines(err))[:300]}")
        if outcome in (FAIL_OPEN, CRASH, HANG, SILENT_REFUSAL):
            bad.append(f"case {n} ({cls}): {outcome}, got {got} bytes, exit {rc}\n"
                       f"  stdout: {out.strip()[-600:]}\n  stderr: {err.strip()[-1500:]}")
        if limits is not None and limits not in ("dir", "fifo", "dangling") or limits == "dangling":
            lpath.unlink()
        elif limits in ("dir",):
            lpath.rmdir()
        elif limits == "fifo":
            lpath.unlink()
        path.unlink()
    took = time.monotonic() - started
    peak = gpu.peak(0)
    report(f"{len(cases)} corrupted slice files in {took:.1f} s: {outcomes}; simulator peak "
           f"{peak // MiB} MiB (cap {CAP // MiB} MiB)")
    for cls in sorted(by_class):
        report(f"  {cls}: {by_class[cls]}")
    if disagreements:
        report(f"C and Python judge differently (not a failure here): {disagreements}")
    assert len(cases) >= 400
    assert not bad, f"{len(bad)} of {len(cases)} cases failed:\n" + "\n".join(bad[:20])
    assert peak <= CAP, f"the simulator's peak {peak} bytes is over the {CAP}-byte cap"


def _forge_every_slot(path, pid, used):
    """Every slot of the slice file LIVE, naming *pid*, charging *used* on every GPU,
    held by nobody: what a user can write into her own slice file (issue 33, finding 7)."""
    slot = layout.HamiSlot()
    slot.state = layout.HAMI_SLOT_LIVE
    slot.pid = pid
    for d in range(layout.HAMI_SLICE_MAX_DEVICES):
        slot.memory_used[d] = used
    with open(path, "r+b") as f:
        for i in range(layout.HAMI_SLICE_MAX_SLOTS):
            f.seek(layout.slot_offset(i))
            f.write(bytes(slot))


def test_forged_slots_claiming_everything_do_not_lift_the_cap(cudrive, make_slice, gpu):
    """256 LIVE slots of PID 0 charging 2^64-1 each, which nobody holds: a new
    process takes a slot (reclaiming one), its sweeps reclaim the rest, and none
    of that may credit the slice's counter with what the forged slots claimed:
    the process stays within its 1 GiB cap, before and after the sweeps."""
    s = make_slice(name="forged.slice", limit="1g", overhead="64m")
    assert cudrive.run("init ctx 0", s.env).one("ctx")["rc"] == 0  # the file, with GPU 0's entry
    _forge_every_slot(s.path, 0, (1 << 64) - 1)
    gpu.reset_peak()
    res = cudrive.run("init ctx 0 fill 64m sleep 300 fill 64m sleep 300 fill 64m", s.env)
    fills = res.ops("fill")
    assert len(fills) == 3, res.describe()
    got = SIM_CONTEXT + sum(f["bytes"] for f in fills)
    assert got <= CAP, f"{got} bytes in a {CAP}-byte slice: {res.describe()}"
    assert all(f["last_rc"] == CUDA_ERROR_OUT_OF_MEMORY for f in fills), res.describe()
    assert gpu.peak(0) <= CAP
    # Two slots whose charges add up to 2^64 must not pass for an empty slice either.
    _forge_every_slot(s.path, 0, 0)
    half = layout.HamiSlot()
    half.state = layout.HAMI_SLOT_LIVE
    half.memory_used[0] = 1 << 63
    with open(s.path, "r+b") as f:
        for i in (200, 201):
            f.seek(layout.slot_offset(i))
            f.write(bytes(half))
    gpu.reset_peak()
    res = cudrive.run("init ctx 0 fill 64m sleep 300 fill 64m", s.env)
    got = SIM_CONTEXT + sum(f["bytes"] for f in res.ops("fill"))
    assert got <= CAP, f"{got} bytes in a {CAP}-byte slice: {res.describe()}"
