"""A slice's processes do not see another slice's GPU processes (real GPU).

A PyTorch process in slice "other" holds 2 GiB on GPU 0. A process in slice
"mine" asks who uses the GPU the ways users do: pynvml,
``torch.cuda.list_gpu_processes()``, PyTorch's out-of-memory message (which
names each process NVML lists, "Process 571 has 60.51 GiB memory in use"),
NVML's per-mode detail list (driver 535+), and ``nvidia-smi
--query-compute-apps``. None of them may name the other
slice's process; without the preload library (as the guard and root tools
run) it is listed.
"""

import re
import shutil
import subprocess
import sys

import pytest

from gpu_helpers import SCENARIOS, GiB, parse_result

pytestmark = pytest.mark.gpu

LOOK = r"""
import json, os, sys, torch
out = {"pid": os.getpid()}
torch.ones(1, device="cuda")  # a context: this process is on the GPU as well
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out["pynvml"] = sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
out["torch_list"] = torch.cuda.list_gpu_processes(0)
import ctypes  # driver 535+: the per-mode detail list, as ctypes callers read it
nv = ctypes.CDLL("libnvidia-ml.so.1")
class Detail(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint),
                ("ci", ctypes.c_uint), ("cc", ctypes.c_ulonglong)]
class Details(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("n", ctypes.c_uint),
                ("array", ctypes.POINTER(Detail))]
dev = ctypes.c_void_p()
nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
buf = (Detail * 256)()
q = Details(ctypes.sizeof(Details) | (1 << 24), 0, 256, buf)
try:
    rc = nv.nvmlDeviceGetRunningProcessDetailList(dev, ctypes.byref(q))
except AttributeError:  # a driver before 535
    rc = None
out["detail"] = sorted(buf[i].pid for i in range(q.n)) if rc == 0 else rc
try:
    torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
    out["oom"] = None
except torch.OutOfMemoryError as e:
    out["oom"] = str(e)
print("RESULT " + json.dumps(out), flush=True)
"""

SMI_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader"]


def nvml_pids():
    """The compute processes NVML lists on GPU 0, asked without the preload."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    finally:
        pynvml.nvmlShutdown()


def smi_pids(env=None):
    smi = shutil.which("nvidia-smi")
    res = subprocess.run([smi, "-i", "0", *SMI_QUERY], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    print(f"nvidia-smi {'in the slice' if env else 'without preload'}:\n{res.stdout}")
    return sorted(int(line.split(",")[0]) for line in res.stdout.splitlines() if line.strip())


def names(text, pid):
    return re.search(rf"\b{pid}\b", text) is not None


@pytest.fixture
def other_slice(slice_env):
    """The pid of a PyTorch process in slice "other" that holds 2 GiB on GPU 0."""
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    holder = subprocess.Popen([sys.executable, str(SCENARIOS), "torch_hold", str(2 * GiB)],
                              env=slice_env(limit="8g", name="other"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.startswith("READY"), (line, holder.stderr.read() if holder.poll() is not None else "")
        if holder.pid not in nvml_pids():
            pytest.skip(f"NVML does not list process {holder.pid} here (another PID namespace?): "
                        "nothing to hide")
        yield holder.pid
    finally:
        holder.communicate(input="", timeout=120)


def test_another_slices_process_is_not_shown(other_slice, slice_env):
    env = slice_env(limit="4g", name="mine")
    res = subprocess.run([sys.executable, "-c", LOOK, str(8 * GiB)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=300)
    r = parse_result("look", res.stdout, res.stderr, res.returncode)
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"other slice's process {other_slice}; in slice 'mine' ({r['pid']}): pynvml {r['pynvml']}\n"
          f"list_gpu_processes:\n{r['torch_list']}\nout-of-memory message:\n{r['oom']}")
    assert other_slice not in r["pynvml"]
    assert r["pid"] in r["pynvml"]  # its own process is still there
    if isinstance(r["detail"], list):  # the detail list (driver 535+), hooked the same way
        assert other_slice not in r["detail"] and r["pid"] in r["detail"], r["detail"]
    assert not names(r["torch_list"], other_slice)
    assert r["oom"], "no torch.OutOfMemoryError for 8 GiB in a 4 GiB slice"
    assert not names(r["oom"], other_slice)


@pytest.mark.xfail(strict=True, reason="nvidia-smi reads NVML's process lists through NVML's internal export "
                   "table (nvmlInternalGetExportTable), not the public entry points the library filters "
                   "(seen on driver 580.159.04): it still lists other slices' processes")
def test_nvidia_smi_in_a_slice_does_not_list_another_slice(other_slice, slice_env):
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    assert other_slice in smi_pids()
    assert other_slice not in smi_pids(slice_env(limit="4g", name="mine"))
