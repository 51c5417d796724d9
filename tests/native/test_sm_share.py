"""The SM share on the simulated GPU: achieved share, modes, live changes, every launch path.

The simulated GPU runs kernels one after another on a device timeline shared
by all processes, and NVML reports per-process utilization in 200 ms samples
like the real driver. `cudrive burn KIND NS SECONDS` launches NS-long kernels
for SECONDS and reports the share of that wall time its kernels occupied the
GPU, which is what a user of the slice gets.

A loaded host (the tests run on a shared two-core machine) keeps the
launching thread off the CPU now and then, and a throttled thread keeps only
a few short kernels queued, so the GPU idles for it. That is the host's
doing, not the share's: a slice is never above its share plus the
tolerance, and never below it less the tolerance and less the part of the
time the host kept from its launching thread (its run-queue wait, from
/proc's schedstat, and the stalls of the machine's CPUs, seen as late wake-ups
of a 10-ms sleeper pinned to each; both 0 on a quiet host). Paces are counted
over the time the thread could run.
"""

import concurrent.futures
import math
import os
import threading
import time
from typing import NamedTuple

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, slice_device, slot_of

KERNEL_NS = 1_000_000  # 1 ms kernels
TOLERANCE = 0.05       # +-5 points on the simulated GPU (a shared 2-core CI machine)


