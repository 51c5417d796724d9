"""Two GPUs on the simulated GPU: each GPU's cap holds on its own, whatever
CUDA_VISIBLE_DEVICES says (index, UUID, reordered), and every view of the
slice (the process's CUDA and NVML, the slice file, slice_status and its text,
a live `hami-jupyter slice set --device`) names the right physical GPU.

test_memory_cap.py already covers one per-GPU limit over the general one, a
per-GPU limit alone, and CUDA_VISIBLE_DEVICES=1 / =<uuid of 1>; this file adds
what needs both GPUs at once. Every slice charges 64 MiB per context (the
sim's context), so the once-a-second true-up against NVML finds nothing to add.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from native_helpers import (
    CUDA_ERROR_OUT_OF_MEMORY,
    DEFAULT_TIMEOUT,
    GiB,
    MiB,
    SIM_CONTEXT,
    slice_device,
)

from hami_jupyter.slice.status import format_text, slice_status


def _fill(p, tag, most=64):
    """Allocate 256 MiB at a time on the current context until refused; the bytes taken."""
    size = 256 * MiB
    taken = 0
    for i in range(most):
        rec = p.cmd(f"alloc 256m {tag}{i}")
        if rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY:
            return taken
        assert rec["rc"] == 0, rec
        taken += size
    raise AssertionError(f"no cap met after {taken} bytes")


def test_each_gpu_holds_its_own_cap_at_once(cudrive, make_slice, gpu):
    """_0 and _1 differ, no general limit: one process fills both GPUs in
    turn, and each stops at its own cap; the sim's peak is the witness."""
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_0="1g",
                   CUDA_DEVICE_MEMORY_LIMIT_1="512m")
    p = cudrive.start(s.env)
    p.ok("init")
    assert [p.ok(f"totalmem {i}")["total"] for i in (0, 1)] == [GiB, 512 * MiB]
    p.ok("ctx 0")
    assert _fill(p, "g0_") == 768 * MiB  # 64 MiB context + 3 x 256 MiB <= 1 GiB
    p.ok("ctx 1")
    assert _fill(p, "g1_") == 256 * MiB  # 64 MiB context + 256 MiB <= 512 MiB
    # Back on GPU 0: exactly to its cap, although GPU 1 was filled in between.
    p.ok("ctx 0")
    p.ok("alloc 192m last")
    assert p.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert (s.used(0), s.used(1)) == (GiB, 320 * MiB)
    assert (gpu.peak(0), gpu.peak(1)) == (GiB, 320 * MiB)


def test_two_processes_on_two_gpus_share_nothing(cudrive, make_slice, gpu):
    """One slice, one process per GPU: filling GPU 1 leaves GPU 0's cap whole."""
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_0="768m",
                   CUDA_DEVICE_MEMORY_LIMIT_1="1g")
    a, b = cudrive.start(s.env), cudrive.start(s.env)
    for p, dev in ((a, 0), (b, 1)):
        p.ok("init")
        p.ok(f"ctx {dev}")
    assert _fill(b, "b") == 768 * MiB
    assert _fill(a, "a") == 512 * MiB
    assert (s.used(0), s.used(1)) == (576 * MiB, 832 * MiB)
    assert s.slot_used(a.pid, 1) == 0 and s.slot_used(b.pid, 0) == 0
    assert (gpu.peak(0), gpu.peak(1)) == (576 * MiB, 832 * MiB)


def _uuids(gpu):
    return [gpu.uuid(0), gpu.uuid(1)]


