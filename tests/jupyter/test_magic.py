"""``%hami`` in real kernels started by the provisioner on the simulated GPU,
plus in-process tests of the HTML view, the watch and framework release.

The simulated GPU charges 64 MiB for each CUDA context, so a kernel that
allocated N MiB holds N + 64 MiB of its slice.
"""

import json
import sys
import time
import types
from html import escape
from pathlib import Path

import pytest
from fake_guard import seen, write_guard

from hami_jupyter.magic import release as framework_release
from hami_jupyter.magic import watch as status_watch
from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.create import create_slice
from hami_jupyter.slice.status import slice_status
from hami_jupyter.slice.status_html import format_html

MiB = 1 << 20
CONTEXT = 64 * MiB
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def allocate(mib):
    """Kernel code holding *mib* MiB more of device memory (in ``held``)."""
    return ("from hami_jupyter import driver_memory as c\n"
            "c.init()\n"
            "held = globals().setdefault('held', [])\n"
            f"held.append(c.DeviceBuffer({mib} << 20))")


def ok(kc, cell, code):
    r = cell(kc, code)
    assert r.error is None, r.error
    return r


def only_output(result, mime):
    datas = [o["data"][mime] for o in result.outputs if mime in o["data"]]
    assert len(datas) == 1, result
    return datas[0]


def kernel_slice(kc, cell):
    return ok(kc, cell, "import os; print(os.environ['HAMI_SLICE'])").stdout.strip()


def test_status_shows_limit_kernel_and_usage(start_kernel, cell):
    km, kc = start_kernel(memory_limit="1g")
    ok(kc, cell, allocate(300))
    r = ok(kc, cell, "%hami status")
    assert r.stdout == "" and r.stderr == ""
    text = only_output(r, "text/plain")
    assert "364.0 MiB / 1.0 GiB" in text  # 300 MiB + the context
    assert km.kernel_id in text
    assert "WARNING" not in text and "CRITICAL" not in text
    html = only_output(r, "text/html")
    assert "364.0 MiB / 1.0 GiB" in html
    # The kernel id as the JupyterLab panel shows it: 8 characters, the whole id its tooltip.
    assert f'<code title="{km.kernel_id}"' in html and f">{km.kernel_id[:8]}</code>" in html
    assert "(this kernel)" in html
    assert 'class="hami-warning"' not in html and 'class="hami-critical"' not in html


