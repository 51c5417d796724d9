"""The SM share on the simulated GPU: achieved share, modes, live changes, every launch path.

The simulated GPU runs kernels one after another on a device timeline shared
by all processes, and NVML reports per-process utilization in 200 ms samples
like the real driver. `cudrive burn KIND NS SECONDS` launches NS-long kernels
for SECONDS and reports the share of that wall time its kernels occupied the
GPU, which is what a user of the slice gets.
"""

import concurrent.futures
import os
import time

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, slice_device, slot_of

KERNEL_NS = 1_000_000  # 1 ms kernels
TOLERANCE = 0.05       # +-5 points on the simulated GPU (a shared 2-core CI machine)


def _burner(cudrive, env, device=0):
    p = cudrive.start(env)
    p.ok("init")
    p.ok(f"ctx {device}")
    return p


def _burn(p, seconds, kind="launch", ns=KERNEL_NS, host_ns=0):
    rec = p.ok(f"burn {kind} {ns} {seconds} 64 {host_ns}", timeout=seconds + 30)
    assert rec["launches"] > 0, rec
    return rec["share"]


def _sm_slice(make_slice, name, share, mode=None, **extra):
    env = {"CUDA_DEVICE_SM_LIMIT": share}
    if mode:
        env["HAMI_SM_MODE"] = mode
    return make_slice(name=name, limit=None, overhead="0", **env, **extra)


def test_no_share_runs_free(cudrive, make_slice):
    s = make_slice(limit=None, overhead="0")
    assert _burn(_burner(cudrive, s.env), 2) > 0.95


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share", [25, 50, 75])
def test_one_process_gets_its_share(cudrive, make_slice, share):
    s = _sm_slice(make_slice, "team", share)
    p = _burner(cudrive, s.env)
    _burn(p, 1)  # the controller settles (the first sample comes after 200 ms)
    got = _burn(p, 4)
    assert abs(got - share / 100) <= TOLERANCE, got


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share", [25, 50, 75])
def test_four_processes_share_one_budget(cudrive, make_slice, share):
    s = _sm_slice(make_slice, "team", share)
    procs = [_burner(cudrive, s.env) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: _burn(p, 1), procs))
        shares = list(pool.map(lambda p: _burn(p, 4), procs))
    assert abs(sum(shares) - share / 100) <= TOLERANCE, shares


def _two_slices(cudrive, make_slice, a, b, mode, settle=1):
    """Two slices, one burning process each, measured together."""
    sa = _sm_slice(make_slice, "a", a, mode)
    sb = _sm_slice(make_slice, "b", b, mode)
    pa, pb = _burner(cudrive, sa.env), _burner(cudrive, sb.env)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: _burn(p, settle), (pa, pb)))
        return list(pool.map(lambda p: _burn(p, 4), (pa, pb)))


@pytest.mark.share_accuracy
def test_hard_slices_each_get_their_share(cudrive, make_slice):
    got_a, got_b = _two_slices(cudrive, make_slice, 30, 70, "hard")
    assert abs(got_a - 0.30) <= TOLERANCE and abs(got_b - 0.70) <= TOLERANCE, (got_a, got_b)


@pytest.mark.share_accuracy
def test_elastic_slice_takes_idle_time_hard_does_not(cudrive, make_slice):
    elastic = _burner(cudrive, _sm_slice(make_slice, "e", 30, "elastic").env)
    _burn(elastic, 2)
    assert _burn(elastic, 3) >= 0.90
    elastic.close()
    hard = _burner(cudrive, _sm_slice(make_slice, "h", 30, "hard").env)
    _burn(hard, 1)
    assert abs(_burn(hard, 3) - 0.30) <= TOLERANCE


