"""NVDEC on a real GPU: what each decoder really takes, over a grid of shapes.

    python3 bench/nvdec_grid.py        (repo root, after make -C native tools; writes $OUT/grid.json or /tmp/grid.json)

Creates and destroys one decoder at a time with native/build/tools/cudrive
(no preload) for H.264 8-bit, HEVC 8/10-bit and AV1, 640x480 to 3840x2160,
4/8/16 decode surfaces and 1/4 output surfaces, and records how much NVML's
used memory grew. docs/nvdec.md compares it with the slice's estimate.
"""
import json, os, subprocess, time
REPO = os.getcwd()
CUDRIVE = f"{REPO}/native/build/tools/cudrive"
import pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
def used():
    return pynvml.nvmlDeviceGetMemoryInfo(h).used
env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_", "CUDA_DEVICE", "LD_PRELOAD"))}
p = subprocess.Popen([CUDRIVE, "stdin"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def cmd(line):
    p.stdin.write(line + "\n"); p.stdin.flush(); return json.loads(p.stdout.readline())
cmd("init"); cmd("ctx 0")
rows = []
grid = []
for codec, bits in (("h264", 8), ("hevc", 8), ("hevc", 10), ("av1", 8)):
    for (w, hh) in ((640, 480), (1280, 720), (1920, 1080), (3840, 2160)):
        for surf in (4, 8, 16):
            for outs in (1, 4):
                grid.append((codec, bits, w, hh, surf, outs))
for codec, bits, w, hh, surf, outs in grid:
    time.sleep(0.3); u0 = used()
    r = cmd(f"decoder d {w} {hh} {surf} {outs} codec={codec} bitdepth={bits}")
    time.sleep(0.3); u1 = used()
    if r["rc"] == 0:
        cmd("undecoder d")
    rows.append({"codec": codec, "bits": bits, "w": w, "h": hh, "surf": surf, "out": outs, "rc": r["rc"], "delta": u1 - u0})
    print(rows[-1], flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "grid.json"), "w"))
