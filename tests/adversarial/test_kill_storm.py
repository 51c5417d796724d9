"""Kill storm: processes of one slice allocate and free at its cap while SIGKILL rains on them.

Victims (cudrive running an endless random alloc/free mix in one slice with a
1 GiB cap) are killed at random moments, from their first millisecond (inside
cuInit, while claiming a slot or a GPU entry) to deep in the loop, and
replaced at once, HAMI_ADVERSARIAL_KILLS times (1,000 by default). Survivors in
the same slice run the same mix the whole time and must never see anything
but success or CUDA_ERROR_OUT_OF_MEMORY.

Ground truth is the simulated GPU (``hami-simctl status``: what its live
processes really hold). At sampled moments every process is stopped, so the
slice file and the simulator are read at one instant: the slice's charge never
exceeds the cap, the live processes' real usage never exceeds the cap, and the
charge is never below the sum of the live processes' shares. At the end the
survivors still work, and once everyone is gone the slice is back at 0.
"""

import os
import random
import signal
import subprocess
import time

from adversarial_helpers import frozen, sanitizer_report, sim_live_used
from native_helpers import GiB, MiB, slice_device, wait_for

KILLS = int(os.environ.get("HAMI_ADVERSARIAL_KILLS", "1000"))
VICTIMS = 6          # victims alive at once
SURVIVORS = 3
CAP = GiB
MAX_ALLOC = "64m"    # each process keeps up to 32 allocations of up to this: all of them press on the cap
SAMPLE_EVERY = 50    # kills between two frozen samples
EARLY = 0.15         # share of victims killed within their first 3 ms (start-up paths)
LATEST_KILL_S = 0.04
# 150 s for the default 1,000 kills; a longer storm (HAMI_ADVERSARIAL_KILLS) gets as long again per 1,000.
STORM_BUDGET_S = 150 * max(1.0, KILLS / 1000)


def _live_slot_sum(snap, dev):
    return sum(slot.memory_used.get(dev.index, 0) for slot in snap.slots)


