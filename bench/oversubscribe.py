"""More users than the GPU's memory divides into (issues 28, 32, 38), on a real GPU.

    python3 bench/oversubscribe.py [--gib 16] [--sessions N] [--headroom 16g,0] [--bursts 4] [--steps 20]
                                   [--idle 15,45] [--min-idle 5] [--host-reserve 2g] [--fast-park 0|1] [--seed 1]
                                   [--reference FILE] [--logs DIR] [--run-limit S] [--setup-limit S]
                                   [--time-limit S] [--out FILE] [--csv FILE] [--footprint SIZE]
    python3 bench/oversubscribe.py --dry-run [--gpu-memory SIZE] [--host-available SIZE] [...]

One GPU (cuda:0), PyTorch, run as root from the repository root:

1. sizing (before anything starts, printed with its reasons; then it builds
   native/): the fewest
   sessions of GIB (default 16 GiB) whose footprints add up to 25 % more
   than the GPU holds, but no more than host memory can hold: a parked
   session's GPU state lives in host memory, so the sessions' own host memory
   plus the most that can be parked at once (under every headroom of the
   run) must stay below the host's available memory less the agent's host
   reserve (--host-reserve, 2 GiB) and a margin (10 %, at least 4 GiB). A
   session's footprint (its working set, the CUDA context and PyTorch's
   caches: about 2.7 GiB more than 16 GiB on an H200) and its own host
   memory are measured on the reference's first session, alone on the GPU
   after its steps (NVML's used memory and the process's RssAnon, or the
   drop of MemAvailable if larger); until then, and with --dry-run, they are
   estimated (bench/oversubscribe_plan.py says how). --sessions N overrides
   the count, with a warning when host memory cannot hold it. An estimate of
   the whole invocation's time is printed first, and again once measured.
2. reference: each session's training alone, without the library (model
   built from its seed, every step's loss kept); the first session alone,
   the others side by side in a few processes (deterministic algorithms: the
   losses do not depend on what else runs).
3. one row per headroom of --headroom (a comma list, default one working
   set; ``16g,0`` runs the issue's two rows back to back, sharing the build,
   the sizing and the reference): a fresh slice per session under a
   temporary slice root (limit GIB + 3 GiB, or the footprint + 0.5 GiB if
   more; guarantee 2 GiB: the limits add up to far more than the GPU, the
   guarantees do not), the node agent's room policy on that root
   (``hami-jupyter broker --headroom H``), then SESSIONS PyTorch processes
   under the preload library, each its own slice, each holding a GIB working
   set (a model and its Adam state, half of it; a fixed data set on the GPU,
   the other half), each running BURSTS "cells" of STEPS training steps at
   times drawn from SEED (the same times in every row), with idle spells of
   IDLE seconds between them. A cell that meets a full GPU waits (the
   library asks the agent, which parks the idlest kernel of another slice); a
   parked session's next cell brings it back (its resume waits for room the
   same way). With a headroom the agent keeps that much free by parking idle
   sessions before anyone asks, so that a resume finds room at once;
   ``0`` parks only when asked.

Reported per row (JSON and a printed summary): set-ups that failed (with
what the session's stderr says: the library's lines, "hami: ...", and the
end of its traceback; PyTorch's C++ frames are on), steps that failed; per
cell the delay from its start to its first step's end beyond that session's
usual step, the p95 (nearest rank) and the longest of those that met a
resume or a park (over 1 s), and the longest wait of any cell (one still
waiting at the end counts with what it has waited); the agent's parks (for
the headroom, bytes each), failed parks and their reasons, failed restores
in the sessions' lines; whether every loss equals the reference's bit for
bit; the GPU's memory over time (NVML, every 0.5 s; --csv); the host's
available memory (its lowest) and each session's own anonymous memory
(RssAnon of /proc/PID/status: at ready and its peak; a parked session's
state counts there) beside the resident totals; how many sessions static
slicing fits; what idle culling would have lost instead of parking (the
steps done by every session at the moment it was parked); and each of issue
38's targets, met or not: 0 failed set-ups, all cells run, 0 failed steps,
0 failed parks, losses bit for bit, obstructed cells p95 <= 6 s with a
headroom and <= 15 s without, no cell waiting more than 30 s.

``--fast-park 1`` (the default) runs the sessions with HAMI_FAST_PARK=1: each
parks itself at the host link's speed when the agent parks it (docs/parking.md,
"The fast park"); 0 parks them with the driver's checkpoint. The report says
which ran.

--reference FILE keeps the reference losses and the measured footprint:
read from FILE when it holds them (the footprint only if measured on the
same GPU model with the same GIB), else computed and written there.
--run-limit S stops starting cells S seconds after a row's set-up (cells
under way get 30 s more; the row then says "incomplete"), per row;
--setup-limit S (300) fails a row's set-up that takes longer. --time-limit S
bounds the whole invocation: before each row, what is left of S is shared
evenly by the rows left, and the row's run and set-up limits are cut to fit
its share, so that every row reports within S (a cut row is "incomplete",
its cells not all run). The JSON (--out) is rewritten after every row, so a
run cut short keeps the rows done. Each session's whole stderr is kept under
--logs (one folder a row), with the agent's log and the audit log.
"""

import argparse
import json
import os
import queue
import shutil
import statistics
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import oversubscribe_plan as plan  # noqa: E402 (after the path it needs)
from oversubscribe_plan import GiB, fmt, minutes  # noqa: E402

