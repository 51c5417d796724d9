"""NVDEC on a real GPU: the driver's memory per decoder vs the slice's estimate, the cap, pass-through.

    python3 bench/nvdec_probe.py      (from the repo root, after make -C native all tools)

Drives the real libnvcuvid.so.1 through native/build/tools/cudrive, without and
with the preload, and reads NVML's used memory around each cuvidCreateDecoder.
"""
import ctypes, ctypes.util, json, os, subprocess, sys, tempfile, time

REPO = os.getcwd()
CUDRIVE = f"{REPO}/native/build/tools/cudrive"
LIB = f"{REPO}/native/build/libvgpu.so"
out = {}

print("libnvcuvid:", subprocess.run("ldconfig -p | grep -i nvcuvid; ls -l /usr/local/nvidia/lib64/libnvcuvid* 2>/dev/null",
                                    shell=True, capture_output=True, text=True).stdout)
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def used():
    return pynvml.nvmlDeviceGetMemoryInfo(h).used

class Drive:
    def __init__(self, env):
        self.p = subprocess.Popen([CUDRIVE, "stdin"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    def cmd(self, line):
        self.p.stdin.write(line + "\n"); self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())
        print("  ", line, "->", {k: v for k, v in r.items() if k not in ("pid",)})
        return r
    def close(self):
        self.p.stdin.close(); self.p.wait(timeout=30)
        return self.p.stderr.read()

def surface(w, h, chroma=1.5, wide=1):
    return int(-(-(w * wide) // 64) * 64 * (-(-h // 16) * 16) * chroma)

cases = {"h264_1080p_8": ("1920 1080 8", 8 * surface(1920, 1080) + 2 * surface(1920, 1080)),
         "hevc_2160p_10bit_12": ("3840 2160 12 2 codec=hevc bitdepth=10",
                                 12 * surface(3840, 2160, wide=2) + 2 * surface(3840, 2160, wide=2))}

print("== physical cost of one decoder, no preload")
base = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE", "LD_PRELOAD"))}
d = Drive(base)
d.cmd("init"); d.cmd("ctx 0")
print(d.cmd("cuvidcaps h264 420 8"))
print(d.cmd("cuvidcaps hevc 420 10"))
for name, (args, estimate) in cases.items():
    time.sleep(0.5); u0 = used()
    r = d.cmd(f"decoder {name} {args}")
    time.sleep(0.5); u1 = used()
    d.cmd(f"undecoder {name}")
    out[name] = {"rc": r["rc"], "nvml_delta": u1 - u0, "estimate": estimate}
    print(f"{name}: rc {r['rc']}, NVML used grew by {(u1 - u0) / 2**20:.1f} MiB, our estimate {estimate / 2**20:.1f} MiB")
d.close()

print("== under the preload: cap 3 decoders, slice 4g")
tmp = tempfile.mkdtemp()
env = dict(base, LD_PRELOAD=LIB, HAMI_SLICE=f"{tmp}/v.slice", CUDA_DEVICE_MEMORY_LIMIT="4g", HAMI_MAX_DECODERS="3")
d = Drive(env)
d.cmd("init"); d.cmd("ctx 0")
rcs = [d.cmd(f"decoder d{i} 1920 1080 8")["rc"] for i in range(4)]
sys.path.insert(0, REPO)
from hami_jupyter.slice.file import read_snapshot
snap = read_snapshot(f"{tmp}/v.slice")
dev = snap.devices[0]
out["cap"] = {"rcs": rcs, "slice_decoders": dev.decoders, "slice_used": dev.memory_used}
print(f"rcs {rcs}; slice says {dev.decoders} decoders, {dev.memory_used / 2**20:.1f} MiB used")
print(d.cmd("decodestatus d0 0"))
print(d.cmd("ctxlock"))
print(d.cmd("cuviddlsym cuvidCreateDecoder"))
print(d.cmd("cuviddlsym cuvidGetDecodeStatus"))
d.cmd("undecoder d0")
snap = read_snapshot(f"{tmp}/v.slice"); dev = snap.devices[0]
print(f"after one destroy: {dev.decoders} decoders, {dev.memory_used / 2**20:.1f} MiB")
out["after_destroy"] = {"decoders": dev.decoders, "used": dev.memory_used}
print("stderr:", d.close()[-600:])
print("RESULT", json.dumps(out))
