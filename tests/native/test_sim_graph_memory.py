"""The simulated GPU's stream capture rules, graph memory and the memory a
driver takes by itself, without the preload library (but where a test says so).

An interactive cudrive is the program under test: it captures on its own
stream (``capture begin MODE``), where ``async`` / ``free`` / ``freeasync``
become graph allocation and free nodes, and makes capture-unsafe calls from
its main thread or from a worker thread (``worker T ... endworker``).
hami-simctl and NVML, asked from other processes, are the independent
witnesses of what each device and process holds.
"""

import json
import subprocess
import sys

import pytest

from native_helpers import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    DEFAULT_TIMEOUT,
    MiB,
    SIM_CONTEXT,
    allocation_footprint,
    SIM_MEMORY,
    SimGpu,
    check_sanitizers,
)

CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_NOT_SUPPORTED = 801
UNSUPPORTED = 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
INVALIDATED = 901  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
WRONG_THREAD = 908  # CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD

NONE, ACTIVE, INVALID = 0, 1, 2  # CUstreamCaptureStatus

ZERO_GRAPH_MEM = {"used": 0, "used_high": 0, "reserved": 0, "reserved_high": 0}


@pytest.fixture
def gpu(hami_build, tmp_path):
    """Kernels' code takes no device memory here: these tests count graph memory to the byte."""
    return SimGpu(hami_build, tmp_path / "sim-state", HAMI_SIM_MODULE_BYTES=0)


def _target(cudrive, gpu, *lines, env=None):
    """An interactive CUDA process with a context on device 0 that ran LINES."""
    return cudrive.with_context(env or gpu.env(), *lines)


def _proc(gpu, pid):
    for proc in gpu.status()["processes"]:
        if proc["pid"] == pid and proc["alive"]:
            return proc
    return None


def _nvml(cudrive, gpu, index=0, version=3, graphics=False):
    """{pid: used} of NVML's compute (or graphics) processes of device INDEX."""
    op = "nvmlgraphics" if graphics else "nvmlprocs"
    res = cudrive.run(["nvml", op, index, version], gpu.env())
    rec = res.one(op)
    assert rec["rc"] == 0 and rec["version"] == version, res.describe()
    return {e["pid"]: e["used"] for e in rec["processes"]}


def _graph_mem(p, dev=0):
    rec = p.ok(f"graphmem {dev}")
    return {k: rec[k] for k in ZERO_GRAPH_MEM}


def _graph_mem_is(p, used, reserved, used_high=None, reserved_high=None, dev=0):
    got = _graph_mem(p, dev)
    want = {"used": used, "reserved": reserved,
            "used_high": used if used_high is None else used_high,
            "reserved_high": reserved if reserved_high is None else reserved_high}
    assert got == want, got


def _holds(cudrive, gpu, p, held, dev=0):
    """P holds HELD bytes on DEV in the sim's books, in NVML and on the device
    (P being the only process there)."""
    assert _proc(gpu, p.pid)["used"][dev] == held
    assert _nvml(cudrive, gpu, dev).get(p.pid) == held
    assert gpu.used(dev) == held


def _worker(p, name, *lines):
    """Run LINES on P's worker thread NAME: their records, the worker's last."""
    p.send(f"worker {name} " + " ".join(lines) + " endworker")
    out = p.until("worker")
    assert out[-1]["rc"] == 0, out
    return out