def _waited_ns(pid):
    """ns the main thread of process PID has spent runnable but waiting for a CPU."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[1])


class _WaitTrace(threading.Thread):
    """Every 10 ms, what the host kept from a process's launching thread so
    far (s): its run-queue wait (_waited_ns), plus the most any CPU of the
    machine stalled (a 10-ms sleeper pinned to it woke late: a loaded
    virtual machine's CPUs stop for tens of ms, and a sleeping launcher
    then wakes as late, which no run queue shows)."""

    PERIOD = 0.01

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.points, self.stop = pid, [], threading.Event()
        self.stalls = [0.0] * (os.cpu_count() or 1)
        self.probes = [threading.Thread(target=self._probe, args=(cpu,), daemon=True)
                       for cpu in range(len(self.stalls))]

    def _probe(self, cpu):
        try:
            os.sched_setaffinity(0, {cpu})  # this thread only
        except OSError:
            return
        last = time.monotonic()
        while not self.stop.wait(self.PERIOD):
            now = time.monotonic()
            self.stalls[cpu] += max(0.0, now - last - 2 * self.PERIOD)
            last = now

    def run(self):
        for probe in self.probes:
            probe.start()
        while True:
            try:
                self.points.append((time.monotonic(), _waited_ns(self.pid) / 1e9 + max(self.stalls)))
            except OSError:
                break
            if self.stop.wait(self.PERIOD):
                break
        for probe in self.probes:
            probe.join()

    def part(self, t0, t1):
        """At most the part of [t0, t1) the host kept from the thread: all of
        it between the samples around the window (1 where unknown)."""
        before = [w for t, w in self.points if t <= t0]
        after = [w for t, w in self.points if t >= t1]
        if not before or not after:
            return 1.0
        return min(1.0, (after[0] - before[-1]) / (t1 - t0))


class Burn(NamedTuple):
    share: float     # GPU time of its kernels over the burn's wall time
    launches: int
    elapsed: float   # s
    starved: float   # part of the wall time the host kept from its launching thread (_WaitTrace)

    @property
    def run(self):
        """Seconds the launching thread could run."""
        return max(self.elapsed * (1 - self.starved), 1e-9)

    @property
    def pace(self):
        """Launches per second it could run."""
        return self.launches / self.run

    @property
    def busy(self):
        """GPU time of its kernels per second it could run."""
        return self.share * self.elapsed / self.run


def _burner(cudrive, env, device=0):
    p = cudrive.start(env)
    p.ok("init")
    p.ok(f"ctx {device}")
    return p


def _burn_rec(p, seconds, kind="launch", ns=KERNEL_NS, host_ns=0, sync_every=64):
    trace = _WaitTrace(p.pid)
    trace.start()
    try:
        rec = p.ok(f"burn {kind} {ns} {seconds} {sync_every} {host_ns}", timeout=seconds + 30)
    finally:
        trace.stop.set()
        trace.join()
    assert rec["launches"] > 0, rec
    held = trace.points[-1][1] - trace.points[0][1] if len(trace.points) > 1 else 0.0
    return Burn(rec["share"], rec["launches"], rec["elapsed_ns"] / 1e9, min(1.0, held / (rec["elapsed_ns"] / 1e9)))


def _burn(p, seconds, kind="launch", ns=KERNEL_NS, host_ns=0):
    return _burn_rec(p, seconds, kind, ns, host_ns).share


def _held(burns, share, tol=TOLERANCE):
    """Whether BURNS (of one slice, over the same seconds) got SHARE (a fraction)
    of the GPU's time: at most share + tol, at least share - tol less the part
    of the time a launching thread of theirs waited for a CPU; and the text."""
    burns = [burns] if isinstance(burns, Burn) else list(burns)
    got, starved = sum(b.share for b in burns), max(b.starved for b in burns)
    text = f"{got:.3f} of the GPU's time at a {100 * share:.0f} % share"
    if starved >= 0.01:
        text += f" (the host kept {100 * starved:.0f} % of the time from its launching thread)"
    return share - tol - starved <= got <= share + tol, text


def _assert_held(burns, share, tol=TOLERANCE):
    ok, text = _held(burns, share, tol)
    assert ok, text


def _sm_slice(make_slice, name, share, mode=None, **extra):
    env = {"CUDA_DEVICE_SM_LIMIT": share}
    if mode:
        env["HAMI_SM_MODE"] = mode
    return make_slice(name=name, limit=None, overhead="0", **env, **extra)


def test_no_share_runs_free(cudrive, make_slice):
    s = make_slice(limit=None, overhead="0")
    b = _burn_rec(_burner(cudrive, s.env), 2)
    assert b.share > 0.95 - b.starved, b


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share", [25, 50, 75])
def test_one_process_gets_its_share(cudrive, make_slice, share):
    s = _sm_slice(make_slice, "team", share)
    p = _burner(cudrive, s.env)
    _burn(p, 1)  # the controller settles (the first sample comes after 200 ms)
    _assert_held(_burn_rec(p, 4), share / 100)


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share", [25, 50, 75])
def test_four_processes_share_one_budget(cudrive, make_slice, share):
    s = _sm_slice(make_slice, "team", share)
    procs = [_burner(cudrive, s.env) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: _burn(p, 1), procs))
        burns = list(pool.map(lambda p: _burn_rec(p, 4), procs))
    ok, text = _held(burns, share / 100)
    assert ok, f"{text}: {[round(b.share, 3) for b in burns]}"


def _two_slices(cudrive, make_slice, a, b, mode, settle=1):
    """Two slices, one burning process each, measured together."""
    sa = _sm_slice(make_slice, "a", a, mode)
    sb = _sm_slice(make_slice, "b", b, mode)
    pa, pb = _burner(cudrive, sa.env), _burner(cudrive, sb.env)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: _burn(p, settle), (pa, pb)))
        return list(pool.map(lambda p: _burn_rec(p, 4), (pa, pb)))


@pytest.mark.share_accuracy
def test_hard_slices_each_get_their_share(cudrive, make_slice):
    a, b = _two_slices(cudrive, make_slice, 30, 70, "hard")
    (ok_a, text_a), (ok_b, text_b) = _held(a, 0.30), _held(b, 0.70)
    assert ok_a and ok_b, f"{text_a}; {text_b}"


@pytest.mark.share_accuracy
def test_elastic_slice_takes_idle_time_hard_does_not(cudrive, make_slice):
    elastic = _burner(cudrive, _sm_slice(make_slice, "e", 30, "elastic").env)
    _burn(elastic, 2)
    b = _burn_rec(elastic, 3)
    assert b.share >= 0.90 - b.starved, b
    elastic.close()
    hard = _burner(cudrive, _sm_slice(make_slice, "h", 30, "hard").env)
    _burn(hard, 1)
    _assert_held(_burn_rec(hard, 3), 0.30)


@pytest.mark.share_accuracy
def test_share_changes_live_up_and_down(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_sm_share

    s = _sm_slice(make_slice, "team", 25)
    p = _burner(cudrive, s.env)
    _burn(p, 1)
    _assert_held(_burn_rec(p, 2), 0.25)
    set_sm_share(s.path, gpu.uuid(0), 75)
    _burn(p, 2)  # the bound: settled within 2 s
    _assert_held(_burn_rec(p, 2), 0.75)
    set_sm_share(s.path, gpu.uuid(0), 25)
    _burn(p, 2)
    _assert_held(_burn_rec(p, 2), 0.25)
    set_sm_share(s.path, gpu.uuid(0), 0)  # lifted
    _burn(p, 1)
    b = _burn_rec(p, 2)
    assert b.share > 0.95 - b.starved, b


@pytest.mark.share_accuracy
def test_share_set_on_a_slice_that_had_none(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_sm_share

    s = make_slice(limit=None, overhead="0")
    p = _burner(cudrive, s.env)
    b = _burn_rec(p, 1)
    assert b.share > 0.95 - b.starved, b
    set_sm_share(s.path, gpu.uuid(0), 40)
    _burn(p, 2)
    _assert_held(_burn_rec(p, 2), 0.40)


@pytest.mark.parametrize("kind", ["launchex", "coop", "graph"])
def test_every_launch_path_is_governed(cudrive, make_slice, kind):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    _burn(p, 1, kind)
    _assert_held(_burn_rec(p, 3, kind), 0.50)


def test_governed_through_cuGetProcAddress(cudrive, make_slice):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    p.ok("resolve procaddr 12000 0")
    _burn(p, 1)
    _assert_held(_burn_rec(p, 3), 0.50)


def test_killed_process_leaves_nothing_held(cudrive, make_slice):
    s = _sm_slice(make_slice, "team", 50)
    victim, survivor = _burner(cudrive, s.env), _burner(cudrive, s.env)
    victim.send(f"burn launch {KERNEL_NS} 60")  # busy until killed
    _burn(survivor, 1)
    victim.kill9()
    # Within a second the survivor has the slice's whole share to itself.
    _burn(survivor, 1)
    _assert_held(_burn_rec(survivor, 3), 0.50)


def test_utilization_is_published_per_slice_and_process(cudrive, make_slice, gpu):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    b = _burn_rec(p, 2)
    snap = s.snapshot()
    dev = slice_device(snap, gpu.uuid(0))
    low = 40 - 100 * b.starved  # NVML's last sample, of a thread that may have waited for a CPU
    assert low <= dev.sm_util <= 60, (dev, b)
    assert low <= slot_of(snap, p.pid).sm_util[0] <= 60, (snap, b)


@pytest.mark.parametrize(
    "name, value",
    [
        ("CUDA_DEVICE_SM_LIMIT", "150"),
        ("CUDA_DEVICE_SM_LIMIT", "-5"),
        ("CUDA_DEVICE_SM_LIMIT", "50%"),
        ("CUDA_DEVICE_SM_LIMIT", "half"),
        ("CUDA_DEVICE_SM_LIMIT", ""),
        ("CUDA_DEVICE_SM_LIMIT_0", "1e2"),
        ("HAMI_SM_MODE", "soft"),
    ],
)
def test_malformed_share_settings_fail_closed(cudrive, make_slice, name, value):
    s = make_slice(limit=None, overhead="0", **{name: value})
    res = cudrive.run("init", s.env)
    assert res.one("init")["rc"] == CUDA_ERROR_INVALID_VALUE, res.describe()
    lines = res.hami_lines()
    assert any(name in line and f'"{value}"' in line for line in lines), res.describe()


def _schedule_entries(path):
    """(index, key, open_ppm, locked) of the claimed entries of a GPU schedule file."""
    import fcntl
    import os
    import struct

    data = path.read_bytes()
    assert data[:8] == b"HAMISCHD", data[:8]
    fd = os.open(path, os.O_RDONLY)
    try:
        out = []
        for i in range(32):
            key, ppm, state = struct.unpack_from("=QII", data, 64 + 64 * i)
            if state:
                probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 64 + 64 * i, 1, 0)
                held = struct.unpack("hhqqi", fcntl.fcntl(fd, 36, probe))[0] != fcntl.F_UNLCK
                out.append((i, key, ppm, held))
        return out
    finally:
        os.close(fd)


def test_slices_take_turns_on_the_gpu_schedule(cudrive, make_slice, gpu):
    sa, sb = _sm_slice(make_slice, "a", 30), _sm_slice(make_slice, "b", 70)
    pa, pb = _burner(cudrive, sa.env), _burner(cudrive, sb.env)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: _burn(p, 1), (pa, pb)))
    schedule = gpu.state.parent / f"hami-gpu-{gpu.uuid(0)}"
    live = [e for e in _schedule_entries(schedule) if e[3]]
    # One entry per slice, each held while its processes live and showing
    # the length of that slice's window (the second slice's starts after it).
    assert len({key for _, key, _, _ in live}) == 2, live
    assert all(0 < ppm <= 1_000_000 for _, _, ppm, _ in live), live
    pa.kill9()
    pb.kill9()
    assert not [e for e in _schedule_entries(schedule) if e[3]], "entries still held after the slices died"


@pytest.mark.share_accuracy
def test_elastic_slices_under_contention_get_at_least_their_share(cudrive, make_slice):
    # Elastic slices first grow into the idle time, then hand it back: give
    # them 3 s to meet before measuring.
    a, b = _two_slices(cudrive, make_slice, 30, 70, "elastic", settle=3)
    assert a.share >= 0.30 - TOLERANCE - a.starved and b.share >= 0.70 - TOLERANCE - b.starved, (a, b)


@pytest.mark.share_accuracy
def test_a_slice_whose_kernels_outlast_its_window_still_gets_its_share(cudrive, make_slice):
    # Beside another slice, a launch that would run past the window's close
    # first waits for the thread's queued work; with nothing queued it goes
    # however long it runs, or a slice whose kernels outlast its window would
    # starve.
    sa = _sm_slice(make_slice, "long", 20, "hard")   # a 10 ms window of each 50 ms
    sb = _sm_slice(make_slice, "short", 70, "hard")
    pa, pb = _burner(cudrive, sa.env), _burner(cudrive, sb.env)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = ((pa, 8_000_000), (pb, KERNEL_NS))
        list(pool.map(lambda r: _burn(r[0], 2, ns=r[1]), runs))
        a, b = pool.map(lambda r: _burn_rec(r[0], 4, ns=r[1]), runs)
    (ok_a, text_a), (ok_b, text_b) = _held(a, 0.20), _held(b, 0.70)
    assert ok_a and ok_b, f"{text_a}; {text_b}"


def _open_window(slice_path):
    """The slice's open window on GPU 0 (fraction of each period), from its slice file."""
    import ctypes

    from hami_jupyter.slice.layout import DEVICES_OFFSET, HamiSliceDevice

    with open(slice_path, "rb") as f:
        raw = os.pread(f.fileno(), ctypes.sizeof(HamiSliceDevice), DEVICES_OFFSET)
    return HamiSliceDevice.from_buffer_copy(raw).sm_open_ppm / 1e6


