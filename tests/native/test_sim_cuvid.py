"""The simulated NVDEC (native/sim/sim_cuvid.c) and cudrive's decoder commands,
without the preload library.

These are the baseline the preload's NVDEC tests stand on: the simulated
library charges the device itself (the real driver allocates decoder surfaces
where no hook sees them), counts decoders and frames, refuses what the real
one refuses, and gives a killed process's decoders back.
"""

import shutil
import subprocess

import pytest

from native_helpers import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    SIM_CONTEXT,
    wait_for,
)

CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801

H264, HEVC, AV1, MPEG2, VP9 = 4, 8, 11, 1, 10
NV12, P016 = 0, 1
DECODE_STATUS_SUCCESS = 2

EXPORTS = {
    "cuvidGetDecoderCaps", "cuvidCreateDecoder", "cuvidDestroyDecoder", "cuvidReconfigureDecoder",
    "cuvidDecodePicture", "cuvidGetDecodeStatus", "cuvidMapVideoFrame", "cuvidMapVideoFrame64",
    "cuvidUnmapVideoFrame", "cuvidUnmapVideoFrame64", "cuvidCreateVideoParser", "cuvidDestroyVideoParser",
    "cuvidCtxLockCreate", "cuvidCtxLockDestroy", "cuvidCtxLock", "cuvidCtxUnlock",
}


# ---- the sim's estimate (native/sim/README.md, "NVDEC") ----------------------------


def _align(v, a):
    return (v + a - 1) // a * a


def surface(w, h, halves=3, sample_bytes=1):
    """One surface: align256(w * B) * align32(h) * (chroma halves / 2)."""
    return _align(w * sample_bytes, 256) * _align(h, 32) * halves // 2


def decoder_bytes(w, h, surfaces, outputs, depth=8, tw=None, th=None, out_bytes=None):
    """A 4:2:0 decoder with a 4:2:0 output format (NV12, or P016 when out_bytes is 2)."""
    b = 2 if depth > 8 else 1
    ob = out_bytes if out_bytes is not None else b
    return surfaces * surface(w, h, 3, b) + outputs * surface(tw or w, th or h, 3, ob)


def test_the_formula_example():
    # The README's example: H.264 1920x1080, 8 + 2 surfaces, NV12.
    assert decoder_bytes(1920, 1080, 8, 2) == 10 * 2048 * 1088 * 3 // 2 == 33_423_360


# ---- helpers ------------------------------------------------------------------------


def _proc(gpu, pid):
    for p in gpu.status()["processes"]:
        if p["pid"] == pid:
            return p
    return None


def _started(cudrive, env, dev=0):
    p = cudrive.start(env)
    p.ok("init")
    p.ok(f"ctx {dev}")
    return p


# ---- library shape -------------------------------------------------------------------


def test_only_the_cuvid_entry_points_are_exported(hami_build):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm (binutils) is not installed")
    lib = hami_build.sim_dir / "libnvcuvid.so.1"
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if len(line.split()) == 3}
    assert names == EXPORTS


def test_cudrive_finds_every_entry_point_in_the_sim(cudrive, gpu):
    res = cudrive.run(" ".join(f"cuviddlsym {n}" for n in sorted(EXPORTS)), gpu.env())
    for rec in res.ops("cuviddlsym"):
        assert rec["rc"] == CUDA_SUCCESS, res.describe()
        assert rec["lib"].endswith("/sim/libnvcuvid.so.1") and rec["sym"] == rec["symbol"], rec
    assert cudrive.run("cuviddlsym cuvidParseVideoData", gpu.env()).one("cuviddlsym")["rc"] != CUDA_SUCCESS


# ---- capabilities ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1", "mpeg2"])
@pytest.mark.parametrize("depth", [8, 10])
def test_caps_supported(cudrive, gpu, codec, depth):
    rec = cudrive.run(f"init ctx 0 cuvidcaps {codec} 420 {depth}", gpu.env()).one("cuvidcaps")
    assert rec["rc"] == CUDA_SUCCESS, rec
    assert rec["supported"] is True
    assert (rec["max_width"], rec["max_height"], rec["min_width"], rec["min_height"]) == (8192, 8192, 48, 16)
    assert rec["nvdecs"] == 7 and rec["max_mb_count"] == 512 * 512
    assert rec["output_mask"] == (1 << NV12 if depth == 8 else 1 << NV12 | 1 << P016)


