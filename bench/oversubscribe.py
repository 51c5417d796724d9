"""More users than the GPU's memory divides into (issue 28), on a real GPU.

    python3 bench/oversubscribe.py [--sessions 16] [--gib 8] [--bursts 4] [--steps 20]
                                   [--idle 15,45] [--min-idle 5] [--headroom SIZE] [--fast-park 0|1] [--seed 1]
                                   [--reference FILE] [--logs DIR] [--run-limit S] [--out FILE] [--csv FILE]

One GPU (cuda:0), PyTorch, run as root from the repository root. It builds
native/, makes one slice per session under a temporary slice root (limit
GIB + 3 GiB, guarantee 2 GiB: the limits add up to far more than the GPU, the
guarantees do not), starts the node's memory broker on that root, then:

1. reference: each session's training alone, in one process without the
   library (model built from its seed, every step's loss kept);
2. the run: SESSIONS PyTorch processes under the preload library, each its
   own slice, each holding a GIB working set (a model and its Adam state,
   half of it; a fixed data set on the GPU, the other half), each running
   BURSTS "cells" of STEPS training steps at times drawn from SEED, with idle
   spells of IDLE seconds between them. A cell that meets a full GPU waits
   (the library asks the broker, which parks the idlest kernel of another
   slice); a parked session's next cell brings it back (its resume waits for
   room the same way).

The broker runs with ``--headroom HEADROOM``, by default one working set
(GIB, 8 GiB): it then keeps that much free on the GPU by parking idle
sessions before anyone asks, so that a cell that must resume, or that meets
a full GPU, finds one working set of room at once instead of waiting for a
park first (a park of 8 GiB took 4.7 s on an H100, a resume 2.3 s: a park
and a resume in a row are past issue 28's 6 s target, a resume alone is
within it). ``--headroom 0`` runs the broker without (it parks only when
asked), for the figures to compare with. The report says which headroom ran.

``--fast-park 1`` runs the sessions with HAMI_FAST_PARK=1: each parks itself
at the host link's speed when the broker parks it (docs/parking.md, "The
fast park"); 0 (the default) parks them with the driver's checkpoint. The
report says which ran.

Reported: the headroom the broker ran with; steps that failed (target 0);
per cell the delay from its start to its first step's end beyond that
session's usual step, and the p95 of those that met a resume or a park on
the way (target: within 2x the resume time of that size, and at most 6 s at
8 GiB); the broker's parks (how many were for the headroom, how many failed)
and the bytes parked (the broker's and the processes' records); whether
every loss equals the reference's bit for bit; the GPU's memory use over
time (NVML, every 0.5 s; --csv writes it); how many such users static
slicing would fit on this GPU; and what idle culling would have lost instead
of parking (the steps done by every session at the moment it was parked).
JSON with every figure goes to --out.

--reference FILE keeps the reference losses: read from FILE when it holds
every session's (a run of fewer sessions, or the same, reuses a larger run's
reference), else computed and written there. A session that fails, in set-up
or in a cell, is reported with what its stderr says: the preload library's
lines ("hami: ...") and the end of its traceback, the CUDA call that failed
among them (PyTorch's C++ frames are on: TORCH_SHOW_CPP_STACKTRACES=1).
Each session's whole stderr is kept under --logs, with the broker's log and
the audit log.

Parking keeps a parked session's GPU state in host memory, so host memory
bounds how many sessions can take turns: the report gives the host's
available memory (MemAvailable) over the run, its lowest, and the sessions'
resident memory, beside the reasons of every park that failed. --run-limit S
stops starting cells S seconds after set-up (the report then says
"incomplete"), so that a run that cannot finish still reports.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GiB = 1 << 30

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
if mode == "reference":  # SEED is a comma-separated list: each trained alone, one after another
    steps = int(sys.argv[4])
    for one in seed.split(","):
        model, opt, data, target = build(one)
        say(seed=int(one), losses=[repr(step(model, opt, data, target, n)) for n in range(steps)])
        del model, opt, data, target
        torch.cuda.empty_cache()
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


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--gib", type=float, default=8.0, help="working set per session (GiB)")
    p.add_argument("--bursts", type=int, default=4, help="cells per session")
    p.add_argument("--steps", type=int, default=20, help="training steps per cell")
    p.add_argument("--idle", default="15,45", help="idle seconds between cells: LOW,HIGH")
    p.add_argument("--min-idle", type=float, default=5.0, help="the broker's --min-idle-seconds")
    p.add_argument("--headroom", default=None, metavar="SIZE",
                   help="the broker's --headroom (default: one working set, GIB; 0: none)")
    p.add_argument("--fast-park", default="0", choices=("0", "1"),
                   help="the sessions' HAMI_FAST_PARK: 1, they park themselves; 0, the driver's checkpoint")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="reference losses: read when FILE holds every session's, else computed and written")
    p.add_argument("--logs", default=None, metavar="DIR", help="each session's stderr (default: the slice root)")
    p.add_argument("--run-limit", type=float, default=3600.0, metavar="S",
                   help="start no cell later than S seconds after set-up (default 3600)")
    p.add_argument("--out", default=str(REPO / "native" / "build" / "bench" / "oversubscribe.json"))
    p.add_argument("--csv", default=None, help="the GPU's memory over time")
    return p.parse_args()


def nvml_gpu():
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)


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


def plain_env():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HAMI_")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def reference_losses(args, steps):
    """Each session's losses, trained alone without the library, one after another
    (or read from --reference when it holds them for these seeds, size and steps)."""
    seeds = [args.seed * 1000 + i for i in range(args.sessions)]
    kept = {}
    if args.reference and Path(args.reference).exists():
        saved = json.loads(Path(args.reference).read_text())
        if saved.get("gib") == args.gib and saved.get("steps", 0) >= steps:
            kept = {int(k): v[:steps] for k, v in saved["losses"].items()}
    if all(seed in kept for seed in seeds):
        print(f"reference: read from {args.reference}", flush=True)
        return {i: kept[seed] for i, seed in enumerate(seeds)}
    done = subprocess.run([sys.executable, "-c", WORKER, ",".join(map(str, seeds)), str(args.gib), "reference",
                           str(steps)], env=plain_env(), capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise SystemExit(f"the reference run failed:\n{done.stderr[-2000:]}")
    by_seed = {r["seed"]: r["losses"] for r in map(json.loads, done.stdout.strip().splitlines())}
    if args.reference:
        Path(args.reference).write_text(json.dumps({"gib": args.gib, "steps": steps, "losses": by_seed}))
    return {i: by_seed[seed] for i, seed in enumerate(seeds)}


def waits_by_call(sessions):
    """How many waits for room the sessions' library lines began, by the call that waited."""
    counts = {}
    for s in sessions:
        for line in s.stderr().splitlines():
            if line.startswith("hami:") and "now (" in line and "waiting up to" in line:
                call = line.split("now (", 1)[1].split("): waiting", 1)[0]
                counts[call] = counts.get(call, 0) + 1
    return counts


