"""True accounting and the guard on the real GPU (issue 15).

* For PyTorch (convolutions, FFT, linear algebra), CuPy and JAX the slice's
  reported bytes for a process match NVML's per-process figure within
  16 MiB + 2 % once the library's true-up has run (about once a second).
* A graph with memory nodes (cudaMallocAsync captured in the global,
  thread-local and relaxed modes) runs under the library exactly as without
  it, and its memory is charged while the graph holds it.
* The guard ends a PyTorch process that a slice's user started without the
  library, within 2 s of its passing the cap.
"""

import json
import os
import pwd
import shutil
import subprocess
import sys
import time

import pytest

from gpu_helpers import REPO, SCENARIOS, GiB, MiB

pytestmark = pytest.mark.gpu

BOUND_FIXED = 16 * MiB
BOUND_FRACTION = 0.02
TRUE_UP_WAIT_S = 6.0


def within_bound(reported, real):
    return abs(reported - real) <= BOUND_FIXED + BOUND_FRACTION * real


def nvml_process_bytes(pid, index=0):
    """What NVML says process *pid* holds on GPU *index* (compute or graphics), or None."""
    return nvml_process_bytes_by_gpu(pid, [index]).get(index)


def nvml_process_bytes_by_gpu(pid, indices=None):
    """``{NVML index: bytes}`` of process *pid* on each GPU where NVML lists it."""
    import pynvml

    pynvml.nvmlInit()
    try:
        found = {}
        for index in indices if indices is not None else range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                           pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                for p in getter(handle):
                    if p.pid == pid and p.usedGpuMemory is not None:
                        found[index] = p.usedGpuMemory
        return found
    finally:
        pynvml.nvmlShutdown()


def nvml_uuids():
    import pynvml

    pynvml.nvmlInit()
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out[uuid.decode() if isinstance(uuid, bytes) else uuid] = i
        return out
    finally:
        pynvml.nvmlShutdown()


def slot_bytes_by_gpu(path, pid):
    """``{GPU UUID: (charged, driver's own)}`` of process *pid*'s slot in the slice file at *path*."""
    from hami_jupyter.slice.file import read_snapshot

    snap = read_snapshot(path)
    uuid_of = {d.index: d.uuid for d in snap.devices}
    for slot in snap.slots:
        if slot.pid == pid:
            driver = slot.driver_bytes or {}
            return {uuid_of[i]: (used, driver.get(i, 0)) for i, used in slot.memory_used.items() if i in uuid_of}
    return None


def settle(path, pid, timeout=TRUE_UP_WAIT_S):
    """Poll until, on every GPU, the slot's charge is within the bound of NVML's
    figure for the process on that GPU (JAX makes a context on each GPU it
    sees); returns ``(seconds, first (reported, real), last (reported, real,
    driver))``, the figures summed over the GPUs, and prints each GPU's."""
    start = time.monotonic()
    index_of = nvml_uuids()
    first = None
    while True:
        slot = slot_bytes_by_gpu(path, pid)
        real = nvml_process_bytes_by_gpu(pid)
        per_gpu = {}
        if slot is not None:
            for uuid in set(slot) | {u for u, i in index_of.items() if i in real}:
                charged, driver = slot.get(uuid, (0, 0))
                per_gpu[uuid] = (charged, real.get(index_of.get(uuid), 0), driver)
        totals = ((sum(v[0] for v in per_gpu.values()), sum(v[1] for v in per_gpu.values()),
                   sum(v[2] for v in per_gpu.values())) if slot is not None and real else (None, None, None))
        if first is None:
            first = totals[:2]
        if per_gpu and real and all(within_bound(c, r) for c, r, _ in per_gpu.values()):
            print("per GPU (charged, NVML, driver's own) MiB: " + ", ".join(
                f"{u[:12]}: " + "/".join(f"{x / MiB:.1f}" for x in v) for u, v in sorted(per_gpu.items())))
            return time.monotonic() - start, first, totals
        if time.monotonic() - start > timeout:
            print(f"not settled, per GPU: {per_gpu}")
            return None, first, totals
        time.sleep(0.1)


