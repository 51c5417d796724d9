"""Issue 28, item 1: an administrator sets and sees a slice's guarantee wherever limits are set.

``hami-jupyter slice set --guarantee``, ``slice list``, the admin panel's form
and the root admin service all go through :mod:`hami_jupyter.admin.changes`:
a guarantee is a size checked like a cap, never above the cap, logged like
every change, and it is what a slice is promised on a GPU (rule 2: the
promises must fit the GPU; caps above them lend). Real slice files, no
kernels: every test here takes well under a second.
"""

import html

import pytest

from hami_jupyter import audit, gpus
from hami_jupyter.admin import AdminPanel, service
from hami_jupyter.admin.cli import main
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.settings import resolve_limits

GiB = 1 << 30
UUID = "GPU-f0000000-0000-0000-0000-000000000001"
ONE_GPU = ([gpus.HostGpu(0, UUID, "Fake H100", 16 * GiB, memory_used=GiB, utilization=7)], None)


def make_slice(root, name, **configured):
    path = root / f"{name}.slice"
    ensure_slice(path, name, resolve_limits(configured, {}))
    return path


def run(capsys, *argv):
    code = main(["slice", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def fallback(path):
    return read_snapshot(path).fallback_limit


@pytest.fixture
def one_gpu(monkeypatch):
    """The CLI sees one 16 GiB GPU."""
    import hami_jupyter.admin.cli as admin_cli

    monkeypatch.setattr(admin_cli, "read_gpus", lambda: ONE_GPU)


def test_cli_sets_a_guarantee_logs_it_and_lists_it(hami_env, capsys, one_gpu):
    path = make_slice(hami_env.root, "alice", memory_limit="8g")
    code, out, err = run(capsys, "set", "alice", "--guarantee", "2g")
    assert code == 0, err
    assert "applied: slice 'alice', default (every GPU without limits of its own): memory 8.0 GiB, " \
           "SM unlimited -> memory 8.0 GiB (2.0 GiB guaranteed), SM unlimited" in out
    assert fallback(path).memory_guarantee == 2 * GiB
    [record] = audit.read_records(audit.default_path(hami_env.root))
    assert (record["old"]["memory_guarantee"], record["new"]["memory_guarantee"]) == (0, 2 * GiB)

    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "each GPU gets: 8.0 GiB (guaranteed 2.0 GiB of the 8.0 GiB cap)" in out
    assert "SLICE  GPU  USED  CAP      GUARANTEED  REAL" in out
    assert "alice  -    0 B   8.0 GiB  2.0 GiB     -" in out
    assert f"GPU {UUID} Fake H100: 2.0 GiB of 16.0 GiB guaranteed to slices (alice 2.0 GiB); " \
           "caps 8.0 GiB" in out

    # 0 and default: no guarantee of its own, the cap is the guarantee again.
    for none in ("0", "default"):
        run(capsys, "set", "alice", "--guarantee", "3g")
        code, _, err = run(capsys, "set", "alice", "--guarantee", none)
        assert code == 0, err
        assert fallback(path).memory_guarantee == 0
    code, out, _ = run(capsys, "list")
    assert "GUARANTEED" not in out and "guaranteed" not in out


@pytest.mark.parametrize("argv, message", [
    (["--guarantee", "9g"], "a guarantee of 9.0 GiB is above the memory cap of 8.0 GiB: the slice "
                            "could never use it; give at most 8.0 GiB, or raise the cap too"),
    (["--memory", "1g"], "the new cap of 1.0 GiB is below the slice's guarantee of 2.0 GiB; lower "
                         "the guarantee too (--guarantee), or choose a cap of at least 2.0 GiB"),
    (["--memory", "3g", "--guarantee", "4g"], "a guarantee of 4.0 GiB is above the memory cap of "
                                              "3.0 GiB"),
])
def test_cli_refuses_a_guarantee_above_the_cap_and_changes_nothing(hami_env, capsys, one_gpu,
                                                                     argv, message):
    path = make_slice(hami_env.root, "alice", memory_limit="8g")
    assert run(capsys, "set", "alice", "--guarantee", "2g")[0] == 0
    logged = len(audit.read_records(audit.default_path(hami_env.root)))
    code, out, err = run(capsys, "set", "alice", *argv)
    assert code == 1 and out == "" and message in err and "Traceback" not in err
    assert (fallback(path).memory_limit, fallback(path).memory_guarantee) == (8 * GiB, 2 * GiB)
    assert len(audit.read_records(audit.default_path(hami_env.root))) == logged


@pytest.mark.parametrize("value, message", [
    ("-1g", "--guarantee: '-1g' is negative"),
    ("4x", "--guarantee: guarantee '4x' is not a size"),
])
def test_cli_refuses_a_malformed_guarantee_as_a_usage_error(hami_env, capsys, value, message):
    path = make_slice(hami_env.root, "alice", memory_limit="8g")
    code, out, err = run(capsys, "set", "alice", f"--guarantee={value}")
    assert code == 2 and out == "" and message in err
    assert read_snapshot(path).limits_generation == 0


def test_guarantees_are_what_a_gpu_promises_and_caps_above_them_lend(hami_env, capsys, one_gpu):
    alice = make_slice(hami_env.root, "alice", memory_limit="10g")
    bob = make_slice(hami_env.root, "bob", memory_limit="4g")
    # Today's rule, unchanged without guarantees: 10 + 8 GiB of hard caps do not fit 16 GiB.
    code, _, err = run(capsys, "set", "bob", "--memory", "8g")
    assert code == 1 and "hard slices would be promised 18.0 GiB of its 16.0 GiB" in err

    # alice keeps 4 GiB whatever happens; the 6 GiB above it are lent: bob fits.
    assert run(capsys, "set", "alice", "--guarantee", "4g")[0] == 0
    code, out, err = run(capsys, "set", "bob", "--memory", "8g")
    assert code == 0, err
    assert "the caps come to 18.0 GiB of its 16.0 GiB; above the guarantees that memory is lent" in out
    assert fallback(bob).memory_limit == 8 * GiB

    # A guarantee that would promise more than the GPU has is refused, naming the holders.
    code, _, err = run(capsys, "set", "alice", "--guarantee", "9g")
    assert code == 1
    assert "slices would be promised 17.0 GiB of its 16.0 GiB (bob 8.0 GiB, alice 9.0 GiB)" in err
    assert fallback(alice).memory_guarantee == 4 * GiB


def test_the_panel_form_shows_and_sets_the_guarantee(hami_env):
    path = make_slice(hami_env.root, "alice", memory_limit="8g")
    panel = AdminPanel(hami_env.root, gpu_source=lambda: ONE_GPU, start=False)
    try:
        form = panel.forms["alice"]
        assert form.guarantee.value == "whole cap"  # none set: the cap is the guarantee
        assert form.guarantee.description == "always kept"  # issue 41, item 4: plain words
        form.guarantee.value = "12g"
        assert "a guarantee of 12.0 GiB is above the memory cap of 8.0 GiB" in html.unescape(
            form.message.value)  # checked before Apply
        form.guarantee.value = "x"
        assert form.apply() is None and "guarantee 'x' is not a size" in form.errors[0]
        form.guarantee.value = "2g"
        assert form.apply() is not None, form.errors
        assert fallback(path).memory_guarantee == 2 * GiB
        assert form.guarantee.value == "2.0 GiB" and form.memory.value == "8.0 GiB"
        assert 'class="hami-guarantee"' not in form.status.value  # no GPU yet: no GPU's row
        assert "each GPU gets: 8.0&nbsp;GiB (guaranteed 2.0&nbsp;GiB of the 8.0&nbsp;GiB cap)" \
            in form.status.value
        # Back to none, in the words the form shows it.
        form.guarantee.value = "whole cap"
        assert form.pending() == {"guarantee": "default"}
        assert form.apply() is not None, form.errors
        assert fallback(path).memory_guarantee == 0 and form.guarantee.value == "whole cap"
    finally:
        panel.stop()


def test_the_admin_service_applies_a_guarantee(hami_env):
    path = make_slice(hami_env.root, "alice", memory_limit="8g")
    svc = service.AdminService(hami_env.root).start()
    try:
        change = service.remote_apply(service.socket_path(hami_env.root), path,
                                      {"guarantee": "3g"})
    finally:
        svc.close()
    assert change.applied and change.fields == ("memory_guarantee",)
    assert fallback(path).memory_guarantee == 3 * GiB
    [record] = audit.read_records(audit.default_path(hami_env.root))
    assert record["via"] == "admin-service" and record["new"]["memory_guarantee"] == 3 * GiB