@pytest.mark.share_accuracy
def test_an_elastic_window_is_given_back_when_nvml_shows_one_process(cudrive, make_slice):
    # An H100 (driver 580) with two busy slices reported one process only,
    # with the whole device's figure. The slice it showed had grown its
    # window into the idle GPU first and never gave it back (the other got
    # 17.7 % of a 30 % share). The other slice's launches, told in the GPU
    # schedule, must send it back to its share though NVML never shows them.
    one = {"HAMI_SIM_PROCESS_UTIL": "one"}
    sa = _sm_slice(make_slice, "small", 30, "elastic", **one)
    sb = _sm_slice(make_slice, "large", 70, "elastic", **one)
    pa = _burner(cudrive, sa.env)             # alive but idle: NVML shows the newest busy process
    pb = _burner(cudrive, sb.env)
    alone = _burn_rec(pb, 2)                  # alone, the large slice takes the idle GPU
    assert alone.share >= 0.85 - alone.starved and _open_window(sb.path) >= 0.75, (alone, _open_window(sb.path))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: _burn(p, 2), (pa, pb)))
        windows = [_open_window(sb.path)]
        a, b = pool.map(lambda p: _burn_rec(p, 3), (pa, pb))
        windows.append(_open_window(sb.path))
    assert max(windows) <= 0.70 + 0.02, f"the large slice kept its window: {windows}"
    assert a.share >= 0.30 - TOLERANCE - a.starved, (a, b)


