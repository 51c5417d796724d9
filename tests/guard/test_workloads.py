"""Honest work is never touched: 100 random workloads within their caps.

Processes with and without the preload library, in several slices with
different caps, on both GPUs, each holding a random amount of memory chosen
so that every slice stays within its cap on every GPU. The guard runs with
``--action kill`` the whole time. Nothing may be ended, warned about or
shown over, and the report must charge every process's real bytes to its
slice.
"""

import os
import random

from guard_helpers import CONTEXT, MiB, audit_records
from native_helpers import allocation_footprint

SEED = int(os.environ.get("HAMI_GUARD_SEED", "20261125"))
WORKLOADS = 100
BATCH = 20
CAPS_MIB = {"ada": 1024, "bea": 1536, "cyd": 2048, "dot": 3072}


def plan(rng, count):
    """*count* workloads ``(slice, device, preload, bytes)`` that keep every
    slice within its cap on every GPU (a context costs 64 MiB)."""
    left = {(name, d): cap * MiB for name, cap in CAPS_MIB.items() for d in (0, 1)}
    out = []
    while len(out) < count:
        key = rng.choice([k for k, v in left.items() if v >= CONTEXT + MiB])
        size = rng.randint(1, min(left[key] - CONTEXT, 400 * MiB) // MiB) * MiB
        left[key] -= CONTEXT + size
        out.append((key[0], key[1], rng.random() < 0.5, size))
    return out


def test_random_workloads_within_their_caps_are_never_touched(gpu, slices, start_guard, holder, root):
    rng = random.Random(SEED)
    print(f"seed {SEED} (HAMI_GUARD_SEED replays it)")
    for name, cap in CAPS_MIB.items():
        slices.make(name, memory=f"{cap}m")
    guard = start_guard("--action", "kill")
    uuids = {d: gpu.uuid(d) for d in (0, 1)}
    done = 0
    while done < WORKLOADS:
        batch = plan(rng, min(BATCH, WORKLOADS - done))
        running = []
        for name, device, preload, size in batch:
            running.append(holder(slices.env(name, preload=preload), device, size))
        expected = {}
        for name, device, preload, size in batch:
            key = (name, uuids[device])
            expected[key] = expected.get(key, 0) + allocation_footprint(size, preload) + CONTEXT

        def charged(r):
            return all(r["slices"][n]["gpus"].get(u, {}).get("real_bytes") == b
                       for (n, u), b in expected.items())

        guard.wait_report(charged, timeout=20, what="every workload of the batch charged to its slice")
        report = guard.rounds(3)  # the guard acts on a state seen twice: give it the chance
        assert all(it.alive() for it in running), [it.pid for it in running if not it.alive()]
        assert report["actions"] == [] and report["unattributed"] == [] and report["errors"] == []
        for name, entry in report["slices"].items():
            for uuid, g in entry["gpus"].items():
                assert g["state"] == "ok", (name, uuid, g)
                assert len(g["processes"]) == sum(1 for (n, d, _, _) in batch
                                                  if n == name and uuids[d] == uuid)
                with_preload = sum(1 for p in g["processes"] if p["preload"])
                assert with_preload == sum(1 for (n, d, pre, _) in batch
                                           if n == name and uuids[d] == uuid and pre)
        for it in running:
            assert it.close() == 0
        done += len(batch)
    assert audit_records(root, "guard-kill", "guard-warn") == []
    assert "KILL" not in guard.log() and "WARN" not in guard.log()