@pytest.mark.share_accuracy
def test_share_changes_live_up_and_down(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_sm_share

    s = _sm_slice(make_slice, "team", 25)
    p = _burner(cudrive, s.env)
    _burn(p, 1)
    assert abs(_burn(p, 2) - 0.25) <= TOLERANCE
    set_sm_share(s.path, gpu.uuid(0), 75)
    _burn(p, 2)  # the bound: settled within 2 s
    assert abs(_burn(p, 2) - 0.75) <= TOLERANCE
    set_sm_share(s.path, gpu.uuid(0), 25)
    _burn(p, 2)
    assert abs(_burn(p, 2) - 0.25) <= TOLERANCE
    set_sm_share(s.path, gpu.uuid(0), 0)  # lifted
    _burn(p, 1)
    assert _burn(p, 2) > 0.95


@pytest.mark.share_accuracy
def test_share_set_on_a_slice_that_had_none(cudrive, make_slice, gpu):
    from hami_jupyter.slice.change import set_sm_share

    s = make_slice(limit=None, overhead="0")
    p = _burner(cudrive, s.env)
    assert _burn(p, 1) > 0.95
    set_sm_share(s.path, gpu.uuid(0), 40)
    _burn(p, 2)
    assert abs(_burn(p, 2) - 0.40) <= TOLERANCE


@pytest.mark.parametrize("kind", ["launchex", "coop", "graph"])
def test_every_launch_path_is_governed(cudrive, make_slice, kind):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    _burn(p, 1, kind)
    assert abs(_burn(p, 3, kind) - 0.50) <= TOLERANCE


def test_governed_through_cuGetProcAddress(cudrive, make_slice):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    p.ok("resolve procaddr 12000 0")
    _burn(p, 1)
    assert abs(_burn(p, 3) - 0.50) <= TOLERANCE


def test_killed_process_leaves_nothing_held(cudrive, make_slice):
    s = _sm_slice(make_slice, "team", 50)
    victim, survivor = _burner(cudrive, s.env), _burner(cudrive, s.env)
    victim.send(f"burn launch {KERNEL_NS} 60")  # busy until killed
    _burn(survivor, 1)
    victim.kill9()
    # Within a second the survivor has the slice's whole share to itself.
    _burn(survivor, 1)
    assert abs(_burn(survivor, 3) - 0.50) <= TOLERANCE


def test_utilization_is_published_per_slice_and_process(cudrive, make_slice, gpu):
    s = _sm_slice(make_slice, "team", 50)
    p = _burner(cudrive, s.env)
    _burn(p, 2)
    snap = s.snapshot()
    dev = slice_device(snap, gpu.uuid(0))
    assert abs(dev.sm_util - 50) <= 10, dev
    assert abs(slot_of(snap, p.pid).sm_util[0] - 50) <= 10, snap


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
    got_a, got_b = _two_slices(cudrive, make_slice, 30, 70, "elastic", settle=3)
    assert got_a >= 0.30 - TOLERANCE and got_b >= 0.70 - TOLERANCE, (got_a, got_b)


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
        got_a, got_b = pool.map(lambda r: _burn(r[0], 4, ns=r[1]), runs)
    assert abs(got_a - 0.20) <= TOLERANCE and abs(got_b - 0.70) <= TOLERANCE, (got_a, got_b)


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
    assert _burn(pb, 2) >= 0.85               # alone, the large slice takes the idle GPU
    assert _open_window(sb.path) >= 0.85
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: _burn(p, 2), (pa, pb)))
        windows = [_open_window(sb.path)]
        got_a, got_b = pool.map(lambda p: _burn(p, 3), (pa, pb))
        windows.append(_open_window(sb.path))
    assert max(windows) <= 0.70 + 0.02, f"the large slice kept its window: {windows}"
    assert got_a >= 0.30 - TOLERANCE, (got_a, got_b)


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
    alone = _burn(_burner(cudrive, make_slice(name="free", limit=None, overhead="0").env), 3,
                  ns=PACED_NS, host_ns=PACED_HOST_NS)
    assert 0.60 <= alone <= 0.92, f"the loop is not paced by the host as planned: {alone:.2f} busy alone"
    p = _burner(cudrive, _sm_slice(make_slice, "paced", 50, "hard", HAMI_SM_SHARE_OF=share_of).env)
    _burn(p, 2, ns=PACED_NS, host_ns=PACED_HOST_NS)
    got = _burn(p, 4, ns=PACED_NS, host_ns=PACED_HOST_NS)
    assert abs(got - 0.50) <= TOLERANCE, f"{got:.3f} of the GPU's time at a 50 % share ({alone:.2f} alone)"


# A notebook's eager PyTorch loop of small layers, as the simulated GPU runs
# it: each launch costs its thread 4 us in the driver (HAMI_SIM_LAUNCH_NS, an
# H100's cuLaunchKernel) and 5 us of the framework's own work, and a layer is
# a 20 us kernel (a matmul) then two of 5 us (relu, bias). The host, not the
# GPU, sets the pace, and the GPU idles part of the time even alone (u, about
# 0.85 here on a quiet host, 0.77 to 0.99 for bench/sm_share.py's short
# kernels on an H100 and an H200).
SHORT_CYCLE, SHORT_HOST_NS, LAUNCH_NS = "20000,5000,5000", 5_000, 4_000


def _short_pace(p, seconds):
    """(launches per second, GPU busy share) of SECONDS of the short-kernel loop."""
    rec = p.ok(f"burn launch {SHORT_CYCLE} {seconds} 64 {SHORT_HOST_NS}", timeout=seconds + 30)
    assert rec["launches"] > 0, rec
    return rec["launches"] * 1e9 / rec["elapsed_ns"], rec["share"]


