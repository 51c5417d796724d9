"""The guard's figures in ``slice_status`` and its text and HTML, beside the
slice's own: a fake guard (tests/fake_guard.py) writes ``guard.json`` into
the slice root, and a ``cudrive`` process under the preload library holds
memory of the slice on the simulated GPU (64 MiB of context each).
"""

import json
import selectors
import subprocess
import time

import pytest
from fake_guard import seen, write_guard

from hami_jupyter import native
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.guard_report import report_path
from hami_jupyter.slice.settings import resolve_limits
from hami_jupyter.slice.status import format_text, slice_status
from hami_jupyter.slice.status_html import format_html

MiB = 1 << 20
GIB = 1 << 30
USED = 164 * MiB  # 100 MiB and the context
WAIT_S = 30

NO_GUARD = {"memory_real": None, "guard_state": None, "guard_limit": None, "guard_reported": None}


def hold(path, mib, sim_state):
    """A process of the slice at *path* holding *mib* MiB on GPU 0 until killed."""
    env = native.sim_env(sim_state, LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(path))
    proc = subprocess.Popen([str(native.cudrive_path()), "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    for line in ("init", "ctx 0", f"alloc {mib}m"):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        assert sel.select(WAIT_S), f"cudrive did not answer {line!r}"
        reply = json.loads(proc.stdout.readline())
        assert reply["rc"] == 0, reply
    return proc


@pytest.fixture
def alice(hami_env):
    """The slice alice (256 MiB cap) with 164 MiB in use on GPU 0: (path, GPU uuid)."""
    path = hami_env.root / "alice.slice"
    ensure_slice(path, "alice", resolve_limits({"memory_limit": "256m"}, {}))
    proc = hold(path, 100, hami_env.sim_state)
    (gpu,) = slice_status(path)["gpus"]
    yield path, gpu["uuid"]
    proc.kill()
    proc.wait(timeout=WAIT_S)


def test_without_a_guard_the_figures_are_the_slices_own(alice):
    path, _ = alice
    status = slice_status(path)
    (gpu,) = status["gpus"]
    assert gpu["memory_used"] == USED
    assert {k: gpu[k] for k in NO_GUARD} == NO_GUARD
    assert status["guard"] == {"running": False, "action": None, "written_unix": None, "error": None, "elsewhere": [], "parked": []}
    text, html = format_text(status), format_html(status)
    assert "(guard)" not in text and "OVER CAP" not in text
    assert "hami-guard" not in html


def test_a_guard_over_the_cap_shows_everywhere_the_status_does(alice):
    path, uuid = alice
    report = write_guard(path.parent, {"alice": {uuid: seen(400 * MiB, USED, 256 * MiB, "over")}})
    status = slice_status(path)
    (gpu,) = status["gpus"]
    assert (gpu["memory_used"], gpu["memory_real"], gpu["guard_state"]) == (USED, 400 * MiB, "over")
    assert (gpu["guard_limit"], gpu["guard_reported"]) == (256 * MiB, USED)
    assert status["guard"] == {"running": True, "action": "kill",
                               "written_unix": report["written_unix"], "error": None, "elsewhere": [], "parked": []}

    over = ("the guard sees 400.0 MiB really in use on this GPU, over the 256.0 MiB cap "
            "(the slice counts 164.0 MiB); the guard's action: kill")
    text = format_text(status)
    assert "164.0 MiB / 256.0 MiB (64 %), real 400.0 MiB (guard)" in text
    assert f"    OVER CAP: {over}" in text.splitlines()
    html = format_html(status)
    assert '<span class="hami-guard-real">real 400.0 MiB (guard)</span>' in html
    assert 'class="hami-guard-over"' in html and f"Over the cap: {over}." in html.replace("&#x27;", "'")


def test_real_is_shown_only_when_it_differs_by_more_than_16_mib_and_2_percent(alice):
    path, uuid = alice
    slack = 16 * MiB + int(0.02 * USED)
    for real, shown in ((USED + slack - MiB, False), (USED - slack + MiB, False),
                        (USED + slack + MiB, True), (USED - slack - MiB, True)):
        write_guard(path.parent, {"alice": {uuid: seen(real, USED, 256 * MiB, "ok")}})
        status = slice_status(path)
        assert status["gpus"][0]["memory_real"] == real
        assert ("(guard)" in format_text(status)) is shown, real
        assert ("hami-guard-real" in format_html(status)) is shown, real
        assert "OVER CAP" not in format_text(status)


def test_a_guard_that_stopped_writing_is_not_believed(alice):
    path, uuid = alice
    written = time.time() - 600
    write_guard(path.parent, {"alice": {uuid: seen(400 * MiB, USED, 256 * MiB, "over")}},
                written_unix=written, action="report")
    status = slice_status(path)
    assert {k: status["gpus"][0][k] for k in NO_GUARD} == NO_GUARD
    assert status["guard"] == {"running": False, "action": "report", "written_unix": written,
                               "error": None, "elsewhere": [], "parked": []}
    assert "OVER CAP" not in format_text(status) and "(guard)" not in format_text(status)


def test_a_fresh_guard_that_saw_nothing_of_the_slice(alice):
    path, uuid = alice
    write_guard(path.parent, {"bob": {uuid: seen(GIB, GIB, GIB, "ok")}})
    (gpu,) = slice_status(path)["gpus"]
    assert (gpu["memory_real"], gpu["guard_state"]) == (0, "ok")  # no process of alice on it
    assert "real 0 B (guard)" in format_text(slice_status(path))
    # A GPU the guard could not read is unknown, not empty.
    write_guard(path.parent, {}, errors=[f"GPU {uuid}: NVML: Unknown Error"])
    (gpu,) = slice_status(path)["gpus"]
    assert {k: gpu[k] for k in NO_GUARD} == NO_GUARD


def test_an_unreadable_report_never_fails_the_status(alice):
    path, _ = alice
    report_path(path.parent).write_text("{not json")
    status = slice_status(path)
    assert status["gpus"][0]["memory_used"] == USED and status["gpus"][0]["memory_real"] is None
    assert status["guard"]["running"] is False
    assert status["guard"]["error"] == f"the guard's report {report_path(path.parent)} is not JSON"
    report_path(path.parent).write_text(json.dumps({"version": 1, "written_unix": time.time(),
                                                    "slices": ["alice"]}))
    status = slice_status(path)  # the right version, the wrong shape: nothing of it believed
    assert status["guard"]["running"] is True and status["gpus"][0]["memory_real"] is None


def test_the_rest_answer_carries_what_the_guard_parked_and_a_held_gpu(alice):
    """Issue 27, item 2: what the JupyterLab panel shows comes over REST: the
    guard's parked processes of the slice (with the reason) and, per GPU,
    since when the slice is held over a cap lowered below its use; the
    top-level cap is the one in force."""
    from hami_jupyter.server.kernel_slices import summary
    from hami_jupyter.slice.change import set_memory_limit
    from hami_jupyter.slice.guard_report import write_report

    path, uuid = alice
    set_memory_limit(path, None, 128 * MiB)  # an administrator's shrink below the 164 MiB in use
    report = write_guard(path.parent, {"alice": {uuid: seen(USED, USED, 128 * MiB, "held")}}, action="park")
    why = "held 1.5 GiB past the slice's cap without the preload library"
    write_report({**report, "parked": [{"pid": 4242, "slice": "alice", "user": "alice",
                                        "command": "python train.py", "uuid": uuid,
                                        "process_bytes": 3 * GIB // 2, "unix": 1.0, "why": why}]},
                 path.parent)
    body = summary(slice_status(path), "k1")
    (gpu,) = body["gpus"]
    assert body["memory_limit"] == gpu["memory_limit"] == 128 * MiB
    assert gpu["over_cap_since"] is not None
    (parked,) = body["guard"]["parked"]
    assert (parked["pid"], parked["why"], parked["command"]) == (4242, why, "python train.py")