# Kernels of 200 us, each followed by 250 us of host work (the pace PyTorch's
# eager mode sets with short kernels): unthrottled, the GPU idles a fifth of
# the time waiting for the host.
PACED_NS, PACED_HOST_NS = 200_000, 250_000


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share_of", ["work", "time"])
def test_a_launch_paced_slice_is_held_to_its_share_of_the_gpus_time(cudrive, make_slice, share_of):
    # The feedback counts what the GPU was busy with the slice's kernels, so
    # a loop that leaves the GPU idle between its launches still gets no more
    # than its share of the GPU's time (and so somewhat more than that share
    # of its own unthrottled work: docs/sm-share.md). Counting its whole
    # window instead, so that it did its share of its own work here, held
    # PyTorch's short kernels at 40-47 % of their work at 50 % on an H100.
    alone = _burn_rec(_burner(cudrive, make_slice(name="free", limit=None, overhead="0").env), 3,
                      ns=PACED_NS, host_ns=PACED_HOST_NS).busy
    assert 0.60 <= alone <= 0.95, f"the loop is not paced by the host as planned: {alone:.2f} busy alone"
    p = _burner(cudrive, _sm_slice(make_slice, "paced", 50, "hard", HAMI_SM_SHARE_OF=share_of).env)
    _burn(p, 2, ns=PACED_NS, host_ns=PACED_HOST_NS)
    ok, text = _held(_burn_rec(p, 4, ns=PACED_NS, host_ns=PACED_HOST_NS), 0.50)
    assert ok, f"{text} ({alone:.2f} busy alone)"