@pytest.mark.parametrize("form", ["index", "uuid", "uuid-prefix"])
def test_reordered_devices_cap_the_right_physical_gpu(cudrive, make_slice, gpu, form):
    """CUDA_VISIBLE_DEVICES=1,0 (or the UUIDs, or unique prefixes of them, in
    that order): CUDA's device 0 is physical GPU 1, so _0's cap lands there;
    the slice file, NVML (physical order) and slice_status say so by UUID."""
    extra = {}
    if form == "uuid-prefix":
        # UUIDs that differ early, so that "GPU-bb" names one GPU; the first
        # process creates the sim's state, and its configuration stays.
        u0, u1 = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000001"
        extra["HAMI_SIM_UUIDS"] = f"{u0},{u1}"
        cvd = "GPU-bb,GPU-aa"
    else:
        u0, u1 = _uuids(gpu)
        cvd = "1,0" if form == "index" else f"{u1},{u0}"
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_0="1g",
                   CUDA_DEVICE_MEMORY_LIMIT_1="512m", CUDA_VISIBLE_DEVICES=cvd, **extra)
    p = cudrive.start(s.env)
    p.ok("init")
    assert _uuids(gpu) == [u0, u1]
    assert p.ok("count")["count"] == 2
    assert [p.ok(f"uuid {i}")["uuid"] for i in (0, 1)] == [u1, u0]
    assert [p.ok(f"totalmem {i}")["total"] for i in (0, 1)] == [GiB, 512 * MiB]
    p.ok("ctx 0")
    p.ok("alloc 768m")
    assert p.cmd("alloc 512m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    p.ok("ctx 1")
    p.ok("alloc 256m")
    assert p.cmd("alloc 512m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    # The sim, by physical index: 768 MiB on GPU 1, 256 MiB on GPU 0.
    assert (gpu.used(0), gpu.used(1)) == (SIM_CONTEXT + 256 * MiB, SIM_CONTEXT + 768 * MiB)
    assert (s.used(0), s.used(1)) == (320 * MiB, 832 * MiB)
    snap = s.snapshot()
    assert slice_device(snap, u1).limit.memory_limit == GiB
    assert slice_device(snap, u0).limit.memory_limit == 512 * MiB

    # NVML ignores CUDA_VISIBLE_DEVICES (as the real one does): index 0 is
    # physical GPU 0, sized by the slice's cap for that GPU (CUDA's device 1).
    p.ok("nvml")
    assert p.ok("nvmlcount")["count"] == 2
    assert [p.ok(f"nvmluuid {i}")["uuid"] for i in (0, 1)] == [u0, u1]
    m0, m1 = p.ok("nvmlmem 0"), p.ok("nvmlmem 1")
    assert (m0["total"], m0["used"], m0["free"]) == (512 * MiB, 320 * MiB, 192 * MiB)
    assert (m1["total"], m1["used"], m1["free"]) == (GiB, 832 * MiB, 192 * MiB)

    status = slice_status(s.path)
    by_uuid = {g["uuid"]: g for g in status["gpus"]}
    assert set(by_uuid) == {u0, u1}
    assert (by_uuid[u1]["memory_used"], by_uuid[u1]["memory_limit"]) == (832 * MiB, GiB)
    assert (by_uuid[u0]["memory_used"], by_uuid[u0]["memory_limit"]) == (320 * MiB, 512 * MiB)
    text = format_text(status)
    for g in status["gpus"]:
        line = f"  GPU {g['index']} {g['uuid']}"
        assert line in text, text
        after = text.split(line, 1)[1].splitlines()[1]
        assert after.lstrip().startswith("memory"), text


def test_nvml_only_process_sees_the_caps_by_physical_gpu(cudrive, make_slice, gpu):
    """A process that only asks NVML (nvidia-smi, pynvml), before any CUDA
    process met the GPUs: CUDA_VISIBLE_DEVICES=1,0 maps _0 to physical 1."""
    u0, u1 = _uuids(gpu)
    s = make_slice(limit=None, overhead="0", CUDA_DEVICE_MEMORY_LIMIT_0="1g",
                   CUDA_DEVICE_MEMORY_LIMIT_1="512m", CUDA_VISIBLE_DEVICES="1,0")
    res = cudrive.run("nvml nvmluuid 0 nvmluuid 1 nvmlmem 0 nvmlmem 1", s.env)
    assert [r["uuid"] for r in res.ops("nvmluuid")] == [u0, u1], res.describe()
    assert [r["total"] for r in res.ops("nvmlmem")] == [512 * MiB, GiB], res.describe()


def _slice_set(gpu, path, *args):
    """`hami-jupyter slice set` as an administrator runs it (sim NVML visible)."""
    cmd = [str(Path(sys.executable).parent / "hami-jupyter"), "slice", "set", str(path), *args]
    res = subprocess.run(cmd, env=gpu.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=DEFAULT_TIMEOUT)
    assert res.returncode == 0, (cmd, res.stdout, res.stderr)
    return res.stdout


@pytest.mark.parametrize("name_by", ["uuid", "slice-index"])
def test_slice_set_device_changes_one_gpu_of_a_running_process(cudrive, make_slice, gpu, name_by):
    """A process reordered with CUDA_VISIBLE_DEVICES=1,0 holds memory on both
    GPUs; `slice set --device` on physical GPU 0 (its CUDA device 1) lowers
    that GPU's cap only, at once, and raises it again."""
    u0, u1 = _uuids(gpu)
    s = make_slice(limit="1g", overhead="64m", CUDA_VISIBLE_DEVICES="1,0")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 256m a")
    p.ok("ctx 1")
    p.ok("alloc 256m b")
    snap = s.snapshot()
    target = u0 if name_by == "uuid" else str(slice_device(snap, u0).index)
    out = _slice_set(gpu, s.path, "--device", target, "--memory", "512m")
    assert u0 in out, out
    assert slice_device(s.snapshot(), u0).limit.memory_limit == 512 * MiB
    assert slice_device(s.snapshot(), u1).limit.memory_limit == GiB
    # CUDA device 1 (physical 0) holds 64 + 256 MiB: 192 MiB more fits, then nothing.
    assert p.cmd("alloc 256m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    p.ok("alloc 192m c")
    assert p.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert p.ok("meminfo")["total"] == 512 * MiB
    # CUDA device 0 (physical 1) keeps the slice's 1 GiB.
    p.ok("ctx 0")
    assert p.ok("meminfo")["total"] == GiB
    p.ok("alloc 704m d")
    assert p.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    # Raised again: the running process follows on physical 0 only.
    _slice_set(gpu, s.path, "--device", target, "--memory", "2g")
    p.ok("ctx 1")
    p.ok("alloc 1g e")
    assert (s.used(0), s.used(1)) == (1536 * MiB, GiB)
    assert gpu.peak(1) == GiB
    assert gpu.used(0) == 1536 * MiB


# ---- SM shares, one per GPU ------------------------------------------------------

KERNEL_NS = 1_000_000  # 1 ms kernels, as in test_sm_share.py
SM_TOLERANCE = 0.05


def _burner(cudrive, env, dev):
    p = cudrive.start(env)
    p.ok("init")
    p.ok(f"ctx {dev}")
    return p


def _burn_together(procs, seconds):
    """Every process burns for *seconds* at once; their achieved shares."""
    for p in procs:
        p.send(f"burn launch {KERNEL_NS} {seconds}")
    shares = []
    for p in procs:
        rec = p.read(timeout=seconds + 30)
        assert rec["op"] == "burn" and rec["rc"] == 0 and rec["launches"] > 0, rec
        shares.append(rec["share"])
    return shares


@pytest.mark.share_accuracy
def test_one_slice_holds_a_different_sm_share_on_each_gpu(cudrive, make_slice, gpu):
    """One hard slice, SM share 30 % on GPU 0 and 70 % on GPU 1, one process
    burning on each GPU at the same time: each gets its own GPU's share."""
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_SM_LIMIT_0="30",
                   CUDA_DEVICE_SM_LIMIT_1="70", HAMI_SM_MODE="hard")
    procs = [_burner(cudrive, s.env, 0), _burner(cudrive, s.env, 1)]
    _burn_together(procs, 1)  # the controllers settle
    got0, got1 = _burn_together(procs, 4)
    assert abs(got0 - 0.30) <= SM_TOLERANCE and abs(got1 - 0.70) <= SM_TOLERANCE, (got0, got1)
    snap = s.snapshot()
    assert slice_device(snap, gpu.uuid(0)).limit.sm_share == 30
    assert slice_device(snap, gpu.uuid(1)).limit.sm_share == 70


@pytest.mark.share_accuracy
def test_reordered_sm_shares_land_on_the_right_physical_gpu(cudrive, make_slice, gpu):
    """CUDA_VISIBLE_DEVICES=1,0 with _0 = 30 % and _1 = 70 %: the process's
    device 0 is physical GPU 1, which the sim sees 30 % busy while the same
    process's device 1 (physical GPU 0) runs 70 % busy."""
    u0, u1 = _uuids(gpu)
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_SM_LIMIT_0="30",
                   CUDA_DEVICE_SM_LIMIT_1="70", HAMI_SM_MODE="hard", CUDA_VISIBLE_DEVICES="1,0")
    on_phys1, on_phys0 = _burner(cudrive, s.env, 0), _burner(cudrive, s.env, 1)
    _burn_together([on_phys1, on_phys0], 1)
    for p in (on_phys1, on_phys0):
        p.send(f"burn launch {KERNEL_NS} 4")
    time.sleep(2.5)
    # The sim's own measure, by physical device: busy share of the last second.
    busy = [d["utilization"] for d in gpu.status()["devices"]]
    shares = [p.read(timeout=40)["share"] for p in (on_phys1, on_phys0)]
    assert abs(shares[0] - 0.30) <= SM_TOLERANCE and abs(shares[1] - 0.70) <= SM_TOLERANCE, shares
    assert abs(busy[1] / 100 - 0.30) <= 2 * SM_TOLERANCE, busy
    assert abs(busy[0] / 100 - 0.70) <= 2 * SM_TOLERANCE, busy
    snap = s.snapshot()
    assert (slice_device(snap, u1).limit.sm_share, slice_device(snap, u0).limit.sm_share) == (30, 70)


@pytest.mark.share_accuracy
def test_live_sm_change_on_one_gpu_leaves_the_other(cudrive, make_slice, gpu):
    """`slice set --device <uuid of GPU 1> --sm 20` while both GPUs burn at
    50 %: GPU 1 follows, GPU 0 keeps its 50 %."""
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_SM_LIMIT="50", HAMI_SM_MODE="hard")
    procs = [_burner(cudrive, s.env, 0), _burner(cudrive, s.env, 1)]
    _burn_together(procs, 1)
    _slice_set(gpu, s.path, "--device", gpu.uuid(1), "--sm", "20")
    _burn_together(procs, 2)  # settled within 2 s
    got0, got1 = _burn_together(procs, 3)
    assert abs(got0 - 0.50) <= SM_TOLERANCE and abs(got1 - 0.20) <= SM_TOLERANCE, (got0, got1)