def test_kill_storm_never_passes_the_cap(cudrive, make_slice, gpu, seed, report, tmp_path):
    base_seed, rng_seed = seed
    rng = random.Random(rng_seed)
    report(f"seed {base_seed} (HAMI_ADVERSARIAL_SEED), stream {rng_seed}")
    s = make_slice(limit="1g", overhead="64m")
    uuid = gpu.uuid(0)

    survivors = []
    for _ in range(SURVIVORS):
        p = cudrive.start(s.env)
        p.ok("init")
        p.ok("ctx 0")
        survivors.append(p)
    busy = {p.pid: False for p in survivors}
    survivor_ops = {"rounds": 0, "ok": 0, "oom": 0}

    def serve_survivors():
        for p in survivors:
            if busy[p.pid] and p.ready():
                rec = p.read(timeout=10)
                busy[p.pid] = False
                assert rec["op"] == "race" and rec["rc"] == 0, rec
                assert rec["other"] == 0 and rec["free_failed"] == 0, \
                    f"survivor {p.pid}: an error other than out-of-memory: {rec}\n{p.stderr()[-3000:]}"
                survivor_ops["rounds"] += 1
                survivor_ops["ok"] += rec["ok"]
                survivor_ops["oom"] += rec["oom"]
            if not busy[p.pid]:
                assert p.alive(), f"survivor {p.pid} died: {p.stderr()[-3000:]}"
                p.send(f"race 400 {MAX_ALLOC} {rng.randrange(1 << 30)}")
                busy[p.pid] = True

    victim_err_path = tmp_path / "victims.stderr"
    victim_err = open(victim_err_path, "ab")
    victims = {}  # pid -> (Popen, kill time)
    counts = {"kills": 0, "early": 0, "late": 0, "spawned": 0, "samples": 0}
    worst = {"slice_used": 0, "sim_live": 0, "sim_device": 0}

    def spawn():
        argv = [str(cudrive.path), "init", "ctx", "0", "race", "1000000000", MAX_ALLOC, str(rng.randrange(1 << 30))]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=victim_err,
                                env=s.env, start_new_session=True)
        early = rng.random() < EARLY
        delay = rng.uniform(0, 0.003) if early else rng.uniform(0.003, LATEST_KILL_S)
        victims[proc.pid] = (proc, time.monotonic() + delay, early)
        counts["spawned"] += 1

    def kill(pid):
        proc, _, early = victims.pop(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rc = proc.wait(timeout=10)
        assert rc == -signal.SIGKILL, f"victim {pid} ended by itself with {rc} before it was killed"
        counts["kills"] += 1
        counts["early" if early else "late"] += 1

    def sample():
        pids = list(victims) + [p.pid for p in survivors]
        with frozen(pids):
            status = gpu.status()
            snap = s.snapshot()
        dev = slice_device(snap, uuid)
        charged = dev.memory_used if dev else 0
        live_slots = _live_slot_sum(snap, dev) if dev else 0
        real = sim_live_used(status, 0)
        counts["samples"] += 1
        worst["slice_used"] = max(worst["slice_used"], charged)
        worst["sim_live"] = max(worst["sim_live"], real)
        worst["sim_device"] = max(worst["sim_device"], status["devices"][0]["used"])
        where = f"after {counts['kills']} kills"
        assert charged <= CAP, f"{where}: the slice charges {charged} bytes, over its {CAP}-byte cap"
        slots = {slot.pid: slot.memory_used.get(0, 0) for slot in snap.slots}
        stale = {slot.pid: slot.memory_used.get(0, 0) for slot in snap.stale_slots}
        assert real <= CAP, (f"{where}: the simulated GPU's live processes hold {real} bytes, over the "
                             f"{CAP}-byte cap: {status['processes']}; the slice charges {charged}, "
                             f"live slots {slots}, stale slots {stale}")
        assert live_slots <= charged, (f"{where}: the live slots hold {live_slots} bytes but the slice "
                                       f"charges only {charged}: an under-count")

    started = time.monotonic()
    try:
        for _ in range(VICTIMS):
            spawn()
        while counts["kills"] < KILLS:
            assert time.monotonic() - started < STORM_BUDGET_S, \
                f"the storm took over {STORM_BUDGET_S} s ({counts['kills']} kills)"
            pid = min(victims, key=lambda k: victims[k][1])
            wait = victims[pid][1] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            kill(pid)
            spawn()
            serve_survivors()
            if counts["kills"] % SAMPLE_EVERY == 0:
                sample()
        sample()
    finally:
        for pid in list(victims):
            kill(pid)
        victim_err.close()
    storm_s = time.monotonic() - started

    # The survivors lived through it all and still work.
    for p in survivors:
        if busy[p.pid]:
            rec = p.read(timeout=30)
            assert rec["rc"] == 0 and rec["other"] == 0 and rec["free_failed"] == 0, rec
            survivor_ops["rounds"] += 1
            survivor_ops["ok"] += rec["ok"]
            survivor_ops["oom"] += rec["oom"]
        assert p.alive(), f"survivor {p.pid} died: {p.stderr()[-3000:]}"
        p.ok("alloc 64m")
        assert p.ok("meminfo")["total"] == CAP
    assert survivor_ops["ok"] > 0 and survivor_ops["oom"] > 0, survivor_ops  # they did work at the cap
    for p in survivors:
        assert p.close(timeout=30) == 0, p.stderr()[-3000:]

    # Nobody left: one passing process sweeps what the dead left, and the slice is back at 0.
    def back_to_zero():
        cudrive.run("init ctx 0 sleep 120", s.env, timeout=30)
        snap = s.snapshot()
        dev = slice_device(snap, uuid)
        return dev.memory_used == 0 and not snap.slots and not snap.stale_slots
    try:
        wait_for(back_to_zero, timeout=10, interval=0.05, what="the slice back at 0 used")
    except AssertionError:
        snap = s.snapshot()
        raise AssertionError(f"the slice did not come back to 0: {slice_device(snap, uuid)}, "
                             f"stale slots {snap.stale_slots}") from None
    status = gpu.status()
    assert sim_live_used(status, 0) == 0, status["processes"]
    peak = slice_device(s.snapshot(), uuid).memory_peak
    assert peak <= CAP, f"the slice's charge peaked at {peak} bytes, over its {CAP}-byte cap"

    stderr = victim_err_path.read_text(errors="replace")
    assert not sanitizer_report(stderr), f"a victim's sanitizer report:\n{stderr[-6000:]}"
    report(f"{counts['kills']} kills ({counts['early']} within 3 ms of start, {counts['late']} later), "
           f"{counts['spawned']} victims started, {VICTIMS} at a time, in {storm_s:.1f} s")
    report(f"{len(survivors)} survivors of {len(survivors)}: {survivor_ops['rounds']} rounds, "
           f"{survivor_ops['ok']} allocations, {survivor_ops['oom']} refused at the cap")
    report(f"{counts['samples']} frozen samples: highest slice charge {worst['slice_used'] / MiB:.0f} MiB, "
           f"highest real use of live processes {worst['sim_live'] / MiB:.0f} MiB "
           f"(cap {CAP / MiB:.0f} MiB); slice peak {peak / MiB:.0f} MiB; "
           f"sim device counter highest {worst['sim_device'] / MiB:.0f} MiB, "
           f"now {status['devices'][0]['used'] / MiB:.0f} MiB; fail-open 0")