# A notebook's eager PyTorch loop of small layers, as the simulated GPU runs
# it: each launch costs its thread 4 us in the driver (HAMI_SIM_LAUNCH_NS, an
# H100's cuLaunchKernel) and 5 us of the framework's own work, and a layer is
# a 20 us kernel (a matmul) then two of 5 us (relu, bias). The host, not the
# GPU, sets the pace, and the GPU idles part of the time even alone (u, about
# 0.85 here, 0.77 to 0.99 for bench/sm_share.py's short kernels on an H100
# and an H200). A training step of a small conv net instead mixes kernels of
# 5 to 300 us and ends every 10 ms or so with a wait for the GPU (a loss read
# back), where the GPU idles while the host catches up.
LAUNCH_NS = 4_000
LOOPS = {
    "eager": ("20000,5000,5000", 5_000, 64),
    "conv": ("300000,20000,20000,5000,5000,100000,10000,10000", 5_000, 170),
}


def _loop(p, loop, seconds):
    """A Burn of SECONDS of LOOP (one of LOOPS)."""
    cycle, host_ns, sync_every = LOOPS[loop]
    return _burn_rec(p, seconds, ns=cycle, host_ns=host_ns, sync_every=sync_every)


@pytest.mark.share_accuracy
@pytest.mark.parametrize("loop, share", [("eager", 25), ("eager", 50), ("eager", 75), ("conv", 75)])
def test_a_launch_bound_loop_keeps_its_share_of_its_own_pace(cudrive, make_slice, loop, share):
    # A share caps the GPU time the slice keeps busy: a loop busy u of the
    # time alone keeps min(1, s/u) of its pace, never less (issue 34). Its
    # kernels are shorter than a sleep overshoots (70 us on this host), and
    # the library's wait for its launch queue slept: on an H100 these loops
    # kept 24 % of their pace at 50 % (57 % due) and 53 % at 75 % (86 %).
    # At 75 % such a loop keeps the GPU busy about its share by itself: when
    # it ran free and went over, its window started again from the share and
    # took a second to open again (an H200: 84 % of its pace where 98 % was
    # due, 1-s windows from 72.7 to 97.4 %); and held to two launches ahead
    # even in a window open all but fully, these loops lost 11 to 17 %
    # (eager) and 8 to 28 % (conv) of their pace here, which a high share
    # could not make up for. Paces and u count the time the loop's thread
    # could run: measured by wall time, the same loop before and after moved
    # with the host's load by more than the tolerance (0.834 of its pace
    # where 0.866 was due while another process spun).
    env = {"HAMI_SIM_LAUNCH_NS": LAUNCH_NS}
    free = _burner(cudrive, make_slice(name="free", limit=None, overhead="0", **env).env)
    before = _loop(free, loop, 2)
    p = _burner(cudrive, _sm_slice(make_slice, "short", share, "hard", **env).env)
    _loop(p, loop, 2)  # the controller settles
    windows = [_loop(p, loop, 1) for _ in range(4)]
    after = _loop(free, loop, 2)
    pace, u = (before.pace + after.pace) / 2, (before.busy + after.busy) / 2
    due = min(1.0, share / 100 / u)
    got = [w.pace / pace for w in windows]
    mean = sum(got) / len(got)
    detail = (f"{mean:.3f} of its pace, 1-s windows {[round(g, 3) for g in got]}, due {due:.3f} (u {u:.2f}); "
              f"busy {[round(w.share, 3) for w in windows]}; waited for a CPU "
              f"{[round(b.starved, 2) for b in (before, *windows, after)]}")
    assert mean >= due - TOLERANCE, detail
    assert all(g >= due - 2 * TOLERANCE for g in got), detail
    # and never more than its share of the GPU's time (a 1-s window 10 points)
    assert sum(w.share for w in windows) / len(windows) <= share / 100 + TOLERANCE, detail
    assert all(w.share <= share / 100 + 2 * TOLERANCE for w in windows), detail