def resident(pid):
    """A process's resident memory in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def write_samples(path, samples, t_start):
    """The memory over time, as --csv names it (nothing without it)."""
    if not path:
        return
    with open(path, "w") as f:
        f.write("seconds,gpu_used_bytes,parked_bytes,waiting,host_available_bytes,sessions_resident_bytes\n")
        for t_, u, p, w, a, r in list(samples):
            f.write(f"{t_ - t_start:.2f},{u},{p},{w},{a},{r}\n")


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
        self.proc.stdin.write(f"cell {steps} {time.time():.6f}\n")
        self.proc.stdin.flush()


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


def main():
    args = parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run it as root: the broker parks other processes")
    lo, hi = (float(x) for x in args.idle.split(","))
    from hami_jupyter.slice.parking import host_available  # MemAvailable, as the agent's park check reads it
    from hami_jupyter.slice.size import format_size, parse_size

    headroom = args.headroom if args.headroom is not None else f"{args.gib:g}g"
    try:
        headroom_bytes = parse_size(headroom)
    except ValueError as e:
        raise SystemExit(f"--headroom: {e}")
    subprocess.run(["make", "-C", str(REPO / "native"), "-j8", "all"], check=True, stdout=subprocess.DEVNULL)
    pynvml, gpu = nvml_gpu()
    total = pynvml.nvmlDeviceGetMemoryInfo(gpu).total
    per = args.gib * GiB
    static_fit = int(total // (per + 0.55 * GiB))  # a context is about 0.5 GiB on Hopper
    rng = random.Random(args.seed)
    steps_total = args.bursts * args.steps

    t = time.time()
    reference = reference_losses(args, steps_total)
    print(f"reference: {args.sessions} sessions x {steps_total} steps alone in {time.time() - t:.0f} s", flush=True)

    root = Path(tempfile.mkdtemp(prefix="hami-oversub-"))
    root.chmod(0o755)
    paths = make_slices(root, args.sessions, int(per + 3 * GiB), 2 * GiB)
    sock = root / "broker.sock"
    broker_cmd = [sys.executable, "-m", "hami_jupyter", "broker", "--root", str(root), "--min-idle-seconds",
                  str(args.min_idle), "--headroom", headroom]
    print(f"broker: headroom {format_size(headroom_bytes) if headroom_bytes else 'none (parks only when asked)'}",
          flush=True)
    logs = Path(args.logs) if args.logs else root
    logs.mkdir(parents=True, exist_ok=True)
    broker_log_path = logs / "broker.log"
    broker_log = open(broker_log_path, "w")
    broker = subprocess.Popen(broker_cmd, env=plain_env(), stdout=broker_log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while not sock.exists():
        if broker.poll() is not None or time.time() > deadline:
            raise SystemExit("the broker did not start:\n" + broker_log_path.read_text()[-3000:])
        time.sleep(0.1)

    samples, stop = [], threading.Event()
    sessions = []

    def sample():
        while not stop.is_set():
            parked, waiting = parked_state(paths)
            samples.append((time.time(), pynvml.nvmlDeviceGetMemoryInfo(gpu).used, sum(parked.values()), waiting,
                            host_available(), sum(resident(s.proc.pid) for s in list(sessions))))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t_start = time.time()
    for i, path in enumerate(paths):
        sessions.append(Session(i, args, path, sock, logs))
        time.sleep(0.5)
    deadline = time.time() + 900
    while not all(s.ready for s in sessions):
        if time.time() > deadline or any(s.proc.poll() is not None for s in sessions):
            stop.set()
            bad = [s.i for s in sessions if s.proc.poll() is not None]
            report = {f"session {b}": what_failed(sessions[b].stderr()) for b in bad}
            if not bad:
                report = {"not ready": [s.i for s in sessions if not s.ready]}
            available = [a for *_, a, _ in samples if a]
            report["host_available_min"] = min(available) if available else None
            report["sessions_resident"] = sum(resident(s.proc.pid) for s in sessions)
            print(json.dumps(report, indent=1))
            write_samples(args.csv, samples, t_start)
            print(broker_log_path.read_text()[-3000:])
            for s in sessions:
                s.proc.kill()
            broker.terminate()
            raise SystemExit(f"sessions {bad} ended during set-up (or set-up took over 900 s); each one's "
                             f"stderr is in {logs}")
        time.sleep(0.2)
    t_ready = time.time()
    print(f"{args.sessions} sessions of {args.gib:g} GiB ready in {t_ready - t_start:.0f} s", flush=True)

    # The cells: each session's first at a random offset, the next ones an idle
    # spell after the last one answered.
    resident_ready = {s.i: resident(s.proc.pid) for s in sessions}
    plan = {s.i: t_ready + rng.uniform(0, hi) for s in sessions}
    done = {s.i: 0 for s in sessions}
    deadline = time.time() + args.run_limit
    while any(done[i] < args.bursts for i in done) and time.time() < deadline:
        now = time.time()
        for s in sessions:
            if s.busy or done[s.i] >= args.bursts:
                continue
            if plan[s.i] is None:
                plan[s.i] = now + rng.uniform(lo, hi)
            if now >= plan[s.i]:
                s.send(args.steps)
                done[s.i] += 1
                plan[s.i] = None
        time.sleep(0.05)
    incomplete = any(done[i] < args.bursts for i in done)
    deadline = max(deadline, time.time()) + 60  # the cells under way get a minute more
    while any(s.busy for s in sessions) and time.time() < deadline:
        time.sleep(0.1)
    incomplete = incomplete or any(s.busy for s in sessions)
    t_end = time.time()
    stop.set()
    sampler.join(timeout=5)

    # Figures.
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
    def trained(s):
        return [loss for c in s.cells for loss in c["losses"]]

    losses_equal = all(trained(s) == reference[s.i][:len(trained(s))] for s in sessions)
    audit = []
    audit_path = root / "audit.log"
    if audit_path.exists():
        for line in audit_path.read_text().splitlines():
            try:
                audit.append(json.loads(line))
            except ValueError:
                pass
    parks = [r for r in audit if r.get("who") == "hami-jupyter broker" and r.get("action") == "broker-park"]
    for_headroom = [r for r in parks if (r.get("requester") or {}).get("for") == "headroom"]
    park_failures = [r for r in audit if r.get("action") == "broker-park-failed"]
    parked_bytes = sum(int(r.get("bytes") or r.get("process_bytes") or 0) for r in parks)
    used = [u for _, u, _, _, _, _ in samples]
    available = [a for *_, a, _ in samples if a]
    why_failed = {}
    for r in park_failures:
        key = str(r.get("error") or r.get("why"))[:160]
        why_failed[key] = why_failed.get(key, 0) + 1
    # Idle culling instead of parking: every session parked would have lost its
    # training state, i.e. the steps it had done when it was parked.
    culled_steps = 0
    for r in parks:
        pids = set(r.get("pids") or [])  # the parked kernel's processes (a session is one)
        try:
            when = datetime.fromisoformat(str(r.get("when")).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        for s in sessions:
            if s.proc.pid in pids:
                culled_steps += sum(len([e for e in c["ends"] if e < when]) for c in s.cells)
    result = {
        "gpu": pynvml.nvmlDeviceGetName(gpu) if not isinstance(pynvml.nvmlDeviceGetName(gpu), bytes)
        else pynvml.nvmlDeviceGetName(gpu).decode(),
        "gpu_bytes": total, "sessions": args.sessions, "gib": args.gib, "asked_gib": args.sessions * args.gib,
        "bursts": args.bursts, "steps": args.steps, "idle": [lo, hi], "min_idle": args.min_idle,
        "headroom": headroom, "headroom_bytes": headroom_bytes, "fast_park": args.fast_park, "seed": args.seed,
        "setup_s": t_ready - t_start, "run_s": t_end - t_ready, "incomplete": incomplete,
        "cells_planned": args.sessions * args.bursts,
        "cells": sum(len(s.cells) for s in sessions), "failed_steps": failed,
        "delays_s": sorted(round(d, 3) for d in delays),
        "obstructed_cells": len(obstructed),
        "obstructed_p95_s": round(sorted(obstructed)[max(0, int(0.95 * len(obstructed)) - 1)], 3) if obstructed else None,
        "broker_parks": len(parks), "broker_parks_for_headroom": len(for_headroom),
        "broker_park_failures": len(park_failures), "broker_parked_bytes": parked_bytes,
        "broker_park_failures_why": why_failed,
        "host_memory": {"available_min": min(available) if available else None,
                        "available_start": available[0] if available else None,
                        "sessions_resident_at_ready": sum(resident_ready.values()),
                        "session_resident_at_ready_max": max(resident_ready.values(), default=0)},
        "losses_equal_reference": losses_equal,
        "gpu_used_bytes": {"min": min(used), "median": statistics.median(used), "max": max(used)} if used else None,
        "static_slicing_fits": static_fit,
        "idle_culling_would_have_lost_steps": culled_steps,
        "errors": [c.get("error") for s in sessions for c in s.cells if c.get("error")][:5],
        "failed_sessions": {s.i: what_failed(s.stderr()) for s in sessions
                            if any(c.get("failed") for c in s.cells)},
        "library_waits": waits_by_call(sessions),
    }
    # The figures first: a session still waiting in a cell would hold the end up.
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    write_samples(args.csv, samples, t_start)
    if audit_path.exists():
        (logs / "audit.log").write_text(audit_path.read_text())
    print(json.dumps({k: v for k, v in result.items() if k != "delays_s"}, indent=1), flush=True)
    print(broker_log_path.read_text()[-3000:], flush=True)
    for s in sessions:
        try:
            s.proc.stdin.write("quit\n")
            s.proc.stdin.flush()
        except OSError:
            pass
    ends = time.time() + 10
    for s in sessions:
        try:
            s.proc.wait(timeout=max(0.1, ends - time.time()))
        except subprocess.TimeoutExpired:
            s.proc.kill()
    broker.terminate()
    broker.wait(timeout=30)


if __name__ == "__main__":
    main()
