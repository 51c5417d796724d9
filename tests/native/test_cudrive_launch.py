"""cudrive's kernel, event, capture and graph commands on the simulated GPU, no preload.

The SM-share limiter is measured with these: `burn` must report the share the
sim really gave, every launch path must take simulated time like
cuLaunchKernel, and the sim's NVML samples must look like the real driver's
(one per process per 200 ms period, stamped with the period's end in us).
"""

import json
import subprocess
import sys
import time

import pytest

from native_helpers import CUDA_SUCCESS, DEFAULT_TIMEOUT, check_sanitizers

CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_READY = 600
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
SAMPLE_US = 200_000
MS = 1_000_000


def busy_ns(gpu, pid, index=0):
    for proc in gpu.status()["processes"]:
        if proc["pid"] == pid:
            return proc["busy_ns"][index]
    raise AssertionError(f"process {pid} not in the sim's status")


def started(cudrive, gpu):
    p = cudrive.start(gpu.env())
    p.ok("init")
    p.ok("ctx 0")
    return p


def run_python(gpu, script):
    """Run SCRIPT (which prints one JSON line) in a process that sees the sim."""
    env = gpu.env()
    if gpu.build.asan:
        env["LD_PRELOAD"] = gpu.build.asan_runtime  # the sim libraries are instrumented
    res = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=DEFAULT_TIMEOUT)
    check_sanitizers(res.stderr, "python on the sim")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("op", ["launch", "launchex", "coop"])
def test_every_launch_path_takes_the_kernels_time(cudrive, gpu, op):
    p = started(cudrive, gpu)
    start = time.monotonic()
    rec = p.ok(f"{op} 5000000 4")
    assert (rec["count"], rec["failed"], rec["stream"]) == (4, 0, "null")
    p.ok("sync")
    assert time.monotonic() - start >= 0.019
    assert busy_ns(gpu, p.pid) == 20 * MS


@pytest.mark.parametrize("mode", ["dlsym", "procaddr", "procaddr1", "procaddr 12000 2", "procaddr 13000 0"])
def test_kernel_commands_in_every_resolve_mode(cudrive, gpu, mode):
    res = cudrive.run(f"init ctx 0 resolve {mode} module launch 1000 2 launchex 1000 coop 1000 "
                      "capture begin launch 1000 8 capture status capture end G graph G graphlaunch G 2 "
                      "event 1000 sync burn graph 1000 0.05 burn coop 1000 0.05", gpu.env())
    bad = [r for r in res.records if r["rc"] != CUDA_SUCCESS]
    assert not bad, res.describe()
    assert res.ops("capture")[1]["status"] == 1


@pytest.mark.parametrize(
    "base, version, flags, sym",
    [
        ("cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"),
        ("cuStreamBeginCapture", 10000, 2, "cuStreamBeginCapture_ptsz"),
        ("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"),
        ("cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz"),
        ("cuStreamEndCapture", 12000, 0, "cuStreamEndCapture"),
        ("cuStreamEndCapture", 12000, 2, "cuStreamEndCapture_ptsz"),
        ("cuStreamIsCapturing", 10000, 0, "cuStreamIsCapturing"),
        ("cuStreamIsCapturing", 12000, 2, "cuStreamIsCapturing_ptsz"),
        ("cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"),
        ("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"),
        ("cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags"),
        ("cuGraphLaunch", 10000, 0, "cuGraphLaunch"),
        ("cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"),
        ("cuGraphExecDestroy", 10000, 0, "cuGraphExecDestroy"),
        ("cuGraphDestroy", 10000, 0, "cuGraphDestroy"),
        ("cuEventCreate", 2000, 0, "cuEventCreate"),
        ("cuEventDestroy", 4000, 0, "cuEventDestroy_v2"),
        ("cuEventRecord", 2000, 0, "cuEventRecord"),
        ("cuEventRecord", 12000, 2, "cuEventRecord_ptsz"),
        ("cuEventRecordWithFlags", 11010, 2, "cuEventRecordWithFlags_ptsz"),
        ("cuEventQuery", 12000, 2, "cuEventQuery"),
        ("cuEventSynchronize", 12000, 2, "cuEventSynchronize"),
        ("cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"),
        ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
        ("cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz"),
        ("cuLaunchCooperativeKernel", 12000, 2, "cuLaunchCooperativeKernel_ptsz"),
    ],
)
def test_sim_proc_address_table(cudrive, gpu, base, version, flags, sym):
    rec = cudrive.run(f"getproc {base} {version} {flags}", gpu.env()).one("getproc")
    assert (rec["rc"], rec["status"], rec.get("sym")) == (CUDA_SUCCESS, 0, sym), rec