# One session: a model and its optimizer state take half the working set, a
# data set the other half. Deterministic: the same seed gives the same losses
# whatever happened to the process between steps (parks, waits).
WORKER = r'''
import json, os, sys, time
import torch
seed, gib, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
def say(**kw):
    print(json.dumps(kw), flush=True)
def build(seed):
    torch.manual_seed(int(seed))
    width = 4096
    # parameters + gradients + Adam's two moments: 16 bytes a parameter
    layers = max(1, int(gib * (1 << 30) / 2 / 16 / (width * width)))
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width, bias=False),
                                                                     torch.nn.ReLU())]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rows = int(gib * (1 << 30) / 2 / (width * 4))
    data = torch.randn(rows, width, device="cuda")
    target = torch.randn(width, device="cuda")
    for p in model.parameters():  # Adam's state exists from the start: the working set is whole
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    return model, opt, data, target
def step(model, opt, data, target, n):
    batch = data[(n * 512) % (data.shape[0] - 512):][:512]
    loss = ((model(batch) - target) ** 2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    return loss.item()
if mode == "reference":  # seeds come on stdin, one a line, each trained alone
    steps, state = int(sys.argv[4]), None
    for line in sys.stdin:
        state = None  # the last seed's model and data are kept until here: the parent measures them
        torch.cuda.empty_cache()
        if not line.strip():
            break
        t = time.time()
        state = build(line.strip())
        built, losses, ends = time.time() - t, [], []
        for n in range(steps):
            losses.append(repr(step(*state, n)))
            ends.append(time.time())
        gaps = sorted(b - a for a, b in zip(ends, ends[1:]))
        say(seed=int(line), losses=losses, build_s=built, step_s=gaps[len(gaps) // 2] if gaps else None,
            held=torch.cuda.memory_reserved())
    sys.exit(0)
t0 = time.time()
model, opt, data, target = build(seed)
say(ready=True, init_s=time.time() - t0, held=torch.cuda.memory_reserved())
n = 0
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    k, t_cmd = int(cmd[1]), float(cmd[2])
    losses, ends = [], []
    try:
        for _ in range(k):
            losses.append(repr(step(model, opt, data, target, n)))
            ends.append(time.time())
            n += 1
        say(cell=True, t_cmd=t_cmd, ends=ends, losses=losses, failed=0)
    except Exception as e:  # an out-of-memory error or anything else: a failed step
        say(cell=True, t_cmd=t_cmd, ends=ends, losses=losses, failed=k - len(losses), error=str(e)[-400:])
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=None,
                   help="sessions per row (default: sized to this machine, see the sizing printed first)")
    p.add_argument("--gib", type=float, default=16.0, help="working set per session (GiB, default 16)")
    p.add_argument("--bursts", type=int, default=4, help="cells per session")
    p.add_argument("--steps", type=int, default=20, help="training steps per cell")
    p.add_argument("--idle", default="15,45", help="idle seconds between cells: LOW,HIGH")
    p.add_argument("--min-idle", type=float, default=5.0, help="the agent's --min-idle-seconds")
    p.add_argument("--fast-park", default="1", choices=("0", "1"),
                   help="the sessions' HAMI_FAST_PARK: 1 (the default), they park themselves at the host "
                        "link's speed; 0, the driver's checkpoint parks them")
    p.add_argument("--headroom", default=None, metavar="SIZES",
                   help="the agent's --headroom, one row each, in order: a comma list of sizes "
                        "(default: one working set, GIB; 0: none; 16g,0: both rows of issue 38)")
    p.add_argument("--host-reserve", default="2g", metavar="SIZE",
                   help="the agent's --host-memory-reserve (default 2g, the agent's own default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="reference losses and footprint: read when FILE holds them, else computed and written")
    p.add_argument("--logs", default=None, metavar="DIR",
                   help="each session's stderr, the agent's log and audit log, a folder per row "
                        "(default: each row's slice root)")
    p.add_argument("--run-limit", type=float, default=3600.0, metavar="S",
                   help="per row: start no cell later than S seconds after its set-up (default 3600)")
    p.add_argument("--setup-limit", type=float, default=300.0, metavar="S",
                   help="per row: a session not ready S seconds after the first started has failed its set-up")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="the whole invocation: each row's limits are cut so that the rows left share what is "
                        "left of S seconds evenly, and every row reports within S")
    p.add_argument("--footprint", default=None, metavar="SIZE",
                   help="a session's GPU footprint, instead of measuring it on the reference's first session")
    p.add_argument("--out", default=str(REPO / "native" / "build" / "bench" / "oversubscribe.json"))
    p.add_argument("--csv", default=None, help="the GPU's and the host's memory over time, every row")
    p.add_argument("--dry-run", action="store_true", help="print the sizing and the time estimate, start nothing")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="with --dry-run: the GPU's memory, for planning on another machine (default: NVML's)")
    p.add_argument("--host-available", default=None, metavar="SIZE",
                   help="with --dry-run: the host's available memory (default: this machine's MemAvailable)")
    return p.parse_args(argv)


def options(args):
    """The options that need checking, checked all at once: ``(headrooms,
    idle, host_reserve, footprint)``, or SystemExit naming every problem."""
    from hami_jupyter.slice.size import parse_size

    problems, headrooms, idle, reserve, footprint = [], [], None, None, None
    try:
        headrooms = plan.parse_headrooms(args.headroom, args.gib)
    except ValueError as e:
        problems.append(str(e))
    try:
        lo, hi = (float(x) for x in args.idle.split(","))
        if not 0 <= lo <= hi:
            raise ValueError
        idle = (lo, hi)
    except ValueError:
        problems.append(f"--idle {args.idle!r}: give LOW,HIGH seconds, 0 <= LOW <= HIGH (15,45)")
    for name, text in (("--host-reserve", args.host_reserve), ("--footprint", args.footprint)):
        if text is None:
            continue
        try:
            value = parse_size(text)
        except ValueError as e:
            problems.append(f"{name}: {e}")
            continue
        if name == "--footprint":
            footprint = value
        else:
            reserve = value
    if args.sessions is not None and args.sessions < 1:
        problems.append(f"--sessions {args.sessions}: give 1 or more (or leave it out: sized to this machine)")
    if not args.gib > 0:
        problems.append(f"--gib {args.gib:g}: give a working set above 0")
    if args.bursts < 1 or args.steps < 1:
        problems.append("--bursts and --steps: give 1 or more")
    if problems:
        raise SystemExit("\n".join(problems))
    return headrooms, idle, reserve, footprint


# ---- facts of this machine ----------------------------------------------------------


def nvml_gpu():
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)


def gpu_name(pynvml, gpu):
    name = pynvml.nvmlDeviceGetName(gpu)
    return name.decode() if isinstance(name, bytes) else name


def process_gpu_bytes(pynvml, gpu, pid):
    """NVML's figure for one process (None where NVML does not list it, as in a PID namespace)."""
    try:
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu):
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
    except pynvml.NVMLError:
        pass
    return None


def proc_memory(pid):
    """``{"rss": VmRSS, "anon": RssAnon}`` of a process in bytes (0 once it is gone)."""
    out = {"rss": 0, "anon": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
            elif line.startswith("RssAnon:"):
                out["anon"] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def plain_env():
    """The environment of the reference, the agent and (with the library added) the sessions: nothing
    of the library's from the caller's (the simulated GPU's settings, HAMI_SIM_*, stay)."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and (not k.startswith("HAMI_") or k.startswith("HAMI_SIM_"))}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# ---- the reference ------------------------------------------------------------------


class ReferenceWorker:
    """A process that trains seeds alone, one at a time, without the library;
    it keeps the last seed's model and data on the GPU until asked for the
    next, so that its footprint can be measured in between."""

    def __init__(self, args, steps, stderr_path):
        self._stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, "-", str(args.gib), "reference", str(steps)],
                                     env=plain_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def train(self, seed, timeout=600):
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if not line:
            self.proc.kill()
            self._stderr.flush()
            why = "took over %d s" % timeout if line is None else "ended"
            raise SystemExit(f"the reference run {why} (seed {seed}):\n"
                             f"{self._stderr_path.read_text(errors='replace')[-2000:]}")
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self._stderr.close()


def seeds_of(args, n):
    return [args.seed * 1000 + i for i in range(n)]


def read_reference(args, steps, gpu):
    """``(losses by seed, measured footprint or None)`` from --reference when it
    matches this GIB and holds STEPS losses; the footprint only if measured on
    the same GPU model."""
    if not (args.reference and Path(args.reference).exists()):
        return {}, None
    saved = json.loads(Path(args.reference).read_text())
    if saved.get("gib") != args.gib or saved.get("steps", 0) < steps:
        return {}, None
    kept = {int(k): v[:steps] for k, v in saved["losses"].items()}
    measured = saved.get("footprint")
    return kept, measured if measured and measured.get("gpu") == gpu else None


def write_reference(args, steps, losses, measured):
    if args.reference:
        Path(args.reference).write_text(json.dumps({"gib": args.gib, "steps": steps, "footprint": measured,
                                                    "losses": {str(k): v for k, v in losses.items()}}))


def measure_first(args, steps, seed, pynvml, gpu, name, logs):
    """The reference's first session, alone on the GPU: its losses and what
    it took (GPU footprint, its own host memory, the seconds it spent).
    Returns ``(worker, record, measured)``: the worker is kept for more seeds."""
    from hami_jupyter.slice.parking import host_available

    used0, avail0 = pynvml.nvmlDeviceGetMemoryInfo(gpu).used, host_available()
    t = time.time()
    worker = ReferenceWorker(args, steps, logs / "reference-0.stderr")
    rec = worker.train(seed)
    wall = time.time() - t
    used1, own = pynvml.nvmlDeviceGetMemoryInfo(gpu).used, process_gpu_bytes(pynvml, gpu, worker.proc.pid)
    mem, avail1 = proc_memory(worker.proc.pid), host_available()
    step_s = rec.get("step_s") or 0.0
    measured = {
        "gpu": name, "gib": args.gib,
        "bytes": max(used1 - used0, own or 0),
        "gpu_used_rise_bytes": used1 - used0, "process_gpu_bytes": own,
        "session_host_bytes": max(mem["anon"], avail0 - avail1 if avail0 and avail1 else 0),
        "rss_anon_bytes": mem["anon"], "host_available_drop_bytes": avail0 - avail1 if avail0 and avail1 else None,
        "torch_reserved_bytes": rec.get("held"),
        "process_s": max(0.0, wall - rec["build_s"] - steps * step_s),
        "build_s": rec["build_s"], "step_s": step_s,
    }
    return worker, rec, measured


def reference_rest(args, steps, seeds, first, k, logs):
    """Losses of *seeds*, trained in *k* processes side by side (*first*, a
    worker already started, is one of them)."""
    todo, out, failures = queue.Queue(), {}, []
    for s in seeds:
        todo.put(s)
    workers = ([first] if first else []) + [ReferenceWorker(args, steps, logs / f"reference-{i}.stderr")
                                            for i in range(1 if first else 0, k)]

    def drain(w):
        try:
            while True:
                try:
                    s = todo.get_nowait()
                except queue.Empty:
                    return
                out[s] = w.train(s)["losses"]
        except SystemExit as e:
            failures.append(str(e))

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for w in workers:
        w.close()
    if failures:
        raise SystemExit(failures[0])
    return out


# ---- one row ------------------------------------------------------------------------


def make_slices(root, n, limit, guarantee):
    from hami_jupyter.slice.change import set_limits
    from hami_jupyter.slice.create import ensure_slice
    from hami_jupyter.slice.settings import resolve_limits

    paths = []
    for i in range(n):
        name = f"s{i:02d}"
        path = root / f"{name}.slice"
        ensure_slice(path, name, resolve_limits({"memory_limit": str(limit)}, {}))
        set_limits(path, None, memory_guarantee=guarantee)
        paths.append(path)
    return paths


def waits_by_call(sessions):
    """How many waits for room the sessions' library lines began, by the call that waited."""
    counts = {}
    for s in sessions:
        for line in s.stderr().splitlines():
            if not line.startswith("hami:"):
                continue
            if "now (" in line and "waiting up to" in line:  # the driver refused it
                call = line.split("now (", 1)[1].split("): waiting", 1)[0]
            else:  # the room ledger sent it to its turn
                turn = re.search(r"\(([^()]*)\) waits its turn", line)
                if turn is None:
                    continue
                call = turn.group(1)
            counts[call] = counts.get(call, 0) + 1
    return counts


def failed_restores(sessions):
    """The sessions' own restores that failed, as their library lines say ("hami-park restore ... failed")."""
    return sum(1 for s in sessions for line in s.stderr().splitlines()
               if line.startswith("hami:") and "restore" in line and "failed" in line)


def what_failed(stderr_text, tail_lines=12):
    """What a failed session's stderr says: the library's lines and the end of its traceback."""
    lines = stderr_text.splitlines()
    library = [line for line in lines if line.startswith("hami:")]
    tail = [line for line in lines if not line.startswith("hami:")][-tail_lines:]
    return {"library_lines": library[-20:], "traceback_tail": tail}


class Session:
    def __init__(self, i, args, path, sock, logs):
        env = plain_env()
        env.update(LD_PRELOAD=str(REPO / "native" / "build" / "libvgpu.so"), HAMI_SLICE=str(path),
                   HAMI_ROOM_WAIT="300", HAMI_BROKER_SOCKET=str(sock), TORCH_SHOW_CPP_STACKTRACES="1",
                   HAMI_FAST_PARK=args.fast_park)
        self.i = i
        # A file, not a pipe: a session that says much must never block on a full pipe.
        self.stderr_path = Path(logs) / f"session-{i:02d}.stderr"
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(args.seed * 1000 + i), str(args.gib),
                                      "run"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        self.cells = []
        self.ready = None
        self.lock = threading.Lock()
        self.busy = False
        self.sent = None  # when the cell under way was sent
        self.memory = {"anon_peak": 0, "rss_peak": 0}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if rec.get("ready"):
                    self.ready = rec
                elif rec.get("cell"):
                    self.cells.append(rec)
                    self.busy = False

    def stderr(self):
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def send(self, steps):
        with self.lock:
            self.busy = True
            self.sent = time.time()
        self.proc.stdin.write(f"cell {steps} {self.sent:.6f}\n")
        self.proc.stdin.flush()

    def sample_memory(self):
        m = proc_memory(self.proc.pid)
        self.memory["anon_peak"] = max(self.memory["anon_peak"], m["anon"])
        self.memory["rss_peak"] = max(self.memory["rss_peak"], m["rss"])
        return m

    def quit(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except OSError:
            pass


def parked_state(paths):
    """``{session index: parked bytes}`` and the processes waiting for room, from the slice files."""
    from hami_jupyter.slice.file import read_snapshot

    parked, waiting = {}, 0
    for i, path in enumerate(paths):
        try:
            snap = read_snapshot(path)
        except (OSError, ValueError):
            continue
        parked[i] = sum(sum((s.parked or {}).values()) for s in snap.slots)
        waiting += sum(1 for s in snap.slots if getattr(s, "room_wait_since_unix_ns", 0))
    return parked, waiting


def cell_figures(sessions, reference, t_end):
    """Failed steps, each cell's delay before its first step, the obstructed
    ones, the longest wait (a cell still under way counts with what it has
    waited), and whether every loss is the reference's."""
    failed = sum(c["failed"] for s in sessions for c in s.cells)
    delays, obstructed = [], []
    for s in sessions:
        all_steps = [b - a for c in s.cells for a, b in zip(c["ends"], c["ends"][1:])]
        usual = statistics.median(all_steps) if all_steps else 0.0
        for c in s.cells:
            if not c["ends"]:
                continue
            delay = c["ends"][0] - c["t_cmd"] - usual
            delays.append(delay)
            if delay > 1.0:  # a resume or someone else's park stood in the way
                obstructed.append(delay)
    still = [t_end - s.sent for s in sessions if s.busy and s.sent]

    def trained(s):
        return [loss for c in s.cells for loss in c["losses"]]

    return {
        "cells": sum(len(s.cells) for s in sessions), "failed_steps": failed,
        "delays_s": sorted(round(d, 3) for d in delays),
        "obstructed_cells": len(obstructed),
        "obstructed_p95_s": round(plan.p95(obstructed), 3) if obstructed else None,
        "obstructed_longest_s": round(max(obstructed), 3) if obstructed else None,
        "cells_still_waiting_s": sorted(round(w, 3) for w in still),
        "longest_wait_s": round(max(delays + still), 3) if delays or still else None,
        "losses_equal_reference": all(trained(s) == reference[s.i][:len(trained(s))] for s in sessions),
        "errors": [c.get("error") for s in sessions for c in s.cells if c.get("error")][:5],
        "failed_sessions": {s.i: what_failed(s.stderr()) for s in sessions if any(c.get("failed") for c in s.cells)},
    }


def park_figures(audit, sessions):
    """The agent's parks (from its audit records), failed parks and why, and
    what idle culling would have lost instead: every session parked would
    have lost its training state, i.e. the steps it had done when parked."""
    parks = [r for r in audit if r.get("who") == "hami-jupyter broker" and r.get("action") == "broker-park"]
    failures = [r for r in audit if r.get("action") == "broker-park-failed"]
    sizes = [int(r.get("bytes") or r.get("process_bytes") or 0) for r in parks]
    why = {}
    for r in failures:
        key = str(r.get("error") or r.get("why"))[:160]
        why[key] = why.get(key, 0) + 1
    culled = 0
    for r in parks:
        pids = set(r.get("pids") or [])  # the parked kernel's processes (a session is one)
        try:
            when = datetime.fromisoformat(str(r.get("when")).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        for s in sessions:
            if s.proc.pid in pids:
                culled += sum(len([e for e in c["ends"] if e < when]) for c in s.cells)
    return {
        "broker_parks": len(parks),
        "broker_parks_for_headroom": sum(1 for r in parks if (r.get("requester") or {}).get("for") == "headroom"),
        "broker_park_failures": len(failures), "broker_park_failures_why": why,
        "broker_parked_bytes": sum(sizes), "park_bytes_min": min(sizes, default=None),
        "park_bytes_max": max(sizes, default=None),
        "idle_culling_would_have_lost_steps": culled,
    }


def read_audit(path):
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_row(b, index, label, headroom_bytes, share=None):
    """One full run with the agent's headroom *headroom_bytes*: its figures as a
    dict. *share*: the seconds this row may take in all (``--time-limit``): its
    set-up limit and, once set up, its run limit are cut to fit."""
    from hami_jupyter.slice.parking import host_available

    t_row = time.time()
    run_limit, setup_limit = b.args.run_limit, b.args.setup_limit
    if share is not None:
        setup_limit = plan.row_limits(share, 1, 0, run_limit, setup_limit, plan.Timing)[1]

    args, n, fp = b.args, b.sizing.sessions, b.sizing.footprint
    pynvml, gpu = b.pynvml, b.gpu
    root = Path(tempfile.mkdtemp(prefix="hami-oversub-"))
    root.chmod(0o755)
    limit = max(int(args.gib * GiB + 3 * GiB), fp + GiB // 2)
    paths = make_slices(root, n, limit, 2 * GiB)
    sock = root / "broker.sock"
    logs = Path(args.logs) / f"row{index}-headroom-{label}" if args.logs else root
    logs.mkdir(parents=True, exist_ok=True)
    print(f"\n== row {index}: headroom {fmt(headroom_bytes) if headroom_bytes else 'none (parks only when asked)'}, "
          f"{n} sessions of {args.gib:g} GiB (slice limit {fmt(limit)}, guarantee 2 GiB); logs in {logs}",
          flush=True)
    agent_log_path = logs / "broker.log"
    agent_log = open(agent_log_path, "w")
    agent = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "broker", "--root", str(root),
                              "--min-idle-seconds", str(args.min_idle), "--headroom", str(headroom_bytes),
                              "--host-memory-reserve", str(b.host_reserve)],
                             env=plain_env(), stdout=agent_log, stderr=subprocess.STDOUT)
    row = {"row": index, "headroom": label, "headroom_bytes": headroom_bytes, "sessions": n, "gib": args.gib,
           "slice_limit_bytes": limit, "cells_planned": n * args.bursts, "failed_setups": 0, "cells": 0,
           "share_s": share, "setup_limit_s": setup_limit, "logs": str(logs)}
    deadline = time.time() + 60
    while not sock.exists():
        if agent.poll() is not None or time.time() > deadline:
            raise SystemExit("the agent did not start:\n" + agent_log_path.read_text()[-3000:])
        time.sleep(0.1)

    samples, stop, sessions = [], threading.Event(), []

    def sample():
        while not stop.is_set():
            parked, waiting = parked_state(paths)
            mem = [s.sample_memory() for s in list(sessions)]
            samples.append((time.time(), pynvml.nvmlDeviceGetMemoryInfo(gpu).used, sum(parked.values()), waiting,
                            host_available(), sum(m["rss"] for m in mem), sum(m["anon"] for m in mem)))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    row["host_available_start"] = host_available()
    sampler.start()
    t_start = time.time()
    for i, path in enumerate(paths):
        sessions.append(Session(i, args, path, sock, logs))
        time.sleep(plan.Timing.stagger_s)
    deadline = t_start + setup_limit
    while not all(s.ready for s in sessions):
        ended = [s.i for s in sessions if s.proc.poll() is not None]
        if ended or time.time() > deadline:
            bad = ended or [s.i for s in sessions if not s.ready]
            why = "ended during set-up" if ended else f"not ready {setup_limit:.0f} s after the first started"
            row.update(failed_setups=len(bad), setup_failed={s: why for s in bad},
                       setup_failures={s: what_failed(sessions[s].stderr()) for s in bad})
            print(f"set-up FAILED: sessions {bad} {why}; each one's stderr is in {logs}", flush=True)
            break
        time.sleep(0.2)
    t_ready = time.time()
    row["setup_s"] = t_ready - t_start
    ready_memory = {s.i: proc_memory(s.proc.pid) for s in sessions}
    if share is not None:  # what is left of the row's share after its set-up, less the cells' grace and the end
        run_limit = plan.row_limits(share - (t_ready - t_row), 1, 0, run_limit, setup_limit, plan.Timing)[0]
    row["run_limit_s"] = run_limit
    if not row["failed_setups"]:
        print(f"{n} sessions of {args.gib:g} GiB ready in {t_ready - t_start:.0f} s"
              + (f"; cells start until {run_limit:.0f} s from now (--time-limit)" if share is not None else ""),
              flush=True)
        # The cells: each session's first at a random offset, the next ones an
        # idle spell after the last one answered (the same times every row).
        cells = plan.CellPlan(n, args.bursts, b.idle, args.seed, t_ready)
        deadline = time.time() + run_limit
        while not cells.done() and time.time() < deadline:
            for i in cells.due(time.time(), [s.i for s in sessions if not s.busy]):
                sessions[i].send(args.steps)
            time.sleep(plan.TICK_S)
        incomplete = not cells.done()
        deadline = max(deadline, time.time()) + plan.Timing.grace_s  # the cells under way get a while more
        while any(s.busy for s in sessions) and time.time() < deadline:
            time.sleep(0.1)
        row["incomplete"] = incomplete or any(s.busy for s in sessions)
    t_end = time.time()
    row["run_s"] = t_end - t_ready
    stop.set()
    sampler.join(timeout=5)

    if not row["failed_setups"]:
        row.update(cell_figures(sessions, b.reference, t_end))
    audit_path = root / "audit.log"
    row.update(park_figures(read_audit(audit_path), sessions))
    used = [x[1] for x in samples]
    available = [x[4] for x in samples if x[4]]
    row.update({
        "library_restore_failures": failed_restores(sessions),
        "host_memory": {
            "available_start": row.pop("host_available_start"),
            "available_min": min(available) if available else None,
            "sessions_resident_at_ready": sum(m["rss"] for m in ready_memory.values()),
            "session_resident_at_ready_max": max((m["rss"] for m in ready_memory.values()), default=0),
            "sessions_anon_at_ready": sum(m["anon"] for m in ready_memory.values()),
            "sessions_anon_max": max((x[6] for x in samples), default=0),
            "per_session": [{"session": s.i, "pid": s.proc.pid, "rss_anon_at_ready": ready_memory[s.i]["anon"],
                             "rss_anon_peak": max(s.memory["anon_peak"], ready_memory[s.i]["anon"]),
                             "rss_at_ready": ready_memory[s.i]["rss"], "rss_peak": s.memory["rss_peak"]}
                            for s in sessions],
        },
        "gpu_used_bytes": {"min": min(used), "median": statistics.median(used), "max": max(used)} if used else None,
        "library_waits": waits_by_call(sessions),
    })
    row["targets"] = plan.verdicts(row)
    b.samples.extend((index,) + x for x in samples)
    b.sample_start = b.sample_start or t_start
    if audit_path.exists() and logs != root:
        (logs / "audit.log").write_text(audit_path.read_text())
    # The figures are written first: a session still waiting in a cell would hold the end up.
    b.rows.append(row)
    b.write()
    print_row(row, agent_log_path)
    for s in sessions:
        s.quit()
    ends = time.time() + 10
    for s in sessions:
        try:
            s.proc.wait(timeout=max(0.1, ends - time.time()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
    agent.terminate()
    try:
        agent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        agent.kill()
    agent_log.close()
    if logs != root:  # what is worth keeping is under --logs now
        shutil.rmtree(root, ignore_errors=True)
    return row


def print_row(row, agent_log_path):
    """A row's figures, as a reader of the run needs them."""
    h = row["host_memory"]
    say = lambda *a: print(*a, flush=True)  # noqa: E731
    say(f"-- row {row['row']} (headroom {row['headroom']}): {row['sessions']} sessions")
    say(f"  set-up: {row['setup_s']:.0f} s, {row['failed_setups']} failed")
    for s, why in (row.get("setup_failures") or {}).items():
        say(f"    session {s}: {row['setup_failed'][s]}; " + " | ".join(why["library_lines"][-3:] +
                                                                   why["traceback_tail"][-3:]))
    if not row["failed_setups"]:
        say(f"  cells: {row['cells']} of {row['cells_planned']} in {row['run_s']:.0f} s"
            f"{' (incomplete)' if row.get('incomplete') else ''}; failed steps {row['failed_steps']}; "
            f"losses bit for bit: {'yes' if row['losses_equal_reference'] else 'NO'}")
        p, longest = row["obstructed_p95_s"], row["obstructed_longest_s"]
        say(f"  obstructed cells: {row['obstructed_cells']}"
            + (f", p95 {p:.1f} s, longest {longest:.1f} s" if p is not None else "")
            + (f"; longest wait of any cell {row['longest_wait_s']:.1f} s" if row["longest_wait_s"] is not None else "")
            + (f"; {len(row['cells_still_waiting_s'])} still waiting at the end" if row["cells_still_waiting_s"]
               else ""))
    sizes = (f", {fmt(row['park_bytes_min'])}-{fmt(row['park_bytes_max'])} each"
             if row["park_bytes_min"] is not None else "")
    say(f"  parks: {row['broker_parks']} ({row['broker_parks_for_headroom']} for the headroom){sizes}; "
        f"{row['broker_park_failures']} failed; {row['library_restore_failures']} restores failed "
        f"(the sessions' lines)")
    for why, count in row["broker_park_failures_why"].items():
        say(f"    {count} x {why}")
    say(f"  host memory: {fmt(h['available_start'] or 0)} available at the start, "
        f"{fmt(h['available_min'] or 0)} at the lowest; the sessions' resident memory at ready "
        f"{fmt(h['sessions_resident_at_ready'])} (anonymous {fmt(h['sessions_anon_at_ready'])}, at most "
        f"{fmt(h['sessions_anon_max'])} during the run)")
    say("  each session's anonymous memory (RssAnon, GiB), at ready / peak: "
        + ", ".join(f"{m['session']}: {m['rss_anon_at_ready'] / GiB:.1f}/{m['rss_anon_peak'] / GiB:.1f}"
                    for m in h["per_session"]))
    say(f"  library waits by call: {row['library_waits']}")
    say("  targets:")
    for t in row["targets"]:
        say(f"    {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['measured']}")
    say("  the agent's log, its end:")
    say(agent_log_path.read_text(errors="replace")[-2000:])


# ---- the whole invocation -----------------------------------------------------------


class Bench:
    """What the rows share: options, the GPU, the sizing, the reference, and the output."""

    def __init__(self, args, idle, host_reserve):
        self.args, self.idle, self.host_reserve = args, idle, host_reserve
        self.pynvml = self.gpu = self.sizing = self.reference = None
        self.rows, self.samples, self.sample_start, self.head = [], [], None, {}

    def write(self):
        out = dict(self.head, rows=self.rows)
        Path(self.args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(self.args.out).write_text(json.dumps(out, indent=1))
        if self.args.csv:
            with open(self.args.csv, "w") as f:
                f.write("row,seconds,gpu_used_bytes,parked_bytes,waiting,host_available_bytes,"
                        "sessions_resident_bytes,sessions_anon_bytes\n")
                for row, t_, *rest in self.samples:
                    f.write(f"{row},{t_ - self.sample_start:.2f}," + ",".join(str(x) for x in rest) + "\n")


def print_plan(sizing, parts, args):
    for line in sizing.lines():
        print(line, flush=True)
    rows = [k for k in parts if k.startswith("row")]
    total = sum(parts.values())
    print("time estimate: " + ", ".join(f"{k} {v:.0f} s" for k, v in parts.items())
          + f": about {minutes(total)} in all", flush=True)
    if args.run_limit < 3600:
        print(f"  --run-limit {args.run_limit:g} s per row: a row's cells end within "
              f"{args.run_limit + plan.Timing.grace_s:.0f} s of its set-up", flush=True)
    if args.time_limit:
        print(f"  --time-limit {args.time_limit:g} s: the rows share what is left of it, each row's cells cut "
              f"to fit its share", flush=True)
    elif total > 600:
        print(f"  over 10 minutes for {len(rows)} row(s): --time-limit S keeps the whole run within S "
              f"(fewer --bursts or a shorter --idle make each row shorter)", flush=True)
    return total


def footprint_of(measured, gib, how):
    """``(bytes, where from)``: the measured footprint, or the estimate where the
    measure is below the working set (NVML did not see the process)."""
    if measured["bytes"] >= gib * GiB:
        return measured["bytes"], how
    return plan.estimated_footprint(gib), f"estimated: {fmt(measured['bytes'])} was measured, below the working set"


def with_measured(t, measured, gib):
    """The estimate's timing, once a first session's seconds are known."""
    t.process_s, t.measured = measured["process_s"], True
    t.build_s_per_gib, t.step_s_per_gib = measured["build_s"] / gib, measured["step_s"] / gib
    return t


def say_measured(m):
    own = fmt(m["process_gpu_bytes"]) if m["process_gpu_bytes"] is not None else "not listed"
    print(f"\nmeasured on the reference's first session, alone on the GPU: footprint {fmt(m['bytes'])} "
          f"(NVML's used memory rose {fmt(m['gpu_used_rise_bytes'])}, the process's own figure {own}, "
          f"PyTorch reserved {fmt(m['torch_reserved_bytes'] or 0)}); its own host memory "
          f"{fmt(m['session_host_bytes'])} (RssAnon {fmt(m['rss_anon_bytes'])}, MemAvailable fell "
          f"{fmt(m['host_available_drop_bytes'] or 0)}); start {m['process_s']:.1f} s, build {m['build_s']:.1f} s, "
          f"a step {m['step_s'] * 1000:.0f} ms", flush=True)


def main(argv=None):
    args = parse_args(argv)
    headrooms, idle, host_reserve, given_fp = options(args)
    from hami_jupyter.slice.parking import host_available
    from hami_jupyter.slice.size import parse_size

    if not args.dry_run and os.geteuid() != 0:
        raise SystemExit("run it as root: the agent parks other processes")
    t0, steps, cpus = time.time(), args.bursts * args.steps, os.cpu_count() or 2
    t = plan.Timing(make_s=5.0 if (REPO / "native" / "build" / "libvgpu.so").exists() else 30.0)
    pynvml = gpu = None
    if args.dry_run and args.gpu_memory:
        total, name = parse_size(args.gpu_memory), "(given)"
    else:
        try:
            pynvml, gpu = nvml_gpu()
        except Exception as e:  # no pynvml, no driver, no GPU
            raise SystemExit(f"cannot read the GPU through NVML ({e}); with --dry-run, --gpu-memory SIZE "
                             f"plans for a GPU of that size") from None
        total, name = pynvml.nvmlDeviceGetMemoryInfo(gpu).total, gpu_name(pynvml, gpu)
    avail = parse_size(args.host_available) if args.dry_run and args.host_available else host_available()
    kept, measured = read_reference(args, steps, name)
    if measured:
        with_measured(t, measured, args.gib)
    fp, fp_from = ((given_fp, "given by --footprint") if given_fp else
                   footprint_of(measured, args.gib, f"measured, read from {args.reference}") if measured else
                   (plan.estimated_footprint(args.gib), "estimated until measured"))
    host, host_from = ((measured["session_host_bytes"], f"measured, read from {args.reference}") if measured else
                       (plan.SESSION_HOST_GUESS, "estimated until measured"))
    must_measure = not measured and not given_fp
    hb = [h for _, h in headrooms]

    def sized(fp, fp_from, host, host_from):
        return plan.size_sessions(total, fp, host, avail, host_reserve, hb, args.sessions,
                                  footprint_from=fp_from, session_host_from=host_from)

    def estimate(sizing, have, measure):
        missing = sum(1 for s in seeds_of(args, sizing.sessions) if s not in have)
        return plan.estimate(sizing, t, args.gib, args.bursts, args.steps, idle, args.seed, args.run_limit, cpus,
                             reference_seeds=missing, measure=measure,
                             time_limit=args.time_limit and args.time_limit - (time.time() - t0))

    print(f"GPU {name}, {fmt(total)}; host {fmt(avail)} available, {cpus} CPUs; {len(headrooms)} row(s), "
          f"headroom " + ", ".join(lbl for lbl, _ in headrooms), flush=True)
    sizing = sized(fp, fp_from, host, host_from)
    print_plan(sizing, estimate(sizing, kept, must_measure), args)
    if args.dry_run:
        return 0

    b = Bench(args, idle, host_reserve)
    b.pynvml, b.gpu = pynvml, gpu
    subprocess.run(["make", "-C", str(REPO / "native"), "-j8", "all"], check=True, stdout=subprocess.DEVNULL)
    t.make_s = 0.0  # done: the estimates below count what is left
    # The reference; its first session alone, to measure what one takes.
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="hami-oversub-ref-"))
    logs.mkdir(parents=True, exist_ok=True)
    t_ref, first, losses = time.time(), None, dict(kept)
    if must_measure:
        seed0 = seeds_of(args, 1)[0]
        first, rec, measured = measure_first(args, steps, seed0, pynvml, gpu, name, logs)
        losses[seed0] = rec["losses"]
        with_measured(t, measured, args.gib)
        say_measured(measured)
        sizing = sized(*footprint_of(measured, args.gib, "measured"), measured["session_host_bytes"], "measured")
        print_plan(sizing, estimate(sizing, losses, False), args)
    b.sizing = sizing
    seeds = seeds_of(args, sizing.sessions)
    todo = [s for s in seeds if s not in losses]
    if todo:
        k = plan.reference_workers(len(todo), total, sizing.footprint, cpus,
                                   host_each=sizing.session_host + int(args.gib * GiB / 8), host_available=avail)
        losses.update(reference_rest(args, steps, todo, first, k, logs))
    elif first:
        first.close()
    print(f"reference: {len(todo) + must_measure} sessions x {steps} steps computed in {time.time() - t_ref:.0f} s"
          + (f", {len(seeds) - len(todo) - must_measure} read from {args.reference}" if kept else ""), flush=True)
    write_reference(args, steps, losses, measured)
    b.reference = {i: losses[s] for i, s in enumerate(seeds)}
    b.head = {
        "gpu": name, "gpu_bytes": total, "sessions": sizing.sessions, "gib": args.gib,
        "asked_gib": sizing.sessions * args.gib, "bursts": args.bursts, "steps": args.steps, "idle": list(idle),
        "min_idle": args.min_idle, "seed": args.seed, "host_reserve_bytes": host_reserve,
        "fast_park": args.fast_park,
        "sizing": {"footprint_bytes": sizing.footprint, "footprint_from": sizing.footprint_from,
                   "session_host_bytes": sizing.session_host, "session_host_from": sizing.session_host_from,
                   "host_available_bytes": avail, "host_margin_bytes": plan.host_margin(avail),
                   "for_gpu": sizing.for_gpu, "for_host": sizing.for_host, "asked": args.sessions,
                   "warnings": sizing.warnings, "lines": sizing.lines()},
        "measured": measured, "static_slicing_fits": plan.resident(total, sizing.footprint),
        "headrooms": [lbl for lbl, _ in headrooms], "run_limit_s": args.run_limit, "time_limit_s": args.time_limit,
    }
    for index, (label, h) in enumerate(headrooms, 1):
        share = None
        if args.time_limit:
            left, rows_left = args.time_limit - (time.time() - t0), len(headrooms) - index + 1
            share = left / rows_left
            print(f"\n--time-limit: {left:.0f} s left for {rows_left} row(s), {share:.0f} s for this one", flush=True)
        run_row(b, index, label, h, share)
    b.head["total_s"] = time.time() - t0
    b.write()
    print(f"\n{len(b.rows)} row(s) in {minutes(time.time() - t0)}; {sizing.sessions} sessions of {args.gib:g} GiB "
          f"on {name} ({fmt(total)}); figures in {args.out}\n", flush=True)
    print(plan.targets_table(b.rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
