"""Video decoders are part of the slice: the cap, the memory charge, counters, reclaim.

Against the simulated libnvcuvid.so.1 (native/sim/sim_cuvid.c), reached the
way FFmpeg reaches the real one: dlopen + dlsym (cudrive's decoder commands).
"""

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, slice_device, slot_of, wait_for

CUDA_ERROR_INVALID_VALUE = 1
HD = "1920 1080 8"  # an H.264 decoder with 8 decode surfaces (2 output surfaces, NV12)


def surface(w, h, chroma=1.5, wide=1):
    """docs/nvdec.md: one surface of the estimate."""
    return int(-(-(w * wide) // 64) * 64 * (-(-h // 16) * 16) * chroma)


HD_BYTES = 8 * surface(1920, 1080) + 2 * surface(1920, 1080)


def started(cudrive, env):
    p = cudrive.start(env)
    p.ok("init")
    p.ok("ctx 0")
    return p


def test_the_cap_on_decoders(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS=2)
    p = started(cudrive, s.env)
    assert [p.cmd(f"decoder {n} {HD}")["rc"] for n in "abc"] == [0, 0, CUDA_ERROR_OUT_OF_MEMORY]
    assert "may run 2 video decoder(s) at once" in p.stderr()
    assert slice_device(s.snapshot(), s.gpu.uuid(0)).decoders == 2
    p.ok("undecoder a")
    p.ok(f"decoder c {HD}")  # a place came back


def test_processes_of_a_slice_share_the_cap(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS=3)
    first, second = started(cudrive, s.env), started(cudrive, s.env)
    first.ok(f"decoder a {HD}")
    first.ok(f"decoder b {HD}")
    second.ok(f"decoder c {HD}")
    assert second.cmd(f"decoder d {HD}")["rc"] == CUDA_ERROR_OUT_OF_MEMORY


def test_surfaces_are_charged_and_credited(cudrive, make_slice, gpu):
    s = make_slice(limit="4g", overhead="0")
    p = started(cudrive, s.env)
    before = gpu.used(0)
    p.ok(f"decoder a {HD}")
    assert s.used(0) == HD_BYTES
    assert s.slot_used(p.pid, 0) == HD_BYTES
    assert gpu.used(0) > before  # the simulated driver allocated the surfaces too
    p.ok("undecoder a")
    assert s.used(0) == 0 and gpu.used(0) == before


def test_ten_bit_and_reconfigurable_decoders_are_charged_at_their_largest(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0")
    p = started(cudrive, s.env)
    p.ok("decoder a 1280 720 4 2 3840 2160 bitdepth=10")
    # decode surfaces at the 4K maximum, 16 bits a sample; output P016 at the coded size
    assert s.used(0) == 4 * surface(3840, 2160, wide=2) + 2 * surface(1280, 720, wide=2)


def test_the_memory_cap_refuses_a_decoder(cudrive, make_slice):
    s = make_slice(limit="20m", overhead="0", HAMI_MAX_DECODERS=1)
    p = started(cudrive, s.env)
    assert p.cmd(f"decoder a {HD}")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert "cuvidCreateDecoder" in p.stderr()
    assert slice_device(s.snapshot(), s.gpu.uuid(0)).decoders == 0  # its place under the cap is back
    p.ok("decoder b 320 240 2")


def test_reconfigure_grows_and_shrinks_the_charge(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0")
    p = started(cudrive, s.env)
    p.ok("decoder a 1920 1080 4 2 1920 1080")
    assert s.used(0) == 6 * surface(1920, 1080)
    p.ok("reconfigure a 1920 1080 12")
    assert s.used(0) == 14 * surface(1920, 1080)
    p.ok("reconfigure a 1280 720 4")
    assert s.used(0) == 4 * surface(1280, 720) + 2 * surface(1280, 720)
    p.ok("undecoder a")
    assert s.used(0) == 0


def test_counters_in_the_slot(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0")
    p = started(cudrive, s.env)
    p.ok(f"decoder a {HD}")
    p.ok("decode a 10")
    p.ok("mapframe a 0")
    p.ok("unmapframe a")
    p.ok("mapframe32 a 1")
    p.ok("unmapframe32 a")
    slot = slot_of(s.snapshot(), p.pid)
    assert (slot.frames_decoded, slot.frames_mapped) == (10, 2)
    assert slot.decode_ns > 0
    assert slot.decoders == {0: 1, 1: 0}  # by slice device index (two simulated GPUs)


def test_a_killed_process_gives_its_decoders_back(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS=2)
    victim = started(cudrive, s.env)
    victim.ok(f"decoder a {HD}")
    victim.ok(f"decoder b {HD}")
    victim.kill9()
    other = started(cudrive, s.env)
    other.ok(f"decoder c {HD}")  # the cap refused, swept the dead slot, and tried again
    other.ok(f"decoder d {HD}")
    assert wait_for(lambda: s.used(0) == 2 * HD_BYTES, 1.0), s.used(0)
    assert slice_device(s.snapshot(), s.gpu.uuid(0)).decoders == 2


def test_unhooked_calls_pass_through(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0")
    p = started(cudrive, s.env)
    p.ok(f"decoder a {HD}")
    assert p.ok("decodestatus a 0")["status"] == 2
    p.ok("ctxlock")
    caps = p.ok("cuvidcaps h264 420 8")
    assert caps["supported"] == 1
    # Hooked names come from the preload library, the others from libnvcuvid itself.
    assert "libvgpu" in p.ok("cuviddlsym cuvidCreateDecoder")["lib"]
    assert "libnvcuvid" in p.ok("cuviddlsym cuvidGetDecodeStatus")["lib"]


def test_a_malformed_decoder_cap_fails_closed(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS="two")
    res = cudrive.run(f"init ctx 0 decoder a {HD}", s.env)
    assert res.one("init")["rc"] != 0, res.describe()
    assert 'HAMI_MAX_DECODERS="two" is not a decoder count' in res.stderr


def test_decoder_cap_changes_live(cudrive, make_slice):
    from hami_jupyter.slice.change import update_limits

    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS=1)
    p = started(cudrive, s.env)
    p.ok(f"decoder a {HD}")
    assert p.cmd(f"decoder b {HD}")["rc"] == CUDA_ERROR_OUT_OF_MEMORY

    def raise_cap(limits, _snapshot):
        limits.fallback.max_decoders = 2

    update_limits(s.path, raise_cap)
    p.ok(f"decoder b {HD}")


def test_status_shows_decoders_and_frames(cudrive, make_slice):
    from hami_jupyter.slice.status import format_text, slice_status

    s = make_slice(limit="4g", overhead="0", HAMI_MAX_DECODERS=2, HAMI_KERNEL_ID="k-video")
    p = started(cudrive, s.env)
    p.ok(f"decoder a {HD}")
    p.ok("decode a 5")
    p.ok("mapframe a 0")
    status = slice_status(s.path)
    gpu = next(g for g in status["gpus"] if g["uuid"] == s.gpu.uuid(0))
    assert (gpu["decoders"], gpu["max_decoders"]) == (1, 2)
    (kernel,) = status["kernels"]
    assert (kernel["decoders"], kernel["frames_decoded"]) == (1, 5)
    text = format_text(status)
    assert "NVDEC 1 of 2 video decoder(s) in use" in text
    assert "NVDEC 1 decoder(s), 5 frames (1 mapped," in text