@pytest.mark.parametrize("codec, chroma, depth", [("vp9", 420, 8), ("hevc", 444, 8), ("h264", 422, 8),
                                                   ("h264", "mono", 8), ("hevc", 420, 12), ("h264", 420, 9)])
def test_caps_unsupported(cudrive, gpu, codec, chroma, depth):
    rec = cudrive.run(f"init ctx 0 cuvidcaps {codec} {chroma} {depth}", gpu.env()).one("cuvidcaps")
    assert rec["rc"] == CUDA_SUCCESS, rec
    assert rec["supported"] is False and rec["max_width"] == 0 and rec["output_mask"] == 0
    assert rec["nvdecs"] == 7


def test_caps_needs_a_context_and_a_buffer(cudrive, gpu):
    res = cudrive.run("cuvidcaps h264 420 8 init cuvidcaps h264 420 8 null cuvidcaps", gpu.env())
    assert res.rcs("cuvidcaps") == [CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT]
    assert res.one("null")["rc"] == CUDA_ERROR_INVALID_VALUE


# ---- create and destroy: the charge --------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        ("1920 1080 8", decoder_bytes(1920, 1080, 8, 2)),
        ("1920 1080 8 4", decoder_bytes(1920, 1080, 8, 4)),
        ("1920 1080 20 1 codec=hevc bitdepth=10", decoder_bytes(1920, 1080, 20, 1, depth=10)),
        ("1920 1080 8 codec=hevc bitdepth=10 format=nv12", decoder_bytes(1920, 1080, 8, 2, depth=10, out_bytes=1)),
        ("3840 2160 12 3 codec=av1 target=1280x720", decoder_bytes(3840, 2160, 12, 3, tw=1280, th=720)),
        # Room to grow (ulMaxWidth/Height) is not charged until used.
        ("1280 720 8 2 3840 2160", decoder_bytes(1280, 720, 8, 2)),
        ("100 50 1 1 codec=mpeg2", decoder_bytes(100, 50, 1, 1)),
    ],
)
def test_create_charges_the_estimate_and_destroy_returns_it(cudrive, gpu, args, expected):
    p = _started(cudrive, gpu.env())
    base = gpu.used(0)
    assert base == SIM_CONTEXT
    rec = p.ok(f"decoder d1 {args}")
    assert rec["decoder"].startswith("0x") and rec["name"] == "d1"
    assert gpu.used(0) - base == expected
    st = gpu.status()
    assert st["devices"][0]["decoders"] == 1 and st["devices"][1]["decoders"] == 0
    me = _proc(gpu, p.pid)
    assert me["used"][0] == SIM_CONTEXT + expected and me["decoders"] == [1, 0]
    assert p.ok("undecoder d1")["name"] == "d1"
    assert gpu.used(0) == base
    assert gpu.device(0)["decoders"] == 0 and _proc(gpu, p.pid)["decoders"] == [0, 0]
    assert gpu.peak(0) == base + expected


def test_many_decoders_add_up(cudrive, gpu):
    one = decoder_bytes(1920, 1080, 8, 2)
    res = cudrive.run("init ctx 0 " + " ".join(f"decoder d{i} 1920 1080 8" for i in range(10))
                      + " list " + " ".join(f"undecoder d{i}" for i in range(0, 10, 2)) + " list", gpu.env())
    assert res.rcs("decoder") == [CUDA_SUCCESS] * 10, res.describe()
    assert len({r["decoder"] for r in res.ops("decoder")}) == 10
    assert res.rcs("undecoder") == [CUDA_SUCCESS] * 5
    assert [r["count"] for r in res.ops("list")] == [10, 5]
    assert gpu.peak(0) == SIM_CONTEXT + 10 * one
    assert gpu.used(0) == 0  # the process ended: everything came back


