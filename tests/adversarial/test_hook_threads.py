"""Threads of one process race into the preload library's hooks (hook_threads.c).

Meant above all for the ThreadSanitizer pass (HAMI_TEST_BUILD=tsan), where
any data race in the library (a lazily resolved entry point, a cache, the
launch gate) is a report on stderr and fails the test; in the other passes it
still checks that concurrent first calls all answer correctly and the slice
ends at 0.
"""

import json
import subprocess

import pytest

from adversarial_helpers import build_program, sanitizer_report
from native_helpers import DEFAULT_TIMEOUT, GiB, MiB, wait_for

THREADS = 8
ROUNDS = 40
SOURCE = __file__.rsplit("/", 1)[0] + "/hook_threads.c"


@pytest.fixture(scope="session")
def hook_threads(hami_build, tmp_path_factory):
    return build_program(SOURCE, tmp_path_factory.mktemp("hook-threads") / "hook_threads", hami_build.sanitizer)


# A known context overhead, or none: then the first contexts are measured through NVML while
# the housekeeping thread asks NVML for utilization (the SM share is set).
@pytest.mark.parametrize("overhead", ["64m", None], ids=["overhead-set", "overhead-measured"])
def test_threads_racing_into_every_hook(hook_threads, make_slice, cudrive, report, overhead):
    s = make_slice(limit="2g", overhead=overhead, CUDA_DEVICE_SM_LIMIT="50")
    res = subprocess.run([str(hook_threads), str(THREADS), str(ROUNDS)], env=s.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=DEFAULT_TIMEOUT * 2)
    assert not sanitizer_report(res.stderr), f"sanitizer report:\n{res.stderr[-12000:]}"
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr[-4000:]}"
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    assert counts["failures"] == 0 and counts["allocations"] > 0, counts
    # Everything the threads took was given back when the process ended.
    def idle():
        cudrive.run("init sleep 60", s.env, timeout=30)
        return s.used(0) == 0
    wait_for(idle, timeout=10, interval=0.05, what="the slice back at 0")
    peak = s.snapshot().devices[0].memory_peak
    assert peak <= 2 * GiB
    report(f"{counts['threads']} threads x {counts['rounds']} rounds: {counts['calls']} calls, "
           f"{counts['allocations']} allocations, {counts['refusals']} refused at the cap, 0 failures; "
           f"slice peak {peak // MiB} MiB of 2048")


def test_a_park_while_threads_create_contexts_and_allocate(hook_threads, make_slice, hami_build, report):
    """Three of the library's mutexes are held across a driver call (set-up,
    primary contexts, pool figures). A park locks the process in the driver
    while threads are inside those calls and others wait for the mutexes: the
    waiting ones count as inside the driver, so the process asks for its state
    back, and nothing the resume needs is behind those mutexes. The process
    must finish every call as without the park."""
    s = make_slice(limit="2g", overhead="64m")
    proc = subprocess.Popen([str(hook_threads), str(THREADS), str(ROUNDS * 20)], env=s.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def at_work():
            try:
                return any(slot.pid == proc.pid for slot in s.snapshot().slots)
            except FileNotFoundError:  # the process has not made the slice file yet
                return False

        wait_for(at_work, timeout=30, interval=0.01, what="the threads at work")
        env = {k: v for k, v in s.env.items() if k != "LD_PRELOAD"}
        parks = []
        for _ in range(3):
            done = subprocess.run([str(hami_build.out / "hami-park"), "park", str(s.path), str(proc.pid)],
                                  env=env, capture_output=True, text=True, timeout=60)
            parks.append((done.returncode, done.stdout.strip() or done.stderr.strip()[-200:]))
            if proc.poll() is not None:
                break
        out, err = proc.communicate(timeout=DEFAULT_TIMEOUT * 3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not sanitizer_report(err), f"sanitizer report:\n{err[-12000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}\nparks {parks}\nstderr: {err[-4000:]}"
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["failures"] == 0 and counts["allocations"] > 0, counts
    assert any(rc == 0 for rc, _ in parks), f"no park took: {parks}"
    report(f"{len(parks)} parks during {counts['calls']} calls of {counts['threads']} threads: {parks}")