@pytest.mark.parametrize(
    "base, version",
    [("cuStreamBeginCapture", 9020), ("cuGraphInstantiate", 10020), ("cuGraphInstantiateWithFlags", 11030),
     ("cuEventRecordWithFlags", 11000)],
)
def test_sim_proc_address_too_old(cudrive, gpu, base, version):
    rec = cudrive.run(f"getproc {base} {version} 0", gpu.env()).one("getproc")
    assert rec["status"] == 2 and rec["rc"] != CUDA_SUCCESS, rec  # VERSION_NOT_SUFFICIENT


def test_events_complete_when_the_kernel_ends(cudrive, gpu):
    rec = cudrive.run("init ctx 0 event 20000000", gpu.env()).one("event")
    assert rec["rc"] == CUDA_SUCCESS, rec
    assert rec["query_before"] == CUDA_ERROR_NOT_READY
    assert rec["query_after"] == CUDA_SUCCESS
    assert rec["wait_ns"] >= 19 * MS
    assert rec["elapsed_rc"] == CUDA_SUCCESS and 20.0 <= rec["elapsed_ms"] < 21.0, rec
    assert rec["notiming_rc"] == CUDA_ERROR_INVALID_HANDLE


def test_captured_graph_runs_its_kernels_back_to_back(cudrive, gpu):
    p = started(cudrive, gpu)
    p.ok("capture begin")
    assert p.ok("launch 1000000 8")["stream"] == "capture"
    assert p.ok("capture status")["status"] == 1
    # cuCtxSynchronize is capture-unsafe: only a thread in relaxed mode may call it.
    p.ok("capturemode relaxed")
    p.ok("sync")
    p.ok("capturemode global")
    assert busy_ns(gpu, p.pid) == 0  # captured work does not run
    rec = p.ok("capture end G")
    assert (rec["name"], rec["kernels"]) == ("G", 8)
    assert p.ok("capture status")["status"] == 0
    p.ok("graph G")
    start = time.monotonic()
    p.ok("graphlaunch G")
    p.ok("sync")
    assert time.monotonic() - start >= 0.0075
    assert busy_ns(gpu, p.pid) == 8 * MS
    p.ok("graphlaunch G 3")
    p.ok("sync")
    assert busy_ns(gpu, p.pid) == 32 * MS
    # A graph launched into a capture joins it.
    p.ok("capture begin")
    p.ok("graphlaunch G 2")
    p.ok("launch 1000000")
    assert p.ok("capture end H")["kernels"] == 17
    p.ok("graph H")
    p.ok("graphlaunch H")
    p.ok("sync")
    assert busy_ns(gpu, p.pid) == 49 * MS


def test_capture_misuse_is_refused(cudrive, gpu):
    res = cudrive.run("init ctx 0 capture end capture begin capture begin capture end A capture end "
                      "graph A graphlaunch A", gpu.env())
    assert [r["rc"] for r in res.ops("capture")] == [
        CUDA_ERROR_ILLEGAL_STATE, CUDA_SUCCESS, CUDA_ERROR_ILLEGAL_STATE, CUDA_SUCCESS, CUDA_ERROR_ILLEGAL_STATE]
    assert res.one("graphlaunch")["rc"] == CUDA_SUCCESS  # an empty graph
    res = cudrive.run("init ctx 0 capture begin burn launch 1000 0.1", gpu.env())
    assert res.one("burn")["err"] == "CUDRIVE_USAGE"
    res = cudrive.run("init ctx 0 graph nothing", gpu.env())
    assert res.one("graph")["err"] == "CUDRIVE_NO_SUCH_NAME"


