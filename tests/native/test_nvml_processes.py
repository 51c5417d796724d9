"""NVML's per-process lists inside a slice name the slice's own processes only.

Two slices share one simulated GPU, and a process outside any slice holds
memory there too. A process of slice "a" asks NVML, as PyTorch's
out-of-memory message, nvidia-smi and pynvml do, which processes use the GPU:
it must get slice a's processes and their bytes, nothing of slice b's or of
the outsider, and the sizes NVML tells it to allocate must count only those;
every list alike, the per-mode detail list of driver 535 and newer
(nvmlDeviceGetRunningProcessDetailList) included.
A process without the preload library (the guard, root tools) still sees
every process.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hami_jupyter.slice.layout import HAMI_SLOT_LIVE, HamiSlot, slot_offset

from native_helpers import CUDA_SUCCESS, DEFAULT_TIMEOUT, check_sanitizers

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7

LISTS = [f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
         for kind in ("Compute", "Graphics", "MPSCompute") for suffix in ("", "_v2", "_v3")]
SAMPLES = ["nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"]
# nvmlDeviceGetRunningProcessDetailList, one list per mode (compute, graphics, MPS)
DETAIL = "nvmlDeviceGetRunningProcessDetailList"
DETAILS = [f"{DETAIL}/{kind}" for kind in ("Compute", "Graphics", "MPSCompute")]

# Asks NVML every per-process question, as ctypes (and pynvml) callers do;
# prints one JSON line. Every list is read three ways: sizing (count 0, no
# buffer), a buffer one element too small, and a buffer of exactly the size
# the sizing call asked for.
PROBE = r"""
import ctypes, json, pynvml
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
U, ULL = ctypes.c_uint, ctypes.c_ulonglong
class V1(ctypes.Structure):
    _fields_ = [("pid", U), ("usedGpuMemory", ULL)]
class V2(ctypes.Structure):
    _fields_ = [("pid", U), ("usedGpuMemory", ULL), ("gpuInstanceId", U), ("computeInstanceId", U)]
class Sample(ctypes.Structure):
    _fields_ = [("pid", U), ("timeStamp", ULL), ("smUtil", U), ("memUtil", U), ("encUtil", U), ("decUtil", U)]
class Info(ctypes.Structure):
    _fields_ = [("timeStamp", ULL), ("pid", U), ("smUtil", U), ("memUtil", U), ("encUtil", U),
                ("decUtil", U), ("jpgUtil", U), ("ofaUtil", U)]
class Infos(ctypes.Structure):
    _fields_ = [("version", U), ("processSamplesCount", U), ("lastSeenTimeStamp", ULL),
                ("procUtilArray", ctypes.POINTER(Info))]
INFOS_V1 = ctypes.sizeof(Infos) | (1 << 24)
class Detail(ctypes.Structure):
    _fields_ = [("pid", U), ("usedGpuMemory", ULL), ("gpuInstanceId", U), ("computeInstanceId", U),
                ("usedGpuCcProtectedMemory", ULL)]
class Details(ctypes.Structure):
    _fields_ = [("version", U), ("mode", U), ("numProcArrayEntries", U), ("procArray", ctypes.POINTER(Detail))]
DETAILS_V1 = ctypes.sizeof(Details) | (1 << 24)

def list_call(name, elem):
    fn = getattr(nv, name)
    def call(room, with_buffer):
        n = U(room)
        buf = (elem * max(room, 1))() if with_buffer else None
        rc = fn(dev, ctypes.byref(n), buf)
        entries = [[buf[i].pid, buf[i].usedGpuMemory] for i in range(n.value)] if rc == 0 and buf else []
        return rc, n.value, entries
    return call

def samples_call(room, with_buffer):
    n = U(room)
    buf = (Sample * max(room, 1))() if with_buffer else None
    rc = nv.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), ULL(0))
    return rc, n.value, [[buf[i].pid, 0] for i in range(n.value)] if rc == 0 and buf else []

def infos_call(room, with_buffer):
    buf = (Info * max(room, 1))() if with_buffer else None
    q = Infos(INFOS_V1, room, 0, ctypes.cast(buf, ctypes.POINTER(Info)) if buf else None)
    rc = nv.nvmlDeviceGetProcessesUtilizationInfo(dev, ctypes.byref(q))
    n = q.processSamplesCount
    return rc, n, [[buf[i].pid, 0] for i in range(n)] if rc == 0 and buf else []

