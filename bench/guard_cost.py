"""What ``hami-jupyter guard`` costs the host: CPU time of its loop.

    python3 bench/guard_cost.py [--seconds 30] [--processes 64] [--slices 8] [--interval 0.5]

Runs on the simulated GPU (no NVIDIA driver needed). In a temporary slice
root it makes SLICES slices (4 GiB caps) and starts PROCESSES ``cudrive``
processes, each holding 100 MiB and its 64 MiB context on one of two GPUs:
half under the preload library in the slices, half without it but naming a
slice in ``HAMI_SLICE`` (so that the guard has to attribute every one, by
slot and by environment). All are within their caps: the guard reads,
attributes and reports, and ends nothing.

Then it runs the guard as a service would (``python -m hami_jupyter guard
--interval INTERVAL --action kill``) for SECONDS after a warm-up, and prints
the guard process's CPU time (user + system, from ``/proc/<pid>/stat``) as a
percentage of one core, its resident memory, and the reports it wrote. It
also times single intervals in this process (``Guard.round``), wall and CPU
time, to show what one interval costs. The target is <= 1 % of one core at
0.5 s.

Note: on the simulated GPU, NVML's process lists are computed by the
simulator inside the guard process (it sweeps its process table on each
call); that cost is part of the figure, as the driver's would be.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hami_jupyter import native  # noqa: E402
from hami_jupyter.slice.create import ensure_slice  # noqa: E402
from hami_jupyter.slice.guard_report import read_report  # noqa: E402
from hami_jupyter.slice.settings import resolve_limits  # noqa: E402

WAIT_S = 60
WARM_UP_S = 3.0
TICKS = os.sysconf("SC_CLK_TCK")


def clean_environment():
    """This environment without anything that would configure the preload library."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HAMI_", "CUDA_DEVICE_")) and k != "LD_PRELOAD"}


def sim_environment(tmp, **extra):
    return native.sim_env(tmp / "sim-state", base=clean_environment(), HAMI_SIM_DEVICES=2,
                          HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m", **extra)


def start_holder(tmp, slice_path, device, preload, procs):
    """One cudrive holding 100 MiB on *device* (added to *procs* at once: always ended)."""
    extra = {"HAMI_SLICE": slice_path}
    if preload:
        extra.update(LD_PRELOAD=native.library_path(), HAMI_SCHEDULE_DIR=tmp,
                     HAMI_CONTEXT_OVERHEAD="64m")
    proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=sim_environment(tmp, **extra), text=True)
    procs.append(proc)
    proc.stdin.write(f"init\nctx {device}\nalloc 100m\n")
    proc.stdin.flush()
    return proc


def check_started(proc):
    for _ in range(3):  # one JSON answer per command; all must succeed
        answer = json.loads(proc.stdout.readline() or '{"rc": "no answer"}')
        if answer["rc"] != 0:
            raise SystemExit(f"cudrive {proc.pid} failed: {answer}")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_report(root, pid, newer_than=0.0):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            report = read_report(root)
        except ValueError:
            report = None
        if report and report["guard_pid"] == pid and report["written_unix"] > newer_than:
            return report
        time.sleep(0.05)
    raise SystemExit(f"the guard wrote no report within {WAIT_S} s")


def time_rounds(root, tmp, interval, rounds):
    """Wall and CPU ms of single intervals, run in this process."""
    import ctypes

    os.environ.update({k: v for k, v in sim_environment(tmp).items()
                       if k in ("HAMI_SIM_STATE", "HAMI_SIM_DEVICES", "HAMI_SIM_MEMORY",
                                "HAMI_SIM_CONTEXT_BYTES")})
    # The library path of a running process is fixed: load the simulated NVML by
    # its path, and pynvml's dlopen by name finds it loaded.
    ctypes.CDLL(str(native.sim_library_dir() / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    from hami_jupyter.agent.watch import Watch

    bench_root = tmp / "slices-inprocess"
    bench_root.mkdir(mode=0o700)
    for entry in root.iterdir():  # the same slices, read where this process writes its report
        if entry.name.endswith(".slice"):
            os.link(entry, bench_root / entry.name)
    guard = Watch.alone(bench_root, interval=interval, action="warn")
    guard.start()
    guard.round()  # first look: the /proc facts of every process
    wall, cpu = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        report = guard.round()
        wall.append((time.perf_counter() - w0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    guard.close()
    return wall, cpu, report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=200, help="intervals timed in-process")
    args = parser.parse_args()

    # A deployment's slice root is /run/hami-jupyter, a tmpfs: work in one too
    # (on a disk file system, replacing the report each interval waits for the journal).
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="hami-guard-bench-", dir=shm))
    os.chmod(tmp, 0o700)
    root = tmp / "slices"
    root.mkdir(mode=0o700)
    procs, guard = [], None
    try:
        paths = []
        for i in range(args.slices):
            path = root / f"bench{i}.slice"
            ensure_slice(path, f"bench{i}", resolve_limits({"memory_limit": "4g"}, {}))
            paths.append(path)
        t0 = time.monotonic()
        for i in range(args.processes):
            start_holder(tmp, paths[i % args.slices], i % 2, preload=i % 4 < 2, procs=procs)
        for proc in procs:
            check_started(proc)
        print(f"{args.processes} GPU processes in {args.slices} slices "
              f"({sum(1 for i in range(args.processes) if i % 4 < 2)} under the preload library), "
              f"started in {time.monotonic() - t0:.2f} s")

        env = sim_environment(tmp)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        guard = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root),
                                  "--interval", str(args.interval), "--action", "kill",
                                  "--log-level", "warning"], env=env)
        first = wait_report(root, guard.pid)
        time.sleep(WARM_UP_S)
        start_report = wait_report(root, guard.pid, first["written_unix"])
        c0, w0 = cpu_ticks(guard.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, w1 = cpu_ticks(guard.pid), time.monotonic()
        end_report = read_report(root)
        rss = rss_kib(guard.pid)
        guard.send_signal(signal.SIGTERM)
        guard.wait(30)

        counted = sum(len(g["processes"]) for s in end_report["slices"].values() for g in s["gpus"].values())
        alive = sum(1 for p in procs if p.poll() is None)
        percent = (c1 - c0) / TICKS / (w1 - w0) * 100
        intervals = (end_report["written_unix"] - start_report["written_unix"]) / args.interval
        print(f"guard process: {percent:.2f} % of one core over {w1 - w0:.1f} s at --interval "
              f"{args.interval:g} ({(c1 - c0) / TICKS:.2f} s CPU, ~{intervals:.0f} intervals, "
              f"{(c1 - c0) / TICKS / max(intervals, 1) * 1e3:.2f} ms CPU per interval); RSS {rss / 1024:.1f} MiB")
        print(f"its last report: {counted} processes attributed, {len(end_report['unattributed'])} "
              f"unattributed, {len(end_report['actions'])} actions, {len(end_report['errors'])} errors; "
              f"{alive} of {len(procs)} processes alive")

        wall, cpu, report = time_rounds(root, tmp, args.interval, args.rounds)
        wall.sort()
        cpu.sort()
        print(f"one interval in-process ({args.rounds} timed): wall median {statistics.median(wall):.2f} ms, "
              f"p99 {wall[int(len(wall) * 0.99) - 1]:.2f} ms; CPU median {statistics.median(cpu):.2f} ms "
              f"(= {statistics.median(cpu) / (args.interval * 1e3) * 100:.2f} % of one core at "
              f"{args.interval:g} s)")
        return 0 if alive == len(procs) and counted == args.processes else 1
    finally:
        if guard is not None and guard.poll() is None:
            guard.kill()
            guard.wait()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