def test_status_shows_what_the_guard_sees(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")
    ok(kc, cell, allocate(300))
    path = Path(kernel_slice(kc, cell))
    (gpu,) = slice_status(path)["gpus"]
    used = 300 * MiB + CONTEXT
    write_guard(path.parent, {path.stem: {gpu["uuid"]: seen(1400 * MiB, used, 1 << 30)}},
                interval=5.0)
    r = ok(kc, cell, "%hami status")
    text = only_output(r, "text/plain")
    assert "364.0 MiB / 1.0 GiB (36 %), real 1.4 GiB (guard)" in text
    assert ("OVER CAP: the guard sees 1.4 GiB really in use on this GPU, over the 1.0 GiB cap "
            "(the slice counts 364.0 MiB); the guard's action: kill") in text
    html = only_output(r, "text/html")
    assert 'class="hami-guard-over"' in html and "real 1.4 GiB (guard)" in html
    shown = json.loads(only_output(ok(kc, cell, "%hami status --json"), "text/plain"))
    assert (shown["gpus"][0]["memory_real"], shown["gpus"][0]["guard_state"]) == (1400 * MiB, "over")
    assert shown["guard"]["running"] is True and shown["guard"]["action"] == "kill"


def test_status_json_is_what_the_file_says(start_kernel, cell):
    km, kc = start_kernel(memory_limit="2g")
    ok(kc, cell, allocate(100))
    r = ok(kc, cell, "%hami status --json")
    assert r.stdout == ""
    shown = json.loads(only_output(r, "text/plain"))
    assert only_output(r, "application/json") == shown
    assert shown["in_slice"] is True
    expected = slice_status(kernel_slice(kc, cell))
    assert shown["path"] == expected["path"]
    assert [(g["uuid"], g["memory_used"], g["memory_limit"]) for g in shown["gpus"]] == \
        [(g["uuid"], g["memory_used"], g["memory_limit"]) for g in expected["gpus"]]
    assert shown["gpus"][0]["memory_used"] == 100 * MiB + CONTEXT
    assert shown["gpus"][0]["memory_limit"] == 2 << 30
    assert [k["kernel_id"] for k in shown["kernels"]] == [km.kernel_id]
    assert [p["pid"] for p in shown["kernels"][0]["processes"]] == \
        [p["pid"] for p in expected["kernels"][0]["processes"]]


def test_status_warns_at_80_and_95_percent(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")
    ok(kc, cell, allocate(800))  # 864 MiB of 1 GiB: 84 %
    r = ok(kc, cell, "%hami status")
    assert "WARNING: 84 % of the memory cap is in use (a warning from 80 %)" in \
        only_output(r, "text/plain")
    html = only_output(r, "text/html")
    assert 'class="hami-warning"' in html and "84&nbsp;% of the memory cap is in use" in html

    ok(kc, cell, allocate(120))  # 984 MiB: 96 %
    r = ok(kc, cell, "%hami status")
    text = only_output(r, "text/plain")
    assert "CRITICAL: 96 % of the memory cap is in use: 40.0 MiB left, a larger allocation is " \
           "refused" in text and "WARNING" not in text
    html = only_output(r, "text/html")
    assert 'class="hami-critical"' in html and 'class="hami-warning"' not in html


def test_status_html_escapes_what_users_control(start_kernel, cell, monkeypatch):
    user = "<img src=x onerror=alert(1)>&co"
    monkeypatch.setenv("JUPYTERHUB_USER", user)  # the registry records it as the kernel's user
    _, kc = start_kernel(memory_limit="1g")
    r = ok(kc, cell, "%hami status")
    html = only_output(r, "text/html")
    assert escape(user) in html and "<img" not in html
    assert "No GPU used in this slice yet" in html  # the kernel has not touched CUDA
    assert user in only_output(r, "text/plain")


def test_format_html_escapes_every_field():
    evil = "<script>x</script>&\"'"
    process = {"pid": 7, "comm": evil, "uid": 0, "memory_used": {evil: 5 * MiB},
               "sm_util": {evil: 3}, "active_unix": 0.0}
    status = {
        "slice": evil, "path": evil, "dead_processes": 1,
        "default_limit": {"memory_limit": 0, "sm_share": 0, "mode": evil},
        "gpus": [{"index": i, "uuid": evil, "memory_total": 16 << 30, "memory_used": 5 * MiB,
                  "memory_peak": 5 * MiB, "memory_limit": 0, "memory_level": "ok",
                  "sm_count": 0, "sm_share": 50, "sm_util": 3, "mode": evil,
                  "limit_is_fallback": True} for i in (0, 1)],
        "kernels": [{"kernel_id": evil, "user": evil, "kernelspec": evil, "pid": 1,
                     "processes": [process], "memory_used": 5 * MiB, "sm_util": 3}],
        "other_processes": [process],
    }
    html = format_html(status, current_kernel=evil)
    assert "<script" not in html and "</script" not in html
    assert escape(evil) in html and "(this kernel)" in html
    assert "1 dead process(es)" in html


def test_not_in_a_slice(start_kernel, cell):
    _, kc = start_kernel(kernel_name="python3")
    ok(kc, cell, "%load_ext hami_jupyter.magic")
    for line in ("%hami status", "%hami watch"):
        r = ok(kc, cell, line)
        assert "this kernel is not in a GPU slice" in r.stdout, line
        assert r.outputs == [] and r.stderr == ""
    # --json is for programs: JSON saying so, never prose on stdout.
    r = ok(kc, cell, "%hami status --json")
    assert r.stdout == "" and r.stderr == ""
    shown = json.loads(only_output(r, "text/plain"))
    assert only_output(r, "application/json") == shown
    assert shown["in_slice"] is False
    assert shown["reason"].startswith("this kernel is not in a GPU slice ($HAMI_SLICE is not set)")


def test_damaged_or_missing_slice_file_is_one_line_of_advice(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")  # no CUDA in the kernel: nothing maps the file
    path = Path(kernel_slice(kc, cell))
    cases = [
        (lambda: path.write_bytes(b"junk" * 2048), "not a slice file"),
        (lambda: path.write_bytes(b"junk"), "truncated slice file"),
        (path.unlink, "does not exist"),
    ]
    for damage, words in cases:
        damage()
        for line in ("%hami status", "%hami status --json"):
            r = ok(kc, cell, line)
            assert r.outputs == [] and r.stdout == ""
            assert r.stderr.startswith("hami: ") and words in r.stderr, (line, r.stderr)
            assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    r = ok(kc, cell, "%hami watch --interval 0.2")
    assert only_output(r, WIDGET_MIME)
    r = ok(kc, cell, "from hami_jupyter.magic import watch as status_watch\n"
                     "print(status_watch.running_watches()[-1].error)\n"
                     "%hami watch stop")
    assert "does not exist" in r.stdout


def test_watch_refreshes_until_stopped(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")
    r = ok(kc, cell, "%hami watch --interval 0.2")
    assert only_output(r, WIDGET_MIME)["model_id"]
    # Counting while this cell itself runs: the refresh does not need an idle kernel.
    r = ok(kc, cell, "import time\n"
                     "from hami_jupyter.magic import watch as status_watch\n"
                     "w = status_watch.running_watches()[-1]\n"
                     "n0 = w.refresh_count; time.sleep(1.5); n1 = w.refresh_count\n"
                     "print(w.running, n0, n1)")
    running, n0, n1 = r.stdout.split()
    assert running == "True" and int(n1) >= int(n0) + 3

    ok(kc, cell, allocate(300))
    r = ok(kc, cell, "deadline = time.monotonic() + 10\n"
                     "while '364.0 MiB / 1.0 GiB' not in w.html.value and time.monotonic() < deadline:\n"
                     "    time.sleep(0.05)\n"
                     "print('364.0 MiB / 1.0 GiB' in w.html.value)")
    assert r.stdout.strip() == "True"

    r = ok(kc, cell, "%hami watch stop")
    assert r.stdout.strip() == "hami: stopped 1 watch(es)"
    r = ok(kc, cell, "n0 = w.refresh_count; time.sleep(0.6)\n"
                     "print(w.running, w.refresh_count - n0, w.stop_button.disabled,"
                     " len(status_watch.running_watches()))")
    assert r.stdout.split() == ["False", "0", "True", "0"]


def test_watch_shows_errors_and_recovers(tmp_path):
    path = tmp_path / "later.slice"
    watch = status_watch.start(path, interval=0.1)
    try:
        assert "does not exist" in watch.error and watch.running
        assert escape(str(path)) in watch.html.value
        create_slice(path, "later", Limits(memory_limit=1 << 30))
        deadline = time.monotonic() + 10
        while watch.error is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.error is None and "hami slice later" in watch.html.value
    finally:
        status_watch.stop_all()
    assert not watch.running and watch not in status_watch.running_watches()


def test_usage_and_help(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")
    r = ok(kc, cell, "%hami")
    assert r.stdout.startswith("Usage: %hami status")
    r = cell(kc, "%hami frobnicate")
    assert r.error["ename"] == "UsageError" and "unknown subcommand 'frobnicate'" in r.error["evalue"]
    r = cell(kc, "%hami watch --interval 0")
    assert r.error["ename"] == "UsageError" and "--interval" in r.error["evalue"]
    reply = kc.execute_interactive("%hami?", timeout=60, output_hook=lambda msg: None)
    page = reply["content"]["payload"][0]["data"]["text/plain"]
    for words in ("%hami status [--json]", "%hami watch [--interval", "%hami watch stop",
                  "%hami release", "json.loads"):
        assert words in page, words


def test_release_in_a_kernel(start_kernel, cell):
    _, kc = start_kernel(memory_limit="1g")
    r = ok(kc, cell, "%hami release")
    assert r.stdout.startswith("hami release: nothing freed")
    assert "not imported, left alone: PyTorch, CuPy" in r.stdout
    # A stand-in CuPy whose pool holds real device memory of this slice.
    ok(kc, cell, allocate(100) + "\n"
       "import sys, types\n"
       "class Pool:\n"
       "    def __init__(self, mib): self.blocks = [c.DeviceBuffer(mib << 20)] if mib else []\n"
       "    def free_all_blocks(self):\n"
       "        for b in self.blocks: b.free()\n"
       "        self.blocks.clear()\n"
       "cupy = types.ModuleType('cupy')\n"
       "pool, pinned = Pool(200), Pool(0)\n"
       "cupy.get_default_memory_pool = lambda: pool\n"
       "cupy.get_default_pinned_memory_pool = lambda: pinned\n"
       "sys.modules['cupy'] = cupy")
    r = ok(kc, cell, "%hami release")
    assert r.stdout.startswith(
        "hami release: 200.0 MiB returned to the slice (this process: 364.0 MiB -> 164.0 MiB)")
    assert "  CuPy: 200.0 MiB" in r.stdout


# ---- framework_release in this process, with stand-in frameworks ----------------


class FakeSlice:
    """Stands in for the slice file: what this process holds, lowered by the fakes."""

    def __init__(self, used):
        self.used = used

    def memory_used(self, path):
        return self.used, "this process"


def fake_torch(calls, fake_slice, initialized=True, cached=0):
    def empty_cache():
        calls.append("torch.empty_cache")
        fake_slice.used -= cached

    cuda = types.SimpleNamespace(
        is_initialized=lambda: initialized,
        synchronize=lambda: calls.append("torch.synchronize"),
        empty_cache=empty_cache,
    )
    return types.SimpleNamespace(cuda=cuda)


def fake_cupy(calls, fake_slice, cached=0):
    def pool(name, freed):
        def free_all_blocks():
            calls.append(f"cupy.{name}.free_all_blocks")
            fake_slice.used -= freed
        return types.SimpleNamespace(free_all_blocks=free_all_blocks)

    device, pinned = pool("memory", cached), pool("pinned", 0)
    return types.SimpleNamespace(get_default_memory_pool=lambda: device,
                                 get_default_pinned_memory_pool=lambda: pinned)


@pytest.fixture
def no_frameworks(monkeypatch):
    for name in ("torch", "cupy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delenv("HAMI_SLICE", raising=False)
    return monkeypatch


def test_release_empties_both_frameworks(no_frameworks):
    calls, fake_slice = [], FakeSlice(1000 * MiB)
    no_frameworks.setattr(framework_release, "_memory_used", fake_slice.memory_used)
    no_frameworks.setitem(sys.modules, "torch", fake_torch(calls, fake_slice, cached=100 * MiB))
    no_frameworks.setitem(sys.modules, "cupy", fake_cupy(calls, fake_slice, cached=50 * MiB))
    report = framework_release.release("unused.slice")
    assert calls == ["torch.synchronize", "torch.empty_cache",
                     "cupy.memory.free_all_blocks", "cupy.pinned.free_all_blocks"]
    assert [(s.name, s.freed) for s in report.steps] == \
        [("gc.collect()", 0), ("PyTorch", 100 * MiB), ("CuPy", 50 * MiB)]
    assert report.freed == 150 * MiB and report.not_imported == []
    assert (report.before, report.after) == (1000 * MiB, 850 * MiB)
    assert report.text().startswith("hami release: 150.0 MiB returned to the slice "
                                    "(this process: 1000.0 MiB -> 850.0 MiB)")


def test_release_leaves_uninitialised_torch_alone(no_frameworks):
    calls, fake_slice = [], FakeSlice(0)
    no_frameworks.setattr(framework_release, "_memory_used", fake_slice.memory_used)
    no_frameworks.setitem(sys.modules, "torch", fake_torch(calls, fake_slice, initialized=False))
    report = framework_release.release("unused.slice")
    assert calls == []
    assert "CUDA not initialised" in report.steps[1].note
    assert report.not_imported == ["CuPy"]


def test_release_goes_on_after_a_failing_framework(no_frameworks):
    calls, fake_slice = [], FakeSlice(500 * MiB)
    no_frameworks.setattr(framework_release, "_memory_used", fake_slice.memory_used)
    torch = fake_torch(calls, fake_slice)
    torch.cuda.synchronize = lambda: (_ for _ in ()).throw(RuntimeError("device-side assert"))
    no_frameworks.setitem(sys.modules, "torch", torch)
    no_frameworks.setitem(sys.modules, "cupy", fake_cupy(calls, fake_slice, cached=20 * MiB))
    report = framework_release.release("unused.slice")
    assert report.steps[1].note == "failed: RuntimeError: device-side assert"
    assert report.steps[2].freed == 20 * MiB and report.freed == 20 * MiB


def test_release_with_nothing_loaded_and_no_slice(no_frameworks):
    report = framework_release.release()
    assert [s.name for s in report.steps] == ["gc.collect()"]
    assert report.freed is None and "not in a slice" in report.problem
    assert report.not_imported == ["PyTorch", "CuPy"]
    assert "torch" not in sys.modules and "cupy" not in sys.modules  # never imported
    assert "not measured" in report.text()
