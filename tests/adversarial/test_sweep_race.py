"""Threads of one process sweeping dead slots at once never free a live process's slot.

OFD locks belong to an open file description, not to a thread: two threads
of one process both "win" a dead slot's lock, and the first to let go drops
it for both. The second then looks at a slot that a new process may have
claimed in between, and used to free it under that process's feet: a live
process without a slot, its charges gone from the slice (found once by the
kill storm). The library's threads now take turns at the slot locks.

slow_locks.c stretches every lock call so that the race shows in seconds.
"""

import subprocess
import time

import pytest

from native_helpers import NATIVE, wait_for

SOURCE = __file__.rsplit("/", 1)[0] + "/slow_locks.c"
ROUNDS_S = 8
MAX_LOOKS = 3000  # the old code lost a slot within about 50 looks


@pytest.fixture(scope="session")
def slow_locks(hami_build, tmp_path_factory):
    out = tmp_path_factory.mktemp("slow-locks") / "slow_locks.so"
    flags = ["-O1", "-g"] if hami_build.sanitizer else ["-O2"]
    cmd = ["cc", "-std=gnu11", "-Wall", "-shared", "-fPIC", *flags, "-o", str(out), SOURCE, "-ldl"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}"
    return out


def test_racing_sweepers_leave_every_live_process_its_slot(cudrive, make_slice, slow_locks, hami_build, report):
    s = make_slice(limit="256m", overhead="16m")
    env = dict(s.env)
    if hami_build.sanitizer:  # the sanitizer's runtime must stay first
        env["LD_PRELOAD"] = f"{env['LD_PRELOAD']}:{slow_locks}"
    else:
        env["LD_PRELOAD"] = f"{slow_locks}:{env['LD_PRELOAD']}"
    # The sweepers: threads at the cap, each refusal a sweep.
    sweeper = cudrive.start(env)
    sweeper.ok("init")
    sweeper.ok("ctx 0")
    sweeper.send("threads 6 100000000 96m 7")
    newcomers, checked, lost = [], 0, []
    deadline = time.monotonic() + ROUNDS_S
    while time.monotonic() < deadline and checked < MAX_LOOKS:
        # A process dies (its slot to be swept) and new ones claim slots meanwhile.
        batch = [cudrive.start(s.env) for _ in range(4)]
        for p in batch:
            p.send("init")  # set-up claims the process's slot
        for p in batch:
            assert p.read(timeout=30)["rc"] == 0
        newcomers.extend(batch)
        while len(newcomers) > 8:
            victim = newcomers.pop(0)
            victim.teardown()  # killed, and its pipes closed: hundreds of them come and go
        snap = s.snapshot()
        live = {slot.pid for slot in snap.slots}
        for q in newcomers:
            checked += 1
            if q.pid not in live:
                lost.append(q.pid)
        if lost:
            break
    report(f"{checked} looks at live processes' slots; {len(lost)} without one")
    assert not lost, f"live processes {lost} lost their slot to a sweep"
    assert sweeper.alive()