def details_call(mode):
    def call(room, with_buffer):
        buf = (Detail * max(room, 1))() if with_buffer else None
        q = Details(DETAILS_V1, mode, room, ctypes.cast(buf, ctypes.POINTER(Detail)) if buf else None)
        rc = nv.nvmlDeviceGetRunningProcessDetailList(dev, ctypes.byref(q))
        n = q.numProcArrayEntries
        return rc, n, [[buf[i].pid, buf[i].usedGpuMemory] for i in range(n)] if rc == 0 and buf else []
    return call

def three_ways(call):
    sizing = call(0, False)
    need = sizing[1]
    small = call(need - 1, True) if need > 1 else None
    exact = call(need, True) if need > 0 else call(0, True)
    return {"sizing": sizing[:2], "small": small[:2] if small else None,
            "exact": [exact[0], exact[1]], "entries": exact[2]}

out = {}
for kind in ("Compute", "Graphics", "MPSCompute"):
    for suffix, elem in (("", V1), ("_v2", V2), ("_v3", V2)):
        name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
        out[name] = three_ways(list_call(name, elem))
for mode, kind in enumerate(("Compute", "Graphics", "MPSCompute")):
    out[f"nvmlDeviceGetRunningProcessDetailList/{kind}"] = three_ways(details_call(mode))