# ---- graph memory nodes -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_graph_memory_is_taken_at_launch_kept_for_relaunches_and_trimmed(cudrive, gpu, mode):
    p = _target(cudrive, gpu)
    p.ok(f"capture begin {mode}")
    for line in ("async 64m A", "async 32m B", "launch 1000", "free A", "async 16m C", "free B", "free C"):
        rec = p.ok(line)
        assert rec.get("stream", "capture") == "capture", rec
    assert p.ok("capture end G")["kernels"] == 1
    # Captured allocations take nothing: not at capture, not at instantiation.
    for step in ("captured", "instantiated"):
        assert _graph_mem(p) == ZERO_GRAPH_MEM, step
        _holds(cudrive, gpu, p, SIM_CONTEXT)
        assert _proc(gpu, p.pid)["graph"] == [0, 0]
        p.ok("graph G")
    # The first launch maps what one run needs: A and B live at once.
    need = 96 * MiB
    p.ok("graphlaunch G")
    _graph_mem_is(p, need, need)
    _holds(cudrive, gpu, p, SIM_CONTEXT + need)
    assert _proc(gpu, p.pid)["graph"] == [need, 0]
    # Relaunches reuse it.
    p.ok("graphlaunch G 3")
    p.ok("sync")
    _graph_mem_is(p, need, need)
    _holds(cudrive, gpu, p, SIM_CONTEXT + need)
    assert gpu.peak(0) == SIM_CONTEXT + need
    # Trimming an executable that is not running gives it all back.
    p.ok("graphtrim 0")
    _graph_mem_is(p, 0, 0, need, need)
    _holds(cudrive, gpu, p, SIM_CONTEXT)
    assert _proc(gpu, p.pid)["graph"] == [0, 0]
    # The next launch maps it again; destroying the executable leaves it
    # reserved (no longer used) until a trim.
    p.ok("graphlaunch G")
    _graph_mem_is(p, need, need)
    p.ok("ungraph G")
    _graph_mem_is(p, 0, need, need, need)
    _holds(cudrive, gpu, p, SIM_CONTEXT + need)
    p.ok("graphmemreset 0")
    _graph_mem_is(p, 0, need, 0, need)
    p.ok("graphtrim 0")
    _graph_mem_is(p, 0, 0, 0, need)
    _holds(cudrive, gpu, p, SIM_CONTEXT)


def test_a_trim_keeps_the_memory_of_a_graph_still_running(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 40m A", "launch 1500000000", "free A", "capture end G",
                "graph G", "graphlaunch G")
    p.ok("graphtrim 0")  # its kernel runs for 1.5 s yet
    _graph_mem_is(p, 40 * MiB, 40 * MiB)
    p.ok("sync")
    p.ok("graphtrim 0")
    _graph_mem_is(p, 0, 0, 40 * MiB, 40 * MiB)
    assert gpu.used(0) == SIM_CONTEXT