def _gpu_windows(gpu, width_s=0.1, device=0):
    """[(start, busy share)] of every width_s window of the last 10 s, from the
    simulated GPU's own record of what it ran (``hami-simctl busy``: busy ns per
    50-ms slot), windows aligned on CLOCK_MONOTONIC, start in s (time.monotonic())."""
    import json

    rec = json.loads(gpu.simctl("busy"))
    slot = rec["slot_ns"]
    per = int(round(width_s * 1e9 / slot))
    busy, first = rec["devices"][device], rec["first_ns"] // slot
    skip = (-first) % per  # the first slot that starts a window
    return [((first + i) * slot / 1e9, sum(busy[i:i + per]) / (per * slot))
            for i in range(skip, len(busy) - per + 1, per)]


def _before_a_sample_ends(ahead=0.03):
    """Sleep until AHEAD s before the simulated GPU's next NVML sample period
    ends (periods of 200 ms on CLOCK_MONOTONIC); return that time. A change
    made then leaves the next sample the controller reads all the old share's."""
    now = time.monotonic()
    at = math.ceil((now + ahead) / 0.2) * 0.2 - ahead
    time.sleep(max(0.0, at - now))
    return time.monotonic()


@pytest.mark.share_accuracy
def test_a_live_change_lands_within_a_tenth_of_a_second(cudrive, make_slice, gpu):
    # After a change from 25 to 75 % and back, every 100-ms window from 100 ms
    # after the change is to be within 5 points of the new share. On an H200 the
    # controller took samples that still covered the old share for the new
    # one's: the first windows after 25 -> 75 ran at 90, 89, 87, 86, 82 %
    # (and here 75 -> 25 fell to 3 %).
    from hami_jupyter.slice.change import set_sm_share

    s = _sm_slice(make_slice, "team", 25)
    p = _burner(cudrive, s.env)
    _burn(p, 2)  # settled at 25 %
    trace = _WaitTrace(p.pid)
    trace.start()
    p.send(f"burn launch {KERNEL_NS} 5.5 64")
    time.sleep(1.5)
    up = _before_a_sample_ends()
    set_sm_share(s.path, gpu.uuid(0), 75)
    time.sleep(1.8)
    down = _before_a_sample_ends()
    set_sm_share(s.path, gpu.uuid(0), 25)
    rec = p.read(timeout=30)
    trace.stop.set()
    trace.join()
    assert rec["rc"] == 0, rec
    end = time.monotonic() - 0.2  # the burn's last kernels drain
    windows = [(t, b, trace.part(t, t + 0.1)) for t, b in _gpu_windows(gpu) if up - 0.3 <= t <= end]
    # The second after each change is where credit carried over shows: on
    # average it is within 5 points of the new share (below it, less the part
    # of the time the host kept from the burner), and no 100-ms window is
    # more than 10 over it; the carried-over credit broke both by far. A
    # loaded two-core host moves single windows further, mostly down (the
    # burner keeps 3 ms of kernels queued, and a sleep there once ended 75 ms
    # late): bench/sm_share.py holds the GPU to 5 points in every window. A
    # controller that made up for a host that kept the burner short may run
    # over when the host frees up, which is no part of the change: a window
    # after a second (since the change) short by more than 2.5 points on
    # average (marked *) is not held to the upper bound.
    checks, shown = [], []
    for name, at, until, share in (("25 -> 75", up, down, 0.75), ("75 -> 25", down, end, 0.25)):
        second = []
        for t, b, w in windows:
            if at + 0.1 <= t and t + 0.1 <= min(until, at + 1.1):
                before = [share - b2 for t2, b2, _w in windows if at + 0.1 <= t2 and t - 1.0 <= t2 < t]
                second.append((b, w, bool(before) and sum(before) / len(before) > TOLERANCE / 2))
        checks.append((name, share, second))
        shown.append(f"{name}: " + " ".join(f"{b:.2f}" + (f"(host {w:.2f})" if w >= 0.01 else "") +
                                            ("*" if made_up else "") for b, w, made_up in second))
    shown = "; ".join(shown)
    for name, share, second in checks:
        assert len(second) >= 9, f"{name}: {shown}"
        mean, waited = (sum(x) / len(second) for x in list(zip(*second))[:2])
        fed = [b for b, _w, made_up in second if not made_up]
        detail = f"{name}: {mean:.3f} on average; the second after each change in 100-ms windows: {shown}"
        assert mean >= share - TOLERANCE - waited, detail
        assert not fed or sum(fed) / len(fed) <= share + TOLERANCE, detail
        assert all(b <= share + 2 * TOLERANCE for b in fed), detail


