"""64 processes of one slice race for memory at a 1 GiB cap, released at one instant.

Contexts cost nothing here (the simulated GPU's and the slice's context charge
are both 0), so every byte the simulator hands out is an allocation the race
decided. The processes are stopped (SIGSTOP) while their commands are queued
and resumed together (SIGCONT), so they start within about a millisecond of
each other. Round 1: each process fills the slice with allocations of its own
size until refused, all holding what they got. Round 2: all of them run a
random alloc/free mix at once. The simulator (the independent witness) must
never have handed the 64 processes more than the cap together.
"""

import random

from adversarial_helpers import frozen, sim_live_used
from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, allocation_footprint, slice_device

PROCESSES = 64
CAP = GiB
SIZES_MIB = (1, 2, 3, 5, 7, 11, 16)
MIX_ITERATIONS = 3000


def test_64_processes_racing_at_the_cap(cudrive, make_slice, gpu, seed, report, tmp_path):
    base_seed, rng_seed = seed
    rng = random.Random(rng_seed)
    report(f"seed {base_seed} (HAMI_ADVERSARIAL_SEED), stream {rng_seed}")
    s = make_slice(limit="1g", overhead="0", HAMI_SIM_CONTEXT_BYTES="0")
    procs = []
    for _ in range(PROCESSES):
        p = cudrive.start(s.env)
        procs.append(p)
        p.send("init")
        p.send("ctx 0")
    for p in procs:
        assert p.read()["rc"] == 0 and p.read()["rc"] == 0, p.stderr()[-3000:]
    pids = [p.pid for p in procs]
    gpu.reset_peak()
    sizes = {}
    with frozen(pids):
        for p in procs:
            sizes[p.pid] = rng.choice(SIZES_MIB) * MiB
            p.send(f"fill {sizes[p.pid]}")
    got = {}
    for p in procs:
        rec = p.read(timeout=60)
        assert rec["op"] == "fill" and rec["last_rc"] == CUDA_ERROR_OUT_OF_MEMORY, \
            f"process {p.pid} stopped on something else than the cap: {rec}\n{p.stderr()[-3000:]}"
        got[p.pid] = rec["bytes"]
    with frozen(pids):
        status = gpu.status()
    real = sim_live_used(status, 0)
    total = sum(got.values())
    peak1 = gpu.peak(0)
    assert total <= CAP and real <= CAP and peak1 <= CAP, \
        f"round 1: the processes got {total} bytes (simulator: {real}, peak {peak1}) at a {CAP}-byte cap"
    # Full to within the largest of the sizes still asked for: the cap, not luck,
    # stopped them. (Under the fast park an allocation takes its size rounded up
    # to 2 MiB, and is charged that.)
    taken = sum(got[pid] // sizes[pid] * allocation_footprint(sizes[pid]) for pid in got)
    assert taken > CAP - max(allocation_footprint(v) for v in sizes.values()), \
        f"round 1: only {total} bytes handed out ({taken} taken)"
    winners = sum(1 for v in got.values() if v)

    # Round 2: everyone frees, then all run the random mix at once.
    for p in procs:
        assert p.cmd("freeall")["rc"] == 0
    gpu.reset_peak()
    with frozen(pids):
        for p in procs:
            p.send(f"race {MIX_ITERATIONS} 64m {rng.randrange(1 << 30)}")
    ok = oom = 0
    for p in procs:
        rec = p.read(timeout=120)
        assert rec["op"] == "race" and rec["other"] == 0 and rec["free_failed"] == 0, \
            f"process {p.pid}: {rec}\n{p.stderr()[-3000:]}"
        ok += rec["ok"]
        oom += rec["oom"]
    peak2 = gpu.peak(0)
    slice_peak = slice_device(s.snapshot(), gpu.uuid(0)).memory_peak
    assert peak2 <= CAP, f"round 2: the simulator's peak {peak2} bytes is over the {CAP}-byte cap"
    assert slice_peak <= CAP, f"round 2: the slice's peak {slice_peak} bytes is over the {CAP}-byte cap"
    assert oom > 0, "round 2 never reached the cap"
    for p in procs:
        assert p.close(timeout=30) == 0, p.stderr()[-3000:]
    report(f"{PROCESSES} processes, cap {CAP // MiB} MiB; round 1 (fill, sizes {SIZES_MIB} MiB): "
           f"{winners} got memory, {total // MiB} MiB handed out, simulator {real // MiB} MiB, "
           f"peak {peak1 // MiB} MiB")
    report(f"round 2 (random mix): {ok} allocations, {oom} refused at the cap, simulator peak "
           f"{peak2 // MiB} MiB, slice peak {slice_peak // MiB} MiB; fail-open 0")