def test_an_upload_maps_the_memory_before_the_launch(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 20m A", "free A", "capture end G", "graph G")
    p.ok("graphupload G")
    _graph_mem_is(p, 20 * MiB, 20 * MiB)
    _holds(cudrive, gpu, p, SIM_CONTEXT + 20 * MiB)
    p.ok("graphlaunch G 2")
    _graph_mem_is(p, 20 * MiB, 20 * MiB)
    _holds(cudrive, gpu, p, SIM_CONTEXT + 20 * MiB)


def test_an_allocation_not_freed_in_the_graph_outlives_the_launch(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin")
    keep = p.ok("async 8m keep")["ptr"]
    p.ok("async 4m tmp")
    p.ok("free tmp")
    p.ok("capture end G")
    p.ok("graph G")
    p.ok("graphlaunch G")
    _graph_mem_is(p, 12 * MiB, 12 * MiB)  # keep and tmp were live at once
    _holds(cudrive, gpu, p, SIM_CONTEXT + 12 * MiB)
    # It is memory like any other: it holds bytes.
    p.ok("write keep 0x5a")
    assert p.ok("check keep 0x5a")["equal"]
    # The graph cannot run again while it is live.
    assert p.cmd("graphlaunch G")["rc"] == CUDA_ERROR_INVALID_VALUE
    p.ok("free keep")  # cuMemFreeAsync: back to the graph's memory
    _graph_mem_is(p, 12 * MiB, 12 * MiB)
    p.ok("graphlaunch G")
    _holds(cudrive, gpu, p, SIM_CONTEXT + 12 * MiB)
    # A trim keeps what it uses; destroying the executable too.
    p.ok("graphtrim 0")
    _graph_mem_is(p, 8 * MiB, 8 * MiB, 12 * MiB, 12 * MiB)
    p.ok("ungraph G")
    p.ok("graphtrim 0")
    _graph_mem_is(p, 8 * MiB, 8 * MiB, 12 * MiB, 12 * MiB)
    _holds(cudrive, gpu, p, SIM_CONTEXT + 8 * MiB)
    p.ok(f"freeraw {keep}")  # cuMemFree works on it too
    _graph_mem_is(p, 0, 8 * MiB, 12 * MiB, 12 * MiB)
    p.ok("graphtrim 0")
    _holds(cudrive, gpu, p, SIM_CONTEXT)


def test_auto_free_on_launch_frees_the_last_runs_allocations(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 8m keep", "capture end G", "graph G autofree")
    for _ in range(3):
        p.ok("graphlaunch G")
        _graph_mem_is(p, 8 * MiB, 8 * MiB)
        _holds(cudrive, gpu, p, SIM_CONTEXT + 8 * MiB)
    # One allocation is live, not three: a trim after the executable is gone
    # keeps exactly its bytes.
    p.ok("ungraph G")
    p.ok("graphtrim 0")
    _graph_mem_is(p, 8 * MiB, 8 * MiB)
    _holds(cudrive, gpu, p, SIM_CONTEXT + 8 * MiB)
    p.ok("free keep")
    p.ok("graphtrim 0")
    _graph_mem_is(p, 0, 0, 8 * MiB, 8 * MiB)


def test_a_free_node_frees_memory_allocated_before_the_capture_when_the_graph_runs(cudrive, gpu):
    p = _target(cudrive, gpu, "alloc 16m X", "async 6m Y")
    held = SIM_CONTEXT + 16 * MiB + 6 * MiB
    p.ok("capture begin")
    assert p.ok("freeasync X")["stream"] == "capture"
    assert p.ok("free Y")["stream"] == "capture"
    p.ok("capture end G")
    p.ok("graph G")
    _holds(cudrive, gpu, p, held)  # nothing is freed before the graph runs
    p.ok("graphlaunch G")
    _graph_mem_is(p, 0, 0)
    p.ok("sync")  # the default pool keeps Y's bytes until a synchronize
    _holds(cudrive, gpu, p, SIM_CONTEXT)
    # X is gone: the graph cannot free it again.
    assert p.cmd("graphlaunch G")["rc"] == CUDA_ERROR_INVALID_VALUE


def test_a_launch_needing_more_than_the_device_has_fails(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 128m A", "free A", "capture end G", "graph G")
    hog = _target(cudrive, gpu, f"alloc {SIM_MEMORY - 2 * SIM_CONTEXT - 64 * MiB} H")
    full = SIM_MEMORY - 64 * MiB
    assert gpu.used(0) == full
    for line in ("graphlaunch G", "graphupload G"):
        assert p.cmd(line)["rc"] == CUDA_ERROR_OUT_OF_MEMORY, line
        assert _graph_mem(p) == ZERO_GRAPH_MEM
        assert gpu.used(0) == full and gpu.peak(0) == full
    hog.ok("free H")
    p.ok("graphlaunch G")
    _graph_mem_is(p, 128 * MiB, 128 * MiB)
    assert gpu.used(0) == 2 * SIM_CONTEXT + 128 * MiB


# ---- capture-unsafe calls ---------------------------------------------------------------

UNSAFE = ["alloc 1m", "pitch 1000 10 4", "managed 1m", "free X", "sync", "meminfo", "poolattr default"]


@pytest.mark.parametrize("line", UNSAFE)
def test_an_unsafe_call_during_a_global_capture_fails_and_invalidates_it(cudrive, gpu, line):
    p = _target(cudrive, gpu, "alloc 1m X", "capture begin")
    before = gpu.used(0)
    assert p.cmd(line)["rc"] == UNSUPPORTED
    assert gpu.used(0) == before  # it did nothing
    assert p.ok("capture status")["status"] == INVALID
    # Later work into the capture, and its end, fail.
    assert p.cmd("launch 1000")["rc"] == INVALIDATED
    assert p.cmd("async 1m")["rc"] == INVALIDATED
    assert p.cmd("capture end")["rc"] == INVALIDATED
    assert p.ok("capture status")["status"] == NONE
    assert p.ok("check X 0")["equal"]  # X was not freed by the refused call
    p.ok(line)  # no capture: fine again


def test_safe_calls_leave_a_global_capture_alone(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 2m A")
    for line in ("capture status", "capture info", "ctx 0", "uuid 0", "count", "totalmem 0", "graphmem 0",
                 "module", "nvml", "nvmlmem 0"):
        p.ok(line)
    rec = p.ok("capture info")
    assert rec["status"] == ACTIVE and rec["id"] > 0 and rec["graph"] != "0x0", rec
    assert p.ok("capture status")["status"] == ACTIVE
    p.ok("capture end G")


# (capture mode, who makes the unsafe call, its interaction mode, capture invalidated)
MODE_RULES = [
    ("global", "main", "global", True),
    ("global", "main", "thread", True),  # its own capture
    ("global", "main", "relaxed", False),
    ("global", "worker", "global", True),  # a global capture anywhere
    ("global", "worker", "thread", False),
    ("global", "worker", "relaxed", False),
    ("thread", "main", "global", True),
    ("thread", "main", "thread", True),
    ("thread", "main", "relaxed", False),
    ("thread", "worker", "global", False),  # only its own thread counts
    ("thread", "worker", "thread", False),
    ("relaxed", "main", "global", False),
    ("relaxed", "main", "thread", False),
    ("relaxed", "worker", "global", False),
]


@pytest.mark.parametrize("capture_mode, caller, caller_mode, invalidated", MODE_RULES)
def test_which_captures_an_unsafe_call_invalidates(cudrive, gpu, capture_mode, caller, caller_mode, invalidated):
    p = _target(cudrive, gpu, f"capture begin {capture_mode}", "async 2m A")
    lines = (f"capturemode {caller_mode}", "alloc 1m B", "capturemode global")
    if caller == "main":
        recs = [p.cmd(line) for line in lines]
    else:
        recs = _worker(p, "T", *lines)[:-1]
    assert [r["op"] for r in recs] == ["capturemode", "alloc", "capturemode"]
    assert recs[1]["rc"] == (UNSUPPORTED if invalidated else CUDA_SUCCESS), recs
    assert p.ok("capture status")["status"] == (INVALID if invalidated else ACTIVE)
    rec = p.cmd("capture end G")
    assert rec["rc"] == (INVALIDATED if invalidated else CUDA_SUCCESS), rec


def test_the_interaction_mode_is_per_thread_and_global_by_default(cudrive, gpu):
    p = _target(cudrive, gpu)
    assert p.ok("capturemode relaxed")["previous"] == "global"
    recs = _worker(p, "T", "capturemode thread", "capturemode thread")
    assert [r.get("previous") for r in recs[:2]] == ["global", "thread"]
    assert p.ok("capturemode global")["previous"] == "relaxed"


@pytest.mark.parametrize("mode, rc", [("global", WRONG_THREAD), ("thread", WRONG_THREAD), ("relaxed", CUDA_SUCCESS)])
def test_a_capture_ends_on_the_thread_that_began_it_unless_relaxed(cudrive, gpu, mode, rc):
    p = _target(cudrive, gpu, f"capture begin {mode}", "async 2m A")
    recs = _worker(p, "T", "capture end G")
    assert recs[0]["rc"] == rc, recs
    if rc == WRONG_THREAD:
        assert p.ok("capture status")["status"] == ACTIVE  # it goes on
        p.ok("capture end G")
    p.ok("graph G")
    p.ok("graphlaunch G")
    _graph_mem_is(p, 2 * MiB, 2 * MiB)


# ---- driver-internal bytes --------------------------------------------------------------


def test_driver_internal_bytes_count_on_the_device_and_in_nvml(cudrive, gpu):
    p = _target(cudrive, gpu)
    p.ok("internal 0 256m")
    _holds(cudrive, gpu, p, SIM_CONTEXT + 256 * MiB)
    assert _proc(gpu, p.pid)["internal"] == [256 * MiB, 0]
    p.ok("internal 0 64m")  # exactly that much now
    _holds(cudrive, gpu, p, SIM_CONTEXT + 64 * MiB)
    # Beyond the device's total: refused, nothing changes.
    assert p.cmd(f"internal 0 {SIM_MEMORY}")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    _holds(cudrive, gpu, p, SIM_CONTEXT + 64 * MiB)
    assert _proc(gpu, p.pid)["internal"] == [64 * MiB, 0]
    # Up to the total: then nothing else fits.
    p.ok(f"internal 0 {SIM_MEMORY - SIM_CONTEXT}")
    assert gpu.used(0) == SIM_MEMORY
    assert p.cmd("alloc 1m")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    p.ok("internal 0 0")
    _holds(cudrive, gpu, p, SIM_CONTEXT)
    assert _proc(gpu, p.pid)["internal"] == [0, 0]
    # A device the process has no context on lists it too.
    p.ok("internal 1 32m")
    _holds(cudrive, gpu, p, 32 * MiB, dev=1)
    assert p.cmd("internal 2 1m")["rc"] == CUDA_ERROR_INVALID_DEVICE


def test_driver_internal_bytes_follow_cuda_visible_devices_and_need_init(cudrive, gpu):
    res = cudrive.run("internal 0 1m", gpu.env())
    assert res.one("internal")["rc"] == CUDA_ERROR_NOT_INITIALIZED
    p = cudrive.start(gpu.env(CUDA_VISIBLE_DEVICES="1"))
    p.ok("init")
    p.ok("internal 0 8m")
    assert [d["used"] for d in gpu.status()["devices"]] == [0, 8 * MiB]


# ---- NVML's processes -------------------------------------------------------------------


def _footprint(p, preload=False):
    """Give P memory of every kind on device 0; the bytes it then holds there
    (PRELOAD: under the library, whose fast park rounds a plain allocation)."""
    p.ok("alloc 3m plain")
    p.ok("async 3m pooled")  # the default pool reserves 4 MiB (2 MiB steps)
    p.ok("array 1024 1024 u8 1 arr")  # 1 MiB
    p.ok("capture begin relaxed")
    p.ok("async 10m G1")
    assert p.ok("poolalloc default 3m G2")["stream"] == "capture"  # cuMemAllocFromPoolAsync
    p.ok("capture end G")
    p.ok("graph G")
    p.ok("graphlaunch G")  # 10 + 4 MiB of graph memory, left allocated
    p.ok("internal 0 5m")
    return SIM_CONTEXT + allocation_footprint(3 * MiB, preload) + 4 * MiB + 1 * MiB + 14 * MiB + 5 * MiB


@pytest.mark.parametrize("version", [1, 2, 3])
def test_nvml_lists_every_byte_a_process_holds(cudrive, gpu, version):
    p = _target(cudrive, gpu)
    held = _footprint(p)
    other = _target(cudrive, gpu, "alloc 2m")
    assert _proc(gpu, p.pid)["used"][0] == held
    assert _nvml(cudrive, gpu, 0, version) == {p.pid: held, other.pid: SIM_CONTEXT + 2 * MiB}
    assert gpu.used(0) == held + SIM_CONTEXT + 2 * MiB


def test_nvml_lists_a_process_under_the_preload_library_with_its_real_bytes(cudrive, gpu, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    p = _target(cudrive, gpu, env=s.env)
    held = _footprint(p, preload=True)
    assert _nvml(cudrive, gpu, 0) == {p.pid: held}
    assert _proc(gpu, p.pid)["used"][0] == held == gpu.used(0)


def test_a_graphics_process_is_listed_as_one(cudrive, gpu):
    g = _target(cudrive, gpu, "alloc 8m", "graphics")
    c = _target(cudrive, gpu, "alloc 4m")
    assert _proc(gpu, g.pid)["graphics"] and not _proc(gpu, c.pid)["graphics"]
    for version in (1, 2, 3):
        assert _nvml(cudrive, gpu, 0, version, graphics=True) == {g.pid: SIM_CONTEXT + 8 * MiB}
        assert _nvml(cudrive, gpu, 0, version) == {c.pid: SIM_CONTEXT + 4 * MiB}
    assert _nvml(cudrive, gpu, 1, graphics=True) == {}
    g.ok("graphics 0")
    assert _nvml(cudrive, gpu, 0, graphics=True) == {}
    assert _nvml(cudrive, gpu, 0) == {g.pid: SIM_CONTEXT + 8 * MiB, c.pid: SIM_CONTEXT + 4 * MiB}


# ---- death and checkpoints ---------------------------------------------------------------


def test_a_dead_process_gives_back_its_graph_and_internal_memory(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 256m A", "async 64m B", "free B", "capture end G",
                "graph G", "graphlaunch G", "internal 0 128m", "internal 1 64m")
    assert [d["used"] for d in gpu.status()["devices"]] == [SIM_CONTEXT + 320 * MiB + 128 * MiB, 64 * MiB]
    p.kill9()
    status = gpu.status()
    assert all(proc["pid"] != p.pid for proc in status["processes"]), status
    assert [d["used"] for d in status["devices"]] == [0, 0]
    other = _target(cudrive, gpu, f"alloc {SIM_MEMORY - SIM_CONTEXT} all")
    assert gpu.used(0) == SIM_MEMORY
    other.ok("free all")


def _ckpt(cudrive, gpu, step, pid):
    res = cudrive.run(["init", "ckpt", step, pid], gpu.env())
    assert res.one("ckpt")["rc"] == CUDA_SUCCESS, res.describe()


def test_a_checkpoint_moves_graph_and_internal_memory_off_the_device_and_back(cudrive, gpu):
    p = _target(cudrive, gpu, "capture begin", "async 32m A", "capture end G", "graph G", "graphlaunch G",
                "internal 0 16m", "write A 0x3c")
    held = SIM_CONTEXT + 32 * MiB + 16 * MiB
    _holds(cudrive, gpu, p, held)
    _ckpt(cudrive, gpu, "lock", p.pid)
    _ckpt(cudrive, gpu, "checkpoint", p.pid)
    proc = _proc(gpu, p.pid)
    assert proc["used"] == [0, 0] and proc["parked"] == [held, 0], proc
    assert proc["graph"] == [32 * MiB, 0] and proc["internal"] == [16 * MiB, 0], proc
    assert _nvml(cudrive, gpu).get(p.pid) == 0 and gpu.used(0) == 0
    _ckpt(cudrive, gpu, "restore", p.pid)
    _ckpt(cudrive, gpu, "unlock", p.pid)
    _holds(cudrive, gpu, p, held)
    assert p.ok("check A 0x3c")["equal"]
    _graph_mem_is(p, 32 * MiB, 32 * MiB)


# ---- entry points -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base, version, flags, sym",
    [
        ("cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"),
        ("cuStreamGetCaptureInfo", 10010, 2, "cuStreamGetCaptureInfo_ptsz"),
        ("cuStreamGetCaptureInfo", 11030, 0, "cuStreamGetCaptureInfo_v2"),
        ("cuStreamGetCaptureInfo", 12000, 2, "cuStreamGetCaptureInfo_v2_ptsz"),
        ("cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3"),
        ("cuStreamGetCaptureInfo", 13000, 2, "cuStreamGetCaptureInfo_v3_ptsz"),
        ("cuThreadExchangeStreamCaptureMode", 10010, 0, "cuThreadExchangeStreamCaptureMode"),
        ("cuGraphUpload", 11010, 0, "cuGraphUpload"),
        ("cuGraphUpload", 12000, 2, "cuGraphUpload_ptsz"),
        ("cuDeviceGetGraphMemAttribute", 11040, 0, "cuDeviceGetGraphMemAttribute"),
        ("cuDeviceSetGraphMemAttribute", 11040, 0, "cuDeviceSetGraphMemAttribute"),
        ("cuDeviceGraphMemTrim", 11040, 0, "cuDeviceGraphMemTrim"),
    ],
)
def test_the_new_entry_points_resolve_through_cuGetProcAddress(cudrive, gpu, base, version, flags, sym):
    rec = cudrive.run(f"getproc {base} {version} {flags}", gpu.env()).one("getproc")
    assert (rec["rc"], rec["status"], rec.get("sym")) == (CUDA_SUCCESS, 0, sym), rec


@pytest.mark.parametrize("base, version", [("cuStreamGetCaptureInfo", 10000), ("cuGraphUpload", 11000),
                                           ("cuDeviceGraphMemTrim", 11030),
                                           ("cuThreadExchangeStreamCaptureMode", 10000)])
def test_the_new_entry_points_are_too_new_for_older_versions(cudrive, gpu, base, version):
    rec = cudrive.run(f"getproc {base} {version} 0", gpu.env()).one("getproc")
    assert rec["status"] == 2 and rec["rc"] != CUDA_SUCCESS, rec  # VERSION_NOT_SUFFICIENT


def test_the_knobs_are_no_driver_api(cudrive, gpu):
    res = cudrive.run("getproc hamiSimDriverInternal 13000 0 dlsym hamiSimDriverInternal "
                      "dlsym hamiSimGraphicsProcess", gpu.env())
    assert res.one("getproc")["status"] == 1  # SYMBOL_NOT_FOUND
    assert all(r["rc"] == CUDA_SUCCESS for r in res.ops("dlsym")), res.describe()


# ---- the driver API's edges, called directly ------------------------------------------------

DRIVER_EDGES = r"""
import ctypes, json
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    assert rc == 0, (what, rc)
ok(cu.cuInit(0), "init")
ctx = c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(byref(ctx), 0), "retain")
ok(cu.cuCtxSetCurrent(ctx), "set")
s = c_void_p()
ok(cu.cuStreamCreate(byref(s), 1), "stream")
st = c_int(-1)
def status():
    ok(cu.cuStreamIsCapturing(s, byref(st)), "is capturing")
    return st.value
def end():
    g = c_void_p()
    return cu.cuStreamEndCapture(s, byref(g)), g
out = {}
mode = c_int(3)
out["bad_mode"] = cu.cuThreadExchangeStreamCaptureMode(byref(mode))
out["null_mode"] = cu.cuThreadExchangeStreamCaptureMode(None)
mode = c_int(1)
ok(cu.cuThreadExchangeStreamCaptureMode(byref(mode)), "exchange")
out["previous"] = mode.value
ok(cu.cuThreadExchangeStreamCaptureMode(byref(mode)), "exchange back")
cid = c_uint64(77)
out["info_idle"] = [cu.cuStreamGetCaptureInfo(s, byref(st), byref(cid)), st.value, cid.value]
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
out["info_v1"] = [cu.cuStreamGetCaptureInfo(s, byref(st), byref(cid)), st.value, cid.value > 0]
g = c_void_p()
deps = c_void_p(1)
n = c_size_t(5)
out["info_v2"] = [cu.cuStreamGetCaptureInfo_v2(s, byref(st), byref(cid), byref(g), byref(deps), byref(n)),
                  st.value, g.value is not None, deps.value, n.value]
edges = c_void_p(1)
out["info_v3"] = [cu.cuStreamGetCaptureInfo_v3(s, byref(st), None, None, byref(deps), byref(edges), byref(n)),
                  st.value, edges.value, n.value]
out["info_v3_edges_without_deps"] = cu.cuStreamGetCaptureInfo_v3(s, byref(st), None, None, None, byref(edges),
                                                                 byref(n))
out["destroy_capturing_graph"] = cu.cuGraphDestroy(g)
x = c_void_p()
out["instantiate_capturing_graph"] = cu.cuGraphInstantiateWithFlags(byref(x), g, c_uint64(0))
pool = c_void_p()
dev = c_int(-1)
cur = c_void_p()
v = c_uint64(0)
out["safe"] = [cu.cuDeviceGetMemPool(byref(pool), 0), cu.cuCtxGetCurrent(byref(cur)), cu.cuCtxGetDevice(byref(dev)),
               cu.cuDeviceGetGraphMemAttribute(0, 2, byref(v)), cu.cuDeviceGetDefaultMemPool(byref(pool), 0)]
out["status_after_safe"] = status()
# Copies into a graph allocation are accepted; out of its range they fail and invalidate.
p = c_uint64()
buf = ctypes.create_string_buffer(2 * 1024 * 1024)
ok(cu.cuMemAllocAsync(byref(p), c_size_t(1 << 20), s), "alloc node")
out["copy_in"] = cu.cuMemcpyHtoDAsync_v2(c_uint64(p.value), buf, c_size_t(1 << 20), s)
out["copy_status"] = status()
out["copy_over"] = cu.cuMemcpyHtoDAsync_v2(c_uint64(p.value + (1 << 20) - 1), buf, c_size_t(2), s)
out["copy_over_status"] = status()
out["end_after_copy_over"] = end()[0]
# A free node twice, and a free of an unknown address, fail and invalidate.
for what, addrs in (("free_twice", [0, 0]), ("free_unknown", [12345])):
    ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
    ok(cu.cuMemAllocAsync(byref(p), c_size_t(4096), s), "alloc node")
    rcs = [cu.cuMemFreeAsync(c_uint64(a or p.value), s) for a in addrs]
    out[what] = [rcs, status(), end()[0]]
# cuMemPoolSetAttribute is capture-unsafe (so is GetAttribute).
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
threshold = c_uint64(0)
out["pool_set"] = [cu.cuMemPoolSetAttribute(pool, 4, byref(threshold)), status(), end()[0]]
# A graph with memory nodes: one executable at a time; not into a capture.
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
ok(cu.cuMemAllocAsync(byref(p), c_size_t(4096), s), "alloc node")
ok(cu.cuMemFreeAsync(c_uint64(p.value), s), "free node")
rc, g = end()
ok(rc, "end")
x1 = c_void_p()
x2 = c_void_p()
ok(cu.cuGraphInstantiateWithFlags(byref(x1), g, c_uint64(0)), "instantiate")
out["second_exec"] = cu.cuGraphInstantiateWithFlags(byref(x2), g, c_uint64(0))
ok(cu.cuGraphExecDestroy(x1), "exec destroy")
ok(cu.cuGraphInstantiateWithFlags(byref(x2), g, c_uint64(0)), "instantiate again")
ok(cu.cuGraphDestroy(g), "graph destroy")
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
out["launch_into_capture"] = [cu.cuGraphLaunch(x2, s), status(), end()[0]]
ok(cu.cuGraphLaunch(x2, s), "launch after the graph was destroyed")
# Graph memory attributes and trim: their argument checks.
one = c_uint64(1)
zero = c_uint64(0)
out["attrs"] = [cu.cuDeviceGetGraphMemAttribute(0, 4, byref(v)), cu.cuDeviceGetGraphMemAttribute(0, 0, None),
                cu.cuDeviceGetGraphMemAttribute(7, 0, byref(v)), cu.cuDeviceSetGraphMemAttribute(0, 1, byref(one)),
                cu.cuDeviceSetGraphMemAttribute(0, 0, byref(zero)), cu.cuDeviceSetGraphMemAttribute(0, 3, byref(zero)),
                cu.cuDeviceGraphMemTrim(9), cu.cuDeviceGraphMemTrim(0)]
# A capturing stream destroyed: its capture is gone, unsafe calls are fine again.
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
ok(cu.cuStreamDestroy_v2(s), "stream destroy")
out["alloc_after_destroy"] = cu.cuMemAlloc_v2(byref(p), c_size_t(4096))
print(json.dumps(out))
"""


def test_driver_edges_of_capture_and_graph_memory(gpu):
    env = gpu.env()
    if gpu.build.sanitized:
        env["LD_PRELOAD"] = gpu.build.runtime  # the sim libraries are instrumented
    res = subprocess.run([sys.executable, "-c", DRIVER_EDGES], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=DEFAULT_TIMEOUT)
    check_sanitizers(res.stderr, "python on the sim")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-4000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {
        "bad_mode": CUDA_ERROR_INVALID_VALUE, "null_mode": CUDA_ERROR_INVALID_VALUE, "previous": 0,
        "info_idle": [0, NONE, 77],  # not capturing: only the status is written
        "info_v1": [0, ACTIVE, True],
        "info_v2": [0, ACTIVE, True, None, 0],
        "info_v3": [0, ACTIVE, None, 0],
        "info_v3_edges_without_deps": CUDA_ERROR_INVALID_VALUE,
        "destroy_capturing_graph": CUDA_ERROR_INVALID_VALUE,
        "instantiate_capturing_graph": CUDA_ERROR_INVALID_VALUE,
        "safe": [0, 0, 0, 0, 0], "status_after_safe": ACTIVE,
        "copy_in": 0, "copy_status": ACTIVE,
        "copy_over": CUDA_ERROR_INVALID_VALUE, "copy_over_status": INVALID, "end_after_copy_over": INVALIDATED,
        "free_twice": [[0, CUDA_ERROR_INVALID_VALUE], INVALID, INVALIDATED],
        "free_unknown": [[CUDA_ERROR_INVALID_VALUE], INVALID, INVALIDATED],
        "pool_set": [UNSUPPORTED, INVALID, INVALIDATED],
        "second_exec": CUDA_ERROR_INVALID_VALUE,
        "launch_into_capture": [CUDA_ERROR_NOT_SUPPORTED, INVALID, INVALIDATED],
        "attrs": [CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_DEVICE,
                  CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE, 0, CUDA_ERROR_INVALID_DEVICE, 0],
        "alloc_after_destroy": 0,
    }