DRIVER_EDGES = r"""
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    assert rc == 0, (what, rc)
ok(cu.cuInit(0), "init")
ctx = ctypes.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
ok(cu.cuCtxSetCurrent(ctx), "set")
out = {}
s = ctypes.c_void_p()
ok(cu.cuStreamCreate(ctypes.byref(s), 1), "stream")
st = ctypes.c_int(-1)
out["null_status_rc"] = cu.cuStreamIsCapturing(None, ctypes.byref(st))
out["null_status"] = st.value
out["null_begin"] = cu.cuStreamBeginCapture_v2(None, 0)
out["bad_mode"] = cu.cuStreamBeginCapture_v2(s, 3)
ok(cu.cuStreamBeginCapture_v2(s, 0), "begin")
out["sync_capturing"] = cu.cuStreamSynchronize(s)
cu.cuStreamIsCapturing(s, ctypes.byref(st))
out["status_after_sync"] = st.value
g = ctypes.c_void_p(1)
out["end_invalidated"] = cu.cuStreamEndCapture(s, ctypes.byref(g))
out["graph_after_invalidated"] = g.value
cu.cuStreamIsCapturing(s, ctypes.byref(st))
out["status_after_end"] = st.value
ev = ctypes.c_void_p()
out["interprocess_timing"] = cu.cuEventCreate(ctypes.byref(ev), 4)
ok(cu.cuEventCreate(ctypes.byref(ev), 0), "event")
out["query_unrecorded"] = cu.cuEventQuery(ev)
ms = ctypes.c_float()
out["elapsed_unrecorded"] = cu.cuEventElapsedTime(ctypes.byref(ms), ev, ev)
out["record_bad"] = cu.cuEventRecord(ctypes.c_void_p(0x1234), None)
out["launch_bad"] = cu.cuGraphLaunch(ctypes.c_void_p(0x1234), None)
ok(cu.cuEventRecord(ev, s), "record idle")
out["query_idle"] = cu.cuEventQuery(ev)
ok(cu.cuEventDestroy_v2(ev), "destroy")
out["destroy_again"] = cu.cuEventDestroy_v2(ev)
name = ctypes.c_char_p()
cu.cuGetErrorName(901, ctypes.byref(name))
out["name_901"] = name.value.decode()
print(json.dumps(out))
"""


def test_driver_capture_and_event_edges(gpu):
    out = run_python(gpu, DRIVER_EDGES)
    assert out == {
        "null_status_rc": 0, "null_status": 0,
        "null_begin": 900,  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        "bad_mode": 1,
        "sync_capturing": 900, "status_after_sync": 2,  # invalidated
        "end_invalidated": 901, "graph_after_invalidated": None, "status_after_end": 0,
        "interprocess_timing": 1,
        "query_unrecorded": 0, "elapsed_unrecorded": CUDA_ERROR_INVALID_HANDLE,
        "record_bad": CUDA_ERROR_INVALID_HANDLE, "launch_bad": CUDA_ERROR_INVALID_HANDLE,
        "query_idle": 0, "destroy_again": CUDA_ERROR_INVALID_HANDLE,
        "name_901": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    }


NVML_SAMPLES = r"""
import ctypes, json, time
class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]
class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
def get(last):  # (rc of the sizing call, the count it gave, rc of the filling call, samples)
    n = ctypes.c_uint(0)
    rc = nv.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(n), ctypes.c_ulonglong(last))
    if rc != 7:
        return rc, n.value, None, []
    need = n.value
    buf = (Sample * need)()
    rc2 = nv.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), ctypes.c_ulonglong(last))
    return rc, need, rc2, [(s.pid, s.timeStamp, s.smUtil) for s in buf[:n.value]]
out = {}
out["sizing_rc"], out["needed"], out["fill_rc"], first = get(0)
last = max(t for _, t, _ in first)
out["first"] = first
out["again_rc"], out["again_count"], _, _ = get(last)
deadline = time.monotonic() + 1.0
while time.monotonic() < deadline:
    _, _, rc, nxt = get(last)
    if rc == 0:
        break
    time.sleep(0.01)
out["next"] = nxt
u = Util()
assert nv.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)) == 0
out["device"] = u.gpu
print(json.dumps(out))
"""