out["nvmlDeviceGetProcessUtilization"] = three_ways(samples_call)
out["nvmlDeviceGetProcessesUtilizationInfo"] = three_ways(infos_call)
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out["pynvml"] = sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
print(json.dumps(out))
"""


def probe(gpu, env):
    """Run PROBE with *env* (MPS clients listed: HAMI_SIM_MPS=1); its answers."""
    env = dict(env, HAMI_SIM_MPS="1")
    if gpu.build.sanitized and "LD_PRELOAD" not in env:
        env["LD_PRELOAD"] = gpu.build.runtime  # the sim libraries are instrumented
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=DEFAULT_TIMEOUT)
    check_sanitizers(res.stderr, "NVML probe")
    assert res.returncode == 0, f"probe exited {res.returncode}\n{res.stdout}\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def pids(answer):
    return sorted(pid for pid, _ in answer["entries"])


@pytest.fixture
def two_slices(cudrive, make_slice, gpu):
    """Slice a: two compute processes and a graphics one; slice b: one of each;
    and a compute process outside any slice (no preload). Each holds memory."""
    a, b = make_slice("a", limit="4g"), make_slice("b", limit="4g")
    procs = {
        "a1": cudrive.with_context(a.env, "alloc 256m"),
        "a2": cudrive.with_context(a.env, "alloc 128m"),
        "ag": cudrive.with_context(a.env, "graphics 1", "alloc 64m"),
        "b1": cudrive.with_context(b.env, "alloc 512m"),
        "bg": cudrive.with_context(b.env, "graphics 1", "alloc 32m"),
        "out": cudrive.with_context(gpu.env(), "alloc 1g"),
    }
    return a, b, {name: p.pid for name, p in procs.items()}


def test_a_slice_lists_only_its_own_processes(two_slices, gpu):
    a, _, pid = two_slices
    seen = probe(gpu, a.env)
    compute, graphics = sorted([pid["a1"], pid["a2"]]), [pid["ag"]]
    for name in LISTS + DETAILS:
        want = graphics if "Graphics" in name else compute
        assert pids(seen[name]) == want, (name, seen[name], pid)
    for name in SAMPLES:
        assert pids(seen[name]) == sorted([pid["a1"], pid["a2"], pid["ag"]]), (name, seen[name], pid)
    assert seen["pynvml"] == compute, (seen["pynvml"], pid)
    # The elements kept are whole: each pid comes with its own bytes.
    for name in LISTS + DETAILS:
        for p, used in seen[name]["entries"]:
            assert used == gpu.process_used(p, 0), (name, p, used)


def test_the_sizes_nvml_asks_for_count_only_the_slice(two_slices, gpu):
    a, _, _ = two_slices
    seen = probe(gpu, a.env)
    for name in LISTS + DETAILS:
        need = 1 if "Graphics" in name else 2
        ans = seen[name]
        assert ans["sizing"] == [NVML_ERROR_INSUFFICIENT_SIZE, need], (name, ans)
        if need > 1:
            assert ans["small"] == [NVML_ERROR_INSUFFICIENT_SIZE, need], (name, ans)
        assert ans["exact"] == [NVML_SUCCESS, need], (name, ans)
    for name in SAMPLES:
        ans = seen[name]
        assert ans["sizing"] == [NVML_ERROR_INSUFFICIENT_SIZE, 3], (name, ans)
        assert ans["small"] == [NVML_ERROR_INSUFFICIENT_SIZE, 3], (name, ans)
        assert ans["exact"] == [NVML_SUCCESS, 3], (name, ans)


@pytest.mark.parametrize("preload", [False, True], ids=["no-preload", "preload-without-settings"])
def test_outside_any_slice_every_process_is_listed(two_slices, gpu, preload):
    """The guard and root tools (no preload), or a process under the library
    that no setting puts in a slice: nothing is hidden."""
    _, _, pid = two_slices
    seen = probe(gpu, gpu.env(LD_PRELOAD=gpu.build.preload()) if preload else gpu.env())
    compute = sorted(pid[n] for n in ("a1", "a2", "b1", "out"))
    for name in LISTS + DETAILS:
        want = sorted([pid["ag"], pid["bg"]]) if "Graphics" in name else compute
        assert pids(seen[name]) == want, (name, seen[name], pid)
        assert seen[name]["sizing"] == [NVML_ERROR_INSUFFICIENT_SIZE, len(want)], (name, seen[name])
    for name in SAMPLES:
        assert pids(seen[name]) == sorted(pid.values()), (name, seen[name], pid)


def test_a_cuda_process_of_the_slice_lists_itself_too(two_slices, cudrive):
    a, _, pid = two_slices
    res = cudrive.run("init ctx 0 nvml nvmlprocs 0 1 nvmlprocs 0 2 nvmlprocs 0 3 nvmlgraphics 0 3", a.env)
    me = res.one("init")["pid"]
    for rec in res.ops("nvmlprocs"):
        assert rec["rc"] == NVML_SUCCESS, res.describe()
        assert sorted(p["pid"] for p in rec["processes"]) == sorted([pid["a1"], pid["a2"], me]), res.describe()
    assert [p["pid"] for p in res.one("nvmlgraphics")["processes"]] == [pid["ag"]], res.describe()


def test_a_slice_that_cannot_be_read_shows_no_other_process(two_slices, gpu, tmp_path, make_slice):
    _, _, pid = two_slices
    broken = tmp_path / "broken"
    broken.write_bytes(b"not a slice file" * 64)
    seen = probe(gpu, make_slice("broken", limit="4g").env)
    for name in LISTS + DETAILS + SAMPLES:
        assert seen[name]["entries"] == [], (name, seen[name])
        assert seen[name]["sizing"][1] == 0, (name, seen[name])
    assert seen["pynvml"] == []


def _write_slot(path, index, pid, pid_ns):
    slot = HamiSlot()
    slot.state = HAMI_SLOT_LIVE
    slot.pid = pid
    slot.pid_ns = pid_ns
    with open(path, "r+b") as fh:
        fh.seek(slot_offset(index))
        fh.write(bytes(slot))


def test_only_slots_a_live_process_of_our_namespace_holds_count(two_slices, gpu, cudrive, make_slice):
    """A slot its dead owner left LIVE (not swept yet: nobody of slice c runs)
    names a pid that may be another's by now; a slot of another PID namespace
    names a pid that means something else here. Neither is the slice's."""
    _, _, pid = two_slices
    c = make_slice("c", limit="4g")
    assert cudrive.run("init", c.env).one("init")["rc"] == CUDA_SUCCESS
    ns = os.stat("/proc/self/ns/pid").st_ino
    _write_slot(c.path, 250, pid["b1"], ns)          # stale: nobody holds its lock
    _write_slot(c.path, 251, pid["out"], ns + 1)     # held, but another namespace's pid
    _write_slot(c.path, 252, pid["bg"], ns)          # held, this namespace: a member
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(c.path)!r}, os.O_RDWR)
        for at in {[slot_offset(251), slot_offset(252)]!r}:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, at)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        seen = probe(gpu, c.env)
    finally:
        holder.kill()
        holder.wait()
    for name in LISTS + DETAILS:
        want = [pid["bg"]] if "Graphics" in name else []
        assert pids(seen[name]) == want, (name, seen[name], pid)


@pytest.mark.parametrize("name", LISTS + [DETAIL] + SAMPLES)
def test_dlsym_hands_out_the_hook(cudrive, make_slice, name):
    res = cudrive.run(f"nvmldlsym {name}", make_slice("a").env)
    rec = res.one("nvmldlsym")
    assert rec["rc"] == NVML_SUCCESS and os.path.basename(rec["lib"]) == "libvgpu.so", res.describe()
    assert rec["sym"] == name, res.describe()