@pytest.mark.parametrize("framework", ["torch", "cupy", "jax"])
def test_the_slice_reports_what_nvml_sees(slice_env, tmp_path, framework):
    pytest.importorskip(framework)
    env = slice_env(limit="24g", name=f"acc-{framework}", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.Popen([sys.executable, str(SCENARIOS), "workload", framework], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
        took, first, last = settle(tmp_path / f"acc-{framework}", proc.pid)
        reported, real, driver = last
        print(f"{line.strip()}: at READY reported {first[0] / MiB:.1f} MiB, NVML {first[1] / MiB:.1f} MiB; "
              f"after the true-up ({took if took is None else round(took, 2)} s) reported {reported / MiB:.1f} "
              f"MiB, NVML {real / MiB:.1f} MiB, driver's own {driver / MiB:.1f} MiB, "
              f"difference {(reported - real) / MiB:+.1f} MiB (bound {(BOUND_FIXED + BOUND_FRACTION * real) / MiB:.1f})")
        assert took is not None, f"not within 16 MiB + 2 % after {TRUE_UP_WAIT_S} s: {last}"
    finally:
        proc.communicate(input="", timeout=120)


@pytest.fixture(scope="module")
def graph_program(tmp_path_factory):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        pytest.skip("nvcc not found")
    out = tmp_path_factory.mktemp("graph") / "graph_nodes"
    src = REPO / "tests" / "gpu" / "graph_nodes.cu"
    res = subprocess.run([nvcc, "-O2", "-o", str(out), str(src), "-lpthread"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300)
    assert res.returncode == 0, res.stdout
    return out


def run_graph(program, env, mode, slice_path=None, worker=False, mib=256):
    """Run the program; returns its records and, at "launched" and "trimmed",
    NVML's bytes for it and the slot's charge (when *slice_path*)."""
    proc = subprocess.Popen([str(program), mode, str(mib)] + (["worker"] if worker else []), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    records, seen = [], {}
    try:
        for line in proc.stdout:
            rec = json.loads(line)
            records.append(rec)
            if rec["step"] in ("launched", "trimmed"):
                if slice_path is not None:
                    took, _, last = settle(slice_path, proc.pid)
                    seen[rec["step"]] = {"reported": last[0], "real": last[1], "driver": last[2], "settled_s": took}
                else:
                    seen[rec["step"]] = {"real": nvml_process_bytes(proc.pid)}
                proc.stdin.write("go\n")
                proc.stdin.flush()
        proc.stdin.close()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, (rc, records, proc.stderr.read()[-3000:])
    return records, seen


def _plain_env():
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HAMI_")}


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_a_graph_with_memory_nodes_runs_as_without_the_library_and_is_charged(graph_program, slice_env, tmp_path,
                                                                               mode):
    reference, plain = run_graph(graph_program, _plain_env(), mode)
    env = slice_env(limit="8g", name=f"graph-{mode}")
    records, seen = run_graph(graph_program, env, mode, tmp_path / f"graph-{mode}")
    print(f"{mode}: without the library {reference}, NVML {plain}")
    print(f"{mode}: under the library {records}, slice and NVML {seen}")
    strip = [{k: v for k, v in r.items() if k != "sum"} for r in records]
    assert strip == [{k: v for k, v in r.items() if k != "sum"} for r in reference]
    captured = next(r for r in records if r["step"] == "captured")
    assert captured["malloc"] == captured["free"] == captured["end"] == 0
    launched = next(r for r in records if r["step"] == "launched")
    assert launched["launches"] == 3 and abs(launched["sum"] - launched["expect"]) <= 1e-9 * launched["expect"]
    for step in ("launched", "trimmed"):
        assert seen[step]["settled_s"] is not None, (step, seen[step])
    # The graph's 256 MiB were charged while it held them, and given back at the trim.
    assert seen["launched"]["reported"] - seen["trimmed"]["reported"] >= 256 * MiB


def test_a_graph_whose_memory_passes_the_cap_is_refused_before_the_driver_maps_it(graph_program, slice_env,
                                                                                   tmp_path):
    # 1.5 GiB through a memory node in a 1 GiB slice: on the old library every
    # launch ran and NVML showed the process holding 2.0 GiB.
    reference, plain = run_graph(graph_program, _plain_env(), "global", mib=1536)
    assert next(r for r in reference if r["step"] == "launched")["launches"] == 3, reference
    env = slice_env(limit="1g", name="graph-over")
    proc_records, seen = run_graph(graph_program, env, "global", mib=1536)
    launched = next(r for r in proc_records if r["step"] == "launched")
    print(f"without the library {reference}, NVML {plain}; in a 1 GiB slice {proc_records}, NVML {seen}")
    assert launched["launches"] == 0 and launched["rc"] == 2, launched  # cudaErrorMemoryAllocation
    assert seen["launched"]["real"] is not None and seen["launched"]["real"] <= GiB, seen


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_another_thread_allocating_during_a_capture_fares_as_without_the_library(graph_program, slice_env, tmp_path,
                                                                                  mode):
    # Whether the driver lets a second thread allocate while the main thread
    # captures depends on the mode: the library must change none of it.
    def run(env, path=None):
        try:
            return run_graph(graph_program, env, mode, path, worker=True)[0]
        except AssertionError as e:  # the program stops at a failed capture: compare what it said
            return str(e.args[0][:2]) if e.args and isinstance(e.args[0], tuple) else str(e)

    reference = run(_plain_env())
    under = run(slice_env(limit="8g", name=f"worker-{mode}"), tmp_path / f"worker-{mode}")
    print(f"{mode} with a worker: without the library {reference}; under it {under}")
    strip = (lambda rs: [{k: v for k, v in r.items() if k != "sum"} for r in rs] if isinstance(rs, list) else rs)
    assert strip(under) == strip(reference)


def _user(name="hamitest"):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def test_the_guard_ends_a_pytorch_bypass_within_two_seconds(preload_lib, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the guard and a second user need root")
    pytest.importorskip("torch")
    from hami_jupyter.slice.create import create_limits_file, ensure_slice
    from hami_jupyter.slice.limits import Limits
    from hami_jupyter.slice.guard_report import read_report
    from hami_jupyter.slice.settings import resolve_limits

    user = _user()
    root = tmp_path / "slices"
    root.mkdir(mode=0o755)
    path = root / f"{user.pw_name}.slice"
    ensure_slice(path, user.pw_name, resolve_limits({"memory_limit": "4g"}, {}))
    os.chown(path, user.pw_uid, user.pw_gid)
    # The cap the guard holds her to is the administrator's (a root-owned limits file), not her own word.
    create_limits_file(path, Limits(memory_limit=4 << 30), mode=0o644)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HAMI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    guard_log = open(tmp_path / "guard.log", "w")
    guard = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root), "--interval",
                              "0.5", "--action", "kill"], env=env, stdout=guard_log, stderr=subprocess.STDOUT)
    bypass = None
    try:
        deadline = time.monotonic() + 60
        while not (root / "guard.json").exists():
            assert guard.poll() is None and time.monotonic() < deadline, (tmp_path / "guard.log").read_text()
            time.sleep(0.1)
        # The user's own PyTorch, no preload, no HAMI_SLICE: a terminal of theirs.
        bypass = subprocess.Popen(["runuser", "-u", user.pw_name, "--", sys.executable, str(SCENARIOS), "grow",
                                   str(512 * MiB), str(12 * GiB)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd="/")
        # An observer beside the guard: when NVML first shows the process past
        # the cap, and when it is gone.
        limit, over_at, gpu_pid, worst = 4 * GiB, None, None, 0
        deadline = time.monotonic() + 120
        while bypass.poll() is None and time.monotonic() < deadline:
            if gpu_pid is None:
                out = subprocess.run(["pgrep", "-u", user.pw_name, "-f", "gpu_scenarios.py grow"],
                                     stdout=subprocess.PIPE, text=True).stdout.split()
                gpu_pid = int(out[0]) if out else None
            real = nvml_process_bytes(gpu_pid) if gpu_pid else None
            if real is not None:
                worst = max(worst, real)
                if over_at is None and real > limit:
                    over_at = time.monotonic()
            time.sleep(0.02)
        gone_at = time.monotonic()
        out, err = bypass.communicate(timeout=30)
        report = read_report(root)
        actions = [a for a in report["actions"] if a.get("pid") == gpu_pid]
        held = [line for line in out.splitlines() if line.startswith("HELD")]
        print(f"bypass pid {gpu_pid}: last {held[-1] if held else None}; NVML saw at most {worst / MiB:.0f} MiB; "
              f"over the 4 GiB cap at {over_at}, gone {None if over_at is None else round(gone_at - over_at, 3)} s "
              f"later; guard actions {actions}")
        assert over_at is not None, "NVML never saw the bypass over the cap"
        assert actions and actions[0]["action"] == "kill", report["actions"]
        assert gone_at - over_at <= 2.0
        assert not out.count("RESULT"), "the bypass ran to its end"
    finally:
        if bypass is not None and bypass.poll() is None:
            bypass.kill()
        guard.terminate()
        guard.wait(timeout=30)
        guard_log.close()
        print((tmp_path / "guard.log").read_text()[-3000:])


def test_the_guard_parks_a_pytorch_bypass_and_an_administrator_brings_its_data_back(preload_lib, tmp_path):
    """The guard's default action on the H100: a user's PyTorch process
    without the preload library, 2 GiB of random data and 3 GiB more, passes
    its 4 GiB cap; the guard parks it (its GPU memory to host memory); the
    time from NVML's first look past the cap to NVML's bytes of it at 0 is
    printed; an administrator raises the cap and resumes it; the data's hash
    is the same."""
    if os.geteuid() != 0:
        pytest.skip("the guard and a second user need root")
    pytest.importorskip("torch")
    from hami_jupyter.slice.change import set_memory_limit
    from hami_jupyter.slice.create import create_limits_file, ensure_slice
    from hami_jupyter.slice.limits import Limits
    from hami_jupyter.slice.guard_report import read_report
    from hami_jupyter.slice.settings import resolve_limits

    user = _user()
    root = tmp_path / "slices"
    root.mkdir(mode=0o755)
    path = root / f"{user.pw_name}.slice"
    ensure_slice(path, user.pw_name, resolve_limits({"memory_limit": "4g"}, {}))
    os.chown(path, user.pw_uid, user.pw_gid)
    # The cap the guard holds her to is the administrator's (a root-owned limits file), not her own word.
    create_limits_file(path, Limits(memory_limit=4 << 30), mode=0o644)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("HAMI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    guard_log = open(tmp_path / "guard.log", "w")
    guard = subprocess.Popen([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root), "--interval",
                              "0.5"], env=env, stdout=guard_log, stderr=subprocess.STDOUT)
    bypass = None
    try:
        deadline = time.monotonic() + 60
        while not (root / "guard.json").exists():
            assert guard.poll() is None and time.monotonic() < deadline, (tmp_path / "guard.log").read_text()
            time.sleep(0.1)
        bypass = subprocess.Popen(["runuser", "-u", user.pw_name, "--", sys.executable, str(SCENARIOS),
                                   "hold_hash", str(2 * GiB), str(3 * GiB)], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        before = bypass.stdout.readline().split()
        assert before and before[0] == "HASH", (before, bypass.stderr.read() if bypass.poll() is not None else "")
        gpu_pid = int(subprocess.run(["pgrep", "-u", user.pw_name, "-f", "gpu_scenarios.py hold_hash"],
                                     stdout=subprocess.PIPE, text=True).stdout.split()[0])
        limit, over_at, freed_at, worst = 4 * GiB, None, None, 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and freed_at is None:
            real = nvml_process_bytes(gpu_pid)
            if real is not None:
                worst = max(worst, real)
                if over_at is None and real > limit:
                    over_at = time.monotonic()
            if over_at is not None and not real:
                freed_at = time.monotonic()
            time.sleep(0.02)
        assert bypass.poll() is None, "the bypass was ended: " + bypass.stderr.read()[-2000:]
        # NVML shows the memory gone while the park is still finishing: the
        # report lists it once the guard's interval ends.
        parked, deadline = [], time.monotonic() + 30
        while not parked and time.monotonic() < deadline:
            parked = [p for p in read_report(root).get("parked") or [] if p.get("pid") == gpu_pid]
            time.sleep(0.1)
        print(f"bypass pid {gpu_pid}: NVML saw at most {worst / MiB:.0f} MiB; over the 4 GiB cap at {over_at}, "
              f"its GPU memory freed {None if freed_at is None else round(freed_at - over_at, 3)} s later; "
              f"parked {parked}")
        assert over_at is not None and freed_at is not None, "NVML never saw it over the cap and then freed"
        assert parked and parked[0]["action"] == "park"
        # An administrator raises the cap and resumes it.
        set_memory_limit(path, None, 8 * GiB)
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "hami_jupyter", "guard", "--root", str(root), "--resume",
                               str(gpu_pid)], env=env, capture_output=True, text=True, timeout=300)
        resumed = time.monotonic() - t0
        assert done.returncode == 0, done.stdout + done.stderr
        bypass.stdin.write("go\n")
        bypass.stdin.flush()
        after = bypass.stdout.readline().split()
        while after and after[0] == "OVER":  # said before its park, not read yet
            after = bypass.stdout.readline().split()
        print(f"resumed in {resumed:.2f} s; hash before {before[1][:16]}, after {after[1][:16] if after else None}")
        assert after and after[0] == "AFTER" and after[1] == before[1]
        assert [a for a in read_report(root)["actions"] if a.get("action") == "kill"] == []
    finally:
        if bypass is not None and bypass.poll() is None:
            bypass.kill()
        guard.terminate()
        guard.wait(timeout=30)
        guard_log.close()
        print((tmp_path / "guard.log").read_text()[-3000:])