def _together(procs, seconds):
    """_short_pace of every process in PROCS over the same SECONDS."""
    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        return list(pool.map(lambda p: _short_pace(p, seconds), procs))


@pytest.mark.share_accuracy
@pytest.mark.parametrize("share", [25, 50, 75])
def test_a_launch_bound_loop_keeps_its_share_of_its_own_pace(cudrive, make_slice, share):
    # A share caps the GPU time the slice keeps busy: a loop busy u of the
    # time alone keeps min(1, s/u) of its pace, never less (issue 34). Its
    # kernels are shorter than a sleep overshoots (70 us on this host), and
    # the library's wait for its launch queue slept: on an H100 these loops
    # kept 24 % of their pace at 50 % (57 % due) and 53 % at 75 % (86 %).
    # At 75 % such a loop keeps the GPU busy about its share by itself: when
    # it ran free and went over, its window started again from the share and
    # took a second to open again (an H200: 84 % of its pace where 98 % was
    # due, 1-s windows from 72.7 to 97.4 %).
    # Its own pace is the same loop's without a share on the second GPU,
    # measured over the same seconds: a loaded two-core host moves both alike
    # (measured before and after instead, it once gave 0.834 of the pace
    # where 0.866 was due while another process spun).
    free = _burner(cudrive, make_slice(name="free", limit=None, overhead="0", HAMI_SIM_LAUNCH_NS=LAUNCH_NS).env,
                   device=1)
    p = _burner(cudrive, _sm_slice(make_slice, "short", share, "hard", HAMI_SIM_LAUNCH_NS=LAUNCH_NS).env)
    _together([p, free], 2)  # the controller settles
    seconds = [_together([p, free], 1) for _ in range(4)]
    got = [mine[0] / alone[0] for mine, alone in seconds]
    due = [min(1.0, share / 100 / alone[1]) for _mine, alone in seconds]
    busy = [mine[1] for mine, _alone in seconds]
    mean, mean_due = sum(got) / len(got), sum(due) / len(due)
    detail = (f"{mean:.3f} of its pace, 1-s windows {[round(g, 3) for g in got]}, due {[round(d, 3) for d in due]} "
              f"(u {[round(alone[1], 2) for _m, alone in seconds]}), busy {[round(b, 3) for b in busy]}")
    assert mean >= mean_due - TOLERANCE, detail
    assert all(g >= d - 2 * TOLERANCE for g, d in zip(got, due)), detail
    assert all(b <= share / 100 + TOLERANCE for b in busy), detail


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


@pytest.mark.share_accuracy
def test_a_live_change_lands_within_a_tenth_of_a_second(cudrive, make_slice, gpu):
    # After a change from 25 to 75 % and back, every 100-ms window from 100 ms
    # after the change is within 5 points of the new share. On an H200 the
    # controller took samples that still covered the old share for the new
    # one's: the first windows after 25 -> 75 ran at 90, 89, 87, 86, 82 %.
    from hami_jupyter.slice.change import set_sm_share

    s = _sm_slice(make_slice, "team", 25)
    p = _burner(cudrive, s.env)
    _burn(p, 2)  # settled at 25 %
    p.send(f"burn launch {KERNEL_NS} 5.5 64")
    time.sleep(1.5)
    up = time.monotonic()
    set_sm_share(s.path, gpu.uuid(0), 75)
    time.sleep(2)
    down = time.monotonic()
    set_sm_share(s.path, gpu.uuid(0), 25)
    rec = p.read(timeout=30)
    assert rec["rc"] == 0, rec
    end = time.monotonic() - 0.2  # the burn's last kernels drain
    windows = _gpu_windows(gpu)
    after_up = [(t, b) for t, b in windows if up + 0.1 <= t and t + 0.1 <= down]
    after_down = [(t, b) for t, b in windows if down + 0.1 <= t and t + 0.1 <= end]
    shown = " ".join(f"{b:.2f}" for t, b in windows if t >= up - 0.3 and t <= end)
    assert len(after_up) >= 15 and len(after_down) >= 15, shown
    assert all(abs(b - 0.75) <= TOLERANCE for _, b in after_up), f"25 -> 75 at {up:.2f}: {shown}"
    assert all(abs(b - 0.25) <= TOLERANCE for _, b in after_down), f"75 -> 25 at {down:.2f}: {shown}"


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
    got = _burn(p, 3)
    p.close()
    assert abs(got - 0.75) <= TOLERANCE, f"{got:.3f} of the GPU's time at a 75 % share"
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