def test_two_burns_share_the_gpu_and_nvml_samples_show_it(cudrive, gpu):
    a, b = started(cudrive, gpu), started(cudrive, gpu)
    a.send("burn launch 200000 1.6")
    b.send("burn launch 200000 1.6")
    time.sleep(0.7)
    out = run_python(gpu, NVML_SAMPLES)
    status = gpu.status()
    ra, rb = a.read(), b.read()
    assert ra["op"] == rb["op"] == "burn" and ra["rc"] == rb["rc"] == CUDA_SUCCESS, (ra, rb)
    for rec in (ra, rb):
        assert rec["gpu_ns"] == rec["launches"] * 200000
        assert 0.4 <= rec["share"] <= 0.6, rec
    assert ra["share"] + rb["share"] >= 0.9
    # NVML: one sample per process, stamped with the end of a 200 ms period.
    assert (out["sizing_rc"], out["needed"], out["fill_rc"]) == (NVML_ERROR_INSUFFICIENT_SIZE, 2, 0)
    assert sorted(pid for pid, _, _ in out["first"]) == sorted([a.pid, b.pid])
    for samples in (out["first"], out["next"]):
        stamps = {t for _, t, _ in samples}
        assert len(stamps) == 1 and stamps.pop() % SAMPLE_US == 0, samples
        assert all(35 <= util <= 65 for _, _, util in samples), samples
    assert out["next"][0][1] - out["first"][0][1] == SAMPLE_US
    assert (out["again_rc"], out["again_count"]) == (NVML_ERROR_NOT_FOUND, 0)
    assert out["device"] >= 95
    # hami-simctl shows the same sample.
    assert status["devices"][0]["util"] >= 95
    utils = {p["pid"]: p["util"][0] for p in status["processes"]}
    assert all(35 <= utils[pid] <= 65 for pid in (a.pid, b.pid)), utils


@pytest.mark.parametrize("kind, per", [("launch", 1), ("launchex", 1), ("coop", 1), ("graph", 8)])
def test_burn_alone_gets_the_whole_gpu(cudrive, gpu, kind, per):
    p = started(cudrive, gpu)
    rec = p.ok(f"burn {kind} 500000 0.3 16")
    assert rec["kernels"] == rec["launches"] * per and rec["gpu_ns"] == rec["kernels"] * 500000
    assert 0.3e9 <= rec["elapsed_ns"] and 0.85 <= rec["share"] <= 1.0001, rec
    assert busy_ns(gpu, p.pid) == rec["gpu_ns"]


def test_burn_cycles_through_kernel_durations(cudrive, gpu):
    # A framework's layer: one long kernel, then two short ones, in turn.
    p = started(cudrive, gpu)
    rec = p.ok("burn launch 300000,100000,100000 0.3 16")
    assert rec["cycle"] == 3 and rec["ns"] == 300000, rec
    launches = rec["launches"]
    whole, rest = divmod(launches, 3)
    assert rec["gpu_ns"] == whole * 500000 + [0, 300000, 400000][rest], rec
    assert busy_ns(gpu, p.pid) == rec["gpu_ns"]


def test_a_launch_takes_its_threads_cpu_time_when_told(cudrive, gpu):
    # HAMI_SIM_LAUNCH_NS: each launch costs the caller that long, as a real
    # driver's does (about 4 us on an H100), so short kernels are paced by
    # their launches and the GPU idles between them.
    p = cudrive.start(gpu.env(HAMI_SIM_LAUNCH_NS="1000000"))
    p.ok("init")
    p.ok("ctx 0")
    rec = p.ok("burn launch 100000 0.5 0")
    assert 0.5e9 <= rec["elapsed_ns"] and rec["launches"] <= 0.5e9 / 1e6 + 1, rec
    assert rec["share"] <= 0.15, rec  # 100 us of GPU work per 1 ms launch
    res = cudrive.run("init", gpu.env(HAMI_SIM_LAUNCH_NS="4us"))
    assert res.one("init")["rc"] != CUDA_SUCCESS
    assert any("HAMI_SIM_LAUNCH_NS" in line for line in res.stderr.splitlines()), res.stderr


def test_burn_usage_errors(cudrive, gpu):
    res = cudrive.run("stdin", gpu.env(), input="init ctx 0\nburn bogus 1 1\nburn launch 1000 x\n"
                      "burn launch 1000 -1\nburn launch 1000 0.01 y\nburn launch 1,2,3,4,5,6,7,8,9 1\n"
                      "burn launch 1000,,x 1\nburn graph 1000,2000 1\nlaunch x\nlaunch 1000 2 echo ok\n")
    assert [r.get("err") for r in res.ops("burn")] == ["CUDRIVE_USAGE"] * 7
    launches = res.ops("launch")
    assert launches[0]["err"] == "CUDRIVE_USAGE" and launches[1]["count"] == 2
    assert res.one("echo")["text"] == "ok"