@pytest.mark.share_accuracy
def test_a_hard_share_is_of_the_gpus_time_whatever_its_power_says(cudrive, make_slice):
    # A power-capped GPU busy part of the time clocks higher than under full
    # load. The share promises busy time, and a slice keeps what the boost
    # gives it; weighing busy time by a speed-up read from power (the default
    # before, HAMI_SM_SHARE_OF=work now) held slices below their share of
    # the GPU's time wherever power misjudged their work. Here the simulated
    # GPU's power (100 W idle, 900 W at full load, capped at 700 W) reads as
    # a speed-up of about 1.14 at 75 %, and its kernels get none.
    power = {"HAMI_SIM_POWER": "100,900,700"}
    p = _burner(cudrive, _sm_slice(make_slice, "time", 75, "hard", **power).env)
    _burn(p, 2)
    _assert_held(_burn_rec(p, 3), 0.75)
    p.close()
    w = _burner(cudrive, _sm_slice(make_slice, "work", 75, "hard", HAMI_SM_SHARE_OF="work", **power).env)
    _burn(w, 2)
    weighed = _burn(w, 3)
    assert weighed <= 0.75 - TOLERANCE, f"weighed by the speed-up: {weighed:.3f} of the GPU's time"


def _cpu_seconds(pid):
    """CPU time (user + system) process PID has used, all its threads, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_waiting_for_long_kernels_costs_little_cpu(cudrive, make_slice):
    # Beside another slice, a launch that would not end before its window
    # closes first waits for the thread's queued kernel. That wait looked at
    # the kernel again and again without sleeping, from the start when it
    # could not foresee the kernel's end (after every closed window): a loop
    # of 20-ms kernels at 50 % kept a whole core busy (0.81 of its wall time
    # on this host). A late wake-up costs such kernels a small part of their
    # time: only short ones are worth a spin.
    kernel_ms = 20
    long = _burner(cudrive, _sm_slice(make_slice, "long", 50).env)
    other = _burner(cudrive, _sm_slice(make_slice, "other", 30).env)
    other.send(f"burn launch {KERNEL_NS} 7 64")
    _burn(long, 1, ns=kernel_ms * 1_000_000)
    cpu, wall = _cpu_seconds(long.pid), time.monotonic()
    _burn(long, 4, ns=kernel_ms * 1_000_000)
    cpu, wall = _cpu_seconds(long.pid) - cpu, time.monotonic() - wall
    assert other.read(timeout=30)["rc"] == 0
    assert cpu <= 0.3 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s waiting for {kernel_ms}-ms kernels"