def test_decoder_goes_to_the_current_contexts_device(cudrive, gpu):
    one = decoder_bytes(1920, 1080, 8, 2)
    p = _started(cudrive, gpu.env(), dev=1)
    p.ok("decoder d1 1920 1080 8")
    assert (gpu.used(0), gpu.used(1)) == (0, SIM_CONTEXT + one)
    assert [d["decoders"] for d in gpu.status()["devices"]] == [0, 1]
    p.ok("ctx 0")
    p.ok("decoder d0 1920 1080 8")
    assert (gpu.used(0), gpu.used(1)) == (SIM_CONTEXT + one, SIM_CONTEXT + one)
    assert _proc(gpu, p.pid)["decoders"] == [1, 1]
    p.ok("undecoder d1")  # destroyed while another device's context is current
    assert (gpu.used(0), gpu.used(1)) == (SIM_CONTEXT + one, SIM_CONTEXT)


def test_visible_devices_renumbering_is_followed(cudrive, gpu):
    # CUDA ordinal 0 is simulated device 1: the decoder must be charged there.
    one = decoder_bytes(640, 480, 4, 1)
    p = _started(cudrive, gpu.env(CUDA_VISIBLE_DEVICES="1"), dev=0)
    p.ok("decoder d 640 480 4 1")
    assert (gpu.used(0), gpu.used(1)) == (0, SIM_CONTEXT + one)


@pytest.mark.parametrize(
    "args, rc",
    [
        ("0 1080 8", CUDA_ERROR_INVALID_VALUE),
        ("1920 0 8", CUDA_ERROR_INVALID_VALUE),
        ("1920 1080 0", CUDA_ERROR_INVALID_VALUE),
        ("1920 1080 65", CUDA_ERROR_INVALID_VALUE),
        ("1920 1080 8 0", CUDA_ERROR_INVALID_VALUE),
        ("1920 1080 8 65", CUDA_ERROR_INVALID_VALUE),
        ("1920 1080 8 2 1280 2160", CUDA_ERROR_INVALID_VALUE),  # ulMaxWidth below the width
        ("1920 1080 8 codec=vp9", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 chroma=444", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 chroma=422", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 bitdepth=12", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 format=p016", CUDA_ERROR_NOT_SUPPORTED),  # 8-bit decodes to NV12 only
        ("1920 1080 8 codec=hevc bitdepth=10 format=yuv444", CUDA_ERROR_NOT_SUPPORTED),
        ("8200 1080 8", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 2 9000 1080", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 1080 8 target=8704x1080", CUDA_ERROR_NOT_SUPPORTED),
        ("32 1080 8", CUDA_ERROR_NOT_SUPPORTED),
        ("1920 8 8", CUDA_ERROR_NOT_SUPPORTED),
    ],
)
def test_create_refusals_charge_nothing(cudrive, gpu, args, rc):
    res = cudrive.run(f"init ctx 0 decoder d {args} list", gpu.env())
    assert res.one("decoder")["rc"] == rc, res.describe()
    assert "decoder" not in res.one("decoder")
    assert res.one("list")["count"] == 0
    assert gpu.peak(0) == SIM_CONTEXT


def test_create_needs_a_context(cudrive, gpu):
    res = cudrive.run("decoder a 1920 1080 8 init decoder b 1920 1080 8 ctx 0 ctxrelease 0 "
                      "decoder c 1920 1080 8 null decoder", gpu.env())
    assert res.rcs("decoder") == [CUDA_ERROR_INVALID_CONTEXT] * 3
    null = res.one("null")
    assert null["rc"] == CUDA_ERROR_INVALID_VALUE and null["rc_null_info"] == CUDA_ERROR_INVALID_VALUE
    assert gpu.peak(0) == SIM_CONTEXT


def test_out_of_memory_when_the_device_is_full(cudrive, gpu):
    one = decoder_bytes(3840, 2160, 16, 4)
    p = _started(cudrive, gpu.env())
    free = p.ok("meminfo")["free"]
    p.ok(f"alloc {free - one + 1} filler")
    rec = p.cmd("decoder d 3840 2160 16 4")
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY and "decoder" not in rec
    assert gpu.device(0)["decoders"] == 0 and _proc(gpu, p.pid)["decoders"] == [0, 0]
    assert gpu.used(0) == gpu.device(0)["total"] - one + 1
    # One byte less taken: it fits exactly, and the device is full.
    p.ok("free filler")
    p.ok(f"alloc {free - one} filler")
    p.ok("decoder d 3840 2160 16 4")
    assert gpu.used(0) == gpu.device(0)["total"]
    assert p.cmd("decoder e 640 480 1 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert p.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    p.ok("undecoder d")
    assert p.ok("meminfo")["free"] == one


# ---- decode, map, status: counters -----------------------------------------------------------


def test_decode_counts_frames(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1920 1080 8")
    p.ok("decoder e 1280 720 4")
    assert p.ok("decode d 25")["decoded"] == 25
    assert p.ok("decode e")["decoded"] == 1
    dev = gpu.device(0)
    assert dev["frames_decoded"] == 26 and dev["frames_mapped"] == 0
    assert gpu.device(1)["frames_decoded"] == 0
    # Decoding charges nothing.
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(1920, 1080, 8, 2) + decoder_bytes(1280, 720, 4, 2)


def test_map_at_most_the_output_surfaces(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1920 1080 8 3")
    maps = [p.ok(f"mapframe d {i}") for i in range(3)]
    assert len({m["ptr"] for m in maps}) == 3
    assert all(m["pitch"] == 2048 for m in maps)  # align256(1920 * 1)
    assert [m["mapped"] for m in maps] == [1, 2, 3]
    over = p.cmd("mapframe d 3")
    assert over["rc"] == CUDA_ERROR_INVALID_VALUE and "ptr" not in over and over["mapped"] == 3
    assert p.cmd("mapframe32 d 3")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert gpu.device(0)["frames_mapped"] == 3
    un = p.ok("unmapframe d")
    assert un["ptr"] == maps[0]["ptr"] and un["mapped"] == 2
    again = p.ok("mapframe d 7")  # the freed output surface is mapped again
    assert again["ptr"] == maps[0]["ptr"]
    assert gpu.device(0)["frames_mapped"] == 4
    # Mapping charges nothing either.
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(1920, 1080, 8, 3)


def test_map_32_bit_pointers_and_10_bit_pitch(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1920 1080 4 2 codec=hevc bitdepth=10 target=1000x500")
    a = p.ok("mapframe32 d 0")
    b = p.ok("mapframe d 1")
    assert 0 < a["ptr"] < 1 << 32 and b["ptr"] >= 1 << 32
    assert a["pitch"] == b["pitch"] == 2048  # align256(1000 * 2): P016 output
    # Each width unmaps its own: the 64-bit unmap leaves the 32-bit mapping.
    assert p.ok("unmapframe d")["ptr"] == b["ptr"]
    assert p.cmd("unmapframe d")["err"] == "CUDRIVE_NOT_MAPPED"
    assert p.ok("unmapframe32 d")["ptr"] == a["ptr"]
    assert p.ok("mapframe32 d 3")["mapped"] == 1


def test_map_and_unmap_refusals(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 640 480 4 2")
    assert p.cmd("mapframe d 4")["rc"] == CUDA_ERROR_INVALID_VALUE  # beyond ulNumDecodeSurfaces
    assert p.cmd("mapframe d -1")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert p.cmd("unmapframe d 12345")["rc"] == CUDA_ERROR_INVALID_VALUE  # never mapped
    assert p.cmd("unmapframe d 0")["rc"] == CUDA_ERROR_INVALID_VALUE
    m = p.ok("mapframe d 0")
    p.ok("decoder e 640 480 4 2")
    assert p.cmd(f"unmapframe e {m['ptr']}")["rc"] == CUDA_ERROR_INVALID_VALUE  # another decoder's
    assert p.ok(f"unmapframe d {m['ptr']}")["mapped"] == 0
    assert p.cmd(f"unmapframe d {m['ptr']}")["rc"] == CUDA_ERROR_INVALID_VALUE  # twice
    assert gpu.device(0)["frames_mapped"] == 1


def test_decode_status_is_success_for_valid_pictures(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 640 480 4")
    assert p.ok("decodestatus d 0")["status"] == DECODE_STATUS_SUCCESS
    assert p.ok("decodestatus d 3")["status"] == DECODE_STATUS_SUCCESS
    assert p.cmd("decodestatus d 4")["rc"] == CUDA_ERROR_INVALID_VALUE


# ---- reconfigure -------------------------------------------------------------------------------


def test_reconfigure_recharges_the_difference(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1280 720 8 2 1920 1080")
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(1280, 720, 8, 2)
    p.ok("reconfigure d 1920 1080 12")
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(1920, 1080, 12, 2)
    p.ok("reconfigure d 640 360 4 320 180")
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(640, 360, 4, 2, tw=320, th=180)
    assert gpu.peak(0) == SIM_CONTEXT + decoder_bytes(1920, 1080, 12, 2)
    # Beyond the create-time maximum, or bad values: refused, charge unchanged.
    for args in ("1921 1080 4", "1920 1088 4", "0 360 4", "640 360 0", "640 360 65"):
        assert p.cmd(f"reconfigure d {args}")["rc"] == CUDA_ERROR_INVALID_VALUE, args
    assert p.cmd("reconfigure d 32 360 4")["rc"] == CUDA_ERROR_NOT_SUPPORTED
    assert p.cmd("reconfigure d 640 360 4 9000 360")["rc"] == CUDA_ERROR_NOT_SUPPORTED
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(640, 360, 4, 2, tw=320, th=180)
    p.ok("undecoder d")
    assert gpu.used(0) == SIM_CONTEXT


def test_reconfigure_without_a_maximum_stays_within_the_create_size(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1280 720 8")
    assert p.cmd("reconfigure d 1920 1080 8")["rc"] == CUDA_ERROR_INVALID_VALUE
    p.ok("reconfigure d 1280 720 16")
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(1280, 720, 16, 2)


def test_reconfigure_growth_out_of_memory_keeps_the_old_decoder(cudrive, gpu):
    small, big = decoder_bytes(1280, 720, 4, 2), decoder_bytes(3840, 2160, 16, 2)
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 1280 720 4 2 3840 2160")
    free = p.ok("meminfo")["free"]
    p.ok(f"alloc {free - (big - small) + 1} filler")
    assert p.cmd("reconfigure d 3840 2160 16")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert gpu.used(0) == gpu.device(0)["total"] - (big - small) + 1
    p.ok("free filler")
    p.ok(f"alloc {free - (big - small)} filler")
    p.ok("reconfigure d 3840 2160 16")
    assert gpu.used(0) == gpu.device(0)["total"]
    p.ok("undecoder d")
    assert p.ok("meminfo")["free"] == big


# ---- handles -----------------------------------------------------------------------------------


def test_bad_handles_are_refused(cudrive, gpu):
    p = _started(cudrive, gpu.env())
    h = p.ok("decoder d 640 480 4")["decoder"]
    m = p.ok("mapframe d 0")
    ph = p.ok("parser q")["parser"]
    p.ok("undecoder d")
    for line in (f"undecoder {h}", f"decode {h}", f"mapframe {h} 0", f"mapframe32 {h} 0",
                 f"unmapframe {h} {m['ptr']}", f"unmapframe32 {h} 1", f"reconfigure {h} 640 480 4",
                 f"decodestatus {h} 0", "undecoder 0x0", "undecoder 0x1234", f"decode {ph}",
                 f"unparser {h}", "unparser 0x5ec0200000000000"):
        rec = p.cmd(line)
        assert rec["rc"] == CUDA_ERROR_INVALID_HANDLE, (line, rec)
    # The stale handle stays stale when a new decoder takes its place.
    p.ok("decoder d2 640 480 4")
    assert p.cmd(f"decode {h}")["rc"] == CUDA_ERROR_INVALID_HANDLE
    p.ok("unparser q")
    assert p.cmd(f"unparser {ph}")["rc"] == CUDA_ERROR_INVALID_HANDLE
    assert gpu.used(0) == SIM_CONTEXT + decoder_bytes(640, 480, 4, 2)
    assert gpu.device(0)["frames_decoded"] == 0


def test_a_forked_child_does_not_inherit_decoders(cudrive, gpu):
    one = decoder_bytes(640, 480, 4, 2)
    res = cudrive.run("init ctx 0 decoder d 640 480 4 child undecoder d decode d endchild decode d undecoder d",
                      gpu.env())
    assert res.ops("undecoder")[0]["rc"] == CUDA_ERROR_INVALID_HANDLE, res.describe()
    assert res.ops("decode")[0]["rc"] == CUDA_ERROR_INVALID_HANDLE
    assert res.one("child")["status"] == 0
    # The parent's decoder is untouched by the child.
    assert res.ops("decode")[1]["decoded"] == 1 and res.ops("undecoder")[1]["rc"] == CUDA_SUCCESS
    assert gpu.peak(0) == SIM_CONTEXT + one


# ---- pass-through candidates: parser, context lock, status ---------------------------------------


def test_parser_create_and_destroy(cudrive, gpu):
    res = cudrive.run("parser p parser q codec=hevc list unparser p unparser q list", gpu.env())
    assert res.rcs("parser") == [CUDA_SUCCESS, CUDA_SUCCESS], res.describe()
    assert res.ops("parser")[0]["parser"] != res.ops("parser")[1]["parser"]
    assert res.rcs("unparser") == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert [r["count"] for r in res.ops("list")] == [2, 0]
    assert gpu.peak(0) == 0  # a parser is host-side only


def test_ctxlock_pushes_the_locked_context(cudrive, gpu):
    rec = cudrive.run("init ctx 1 ctxlock", gpu.env()).one("ctxlock")
    assert rec["rc"] == CUDA_SUCCESS, rec
    assert (rec["rc_create"], rec["rc_lock"], rec["rc_unlock"], rec["rc_destroy"]) == (0, 0, 0, 0)
    assert rec["current_is_ctx"] is True


def test_ctxlock_without_a_context_fails_on_lock(cudrive, gpu):
    # The lock is created on a NULL context; pushing it fails, and the lock is
    # left unlocked, so it can be destroyed.
    rec = cudrive.run("init ctxlock", gpu.env()).one("ctxlock")
    assert rec["rc_create"] == 0 and rec["rc_lock"] != 0 and rec["rc_destroy"] == 0, rec


# ---- a killed process's decoders ------------------------------------------------------------------


def test_killed_process_decoders_are_reclaimed(cudrive, gpu):
    one = decoder_bytes(1920, 1080, 8, 2)
    victim = _started(cudrive, gpu.env())
    other = _started(cudrive, gpu.env())
    for i in range(3):
        victim.ok(f"decoder d{i} 1920 1080 8")
    victim.ok("mapframe d0 0")
    other.ok("decoder mine 1920 1080 8")
    assert gpu.used(0) == 2 * SIM_CONTEXT + 4 * one
    assert gpu.device(0)["decoders"] == 4
    victim.kill9()
    # hami-simctl status sweeps dead processes first; so does the next charge.
    wait_for(lambda: gpu.used(0) == SIM_CONTEXT + one, timeout=5, what="the victim's decoders back")
    st = gpu.status()
    assert st["devices"][0]["decoders"] == 1
    assert [p["pid"] for p in st["processes"]] == [other.pid]
    assert _proc(gpu, other.pid)["decoders"] == [1, 0]
    other.ok("undecoder mine")
    assert gpu.used(0) == SIM_CONTEXT and gpu.device(0)["decoders"] == 0


def test_reclaim_happens_on_the_next_charge(cudrive, gpu):
    # Nobody calls hami-simctl: a decoder that needs the dead process's
    # memory gets it (sim_charge sweeps when the device looks full).
    big = decoder_bytes(8192, 8192, 32, 4)
    victim = _started(cudrive, gpu.env())
    free = victim.ok("meminfo")["free"]
    victim.ok(f"alloc {free - big - SIM_CONTEXT} filler")
    victim.ok("decoder d 8192 8192 32 4")
    victim.kill9()
    p = _started(cudrive, gpu.env())
    p.ok("decoder d 8192 8192 32 4")
    assert gpu.used(0) == SIM_CONTEXT + big


# ---- many processes at once ------------------------------------------------------------------------


def test_concurrent_processes_balance_to_zero(cudrive, gpu):
    procs = [_started(cudrive, gpu.env()) for _ in range(4)]
    script = " ".join(f"decoder x{i} 1280 720 {4 + i % 5} {1 + i % 3} decode x{i} 3 mapframe x{i} 0"
                      for i in range(40))
    script += " " + " ".join(f"undecoder x{i}" for i in range(40))
    for p in procs:
        p.send(script)
    for p in procs:
        recs = p.until("undecoder") + [p.read() for _ in range(39)]
        assert all(r["rc"] == CUDA_SUCCESS for r in recs), [r for r in recs if r["rc"]]
    st = gpu.status()
    assert st["devices"][0]["used"] == 4 * SIM_CONTEXT
    assert st["devices"][0]["decoders"] == 0
    assert st["devices"][0]["frames_decoded"] == 4 * 40 * 3
    assert st["devices"][0]["frames_mapped"] == 4 * 40
    assert gpu.peak(0) <= 4 * SIM_CONTEXT + 4 * sum(
        decoder_bytes(1280, 720, 4 + i % 5, 1 + i % 3) for i in range(40))


# ---- cudrive usage ----------------------------------------------------------------------------------


def test_cudrive_decoder_usage_errors(cudrive, gpu):
    res = cudrive.run("stdin", gpu.env(), input="init ctx 0\n"
                      "decoder d 1920 1080\n"
                      "decoder d 1920 1080 8 codec=nope\n"
                      "decoder d 1920 1080 8 2 3 4 5\n"
                      "decoder d 1920 1080 8\n"
                      "decoder d 1920 1080 8\n"
                      "undecoder nothing\n"
                      "unmapframe d\n"
                      "cuvidcaps h264 420 seven\n")
    errs = [(r["op"], r["err"]) for r in res.records if r["rc"] == -1]
    assert errs == [("decoder", "CUDRIVE_USAGE"), ("decoder", "CUDRIVE_USAGE"), ("decoder", "CUDRIVE_USAGE"),
                    ("decoder", "CUDRIVE_NAME_IN_USE"), ("undecoder", "CUDRIVE_NO_SUCH_NAME"),
                    ("unmapframe", "CUDRIVE_NOT_MAPPED"), ("cuvidcaps", "CUDRIVE_USAGE")], res.describe()
    # free works on decoders too; freeall leaves them.
    res = cudrive.run("init ctx 0 decoder d 640 480 4 alloc 1m freeall list free d list", gpu.env())
    assert res.one("freeall")["freed"] == 1
    assert [r["count"] for r in res.ops("list")] == [1, 0]
    assert res.one("free")["rc"] == CUDA_SUCCESS and res.one("free")["kind"] == "decoder"


def test_cudrive_without_libnvcuvid(cudrive, gpu, tmp_path):
    # Only libcuda and NVML on the path: decoder commands say what is missing.
    lib = tmp_path / "nocuvid"
    lib.mkdir()
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        (lib / name).symlink_to(gpu.build.sim_dir / name)
    res = cudrive.run("init ctx 0 decoder d 640 480 4 cuvidcaps h264 420 8 alloc 1m", gpu.env(LD_LIBRARY_PATH=lib))
    assert res.one("decoder")["rc"] == 500 and "libnvcuvid.so.1" in res.one("decoder")["detail"]
    assert res.one("cuvidcaps")["rc"] == 500
    assert res.one("alloc")["rc"] == CUDA_SUCCESS
