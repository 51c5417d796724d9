"""Parking from the command line, the admin panel and %hami status, without a server.

Kernels are started by jupyter_client through the provisioner, on the
simulated GPU; ``hami-jupyter park|resume`` and the admin panel's buttons park
and resume them; ``%hami status`` and ``hami-jupyter status`` show parked
memory as parked. docs/parking.md.
"""

import re

import pytest

from hami_jupyter.admin import AdminPanel
from hami_jupyter.commands.cli import main
from hami_jupyter.slice.file import read_snapshot
from hami_jupyter.slice.parking import kernel_slots, park_state
from hami_jupyter.slice.status import slice_status

MiB = 1 << 20
CONTEXT = 64 * MiB

FILL = ("from hami_jupyter import driver_memory as c\n"
        "c.init()\n"
        "held = c.DeviceBuffer(256 << 20)\n"
        "held.write(b'parked' * 1000)\n")
CHECK = "print(held.read(6000) == b'parked' * 1000)"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def parked_kernel(start_kernel, cell, hami_env, capsys):
    km, kc = start_kernel(memory_limit="1g")
    assert cell(kc, FILL).error is None
    code, out, err = run(capsys, "park", km.kernel_id)
    assert code == 0, err
    return km, kc, km.provisioner.slice_path, out


def test_park_and_resume_on_the_command_line(parked_kernel, capsys, cell):
    km, kc, path, out = parked_kernel
    assert out.startswith(f"parked kernel {km.kernel_id}: 320.0 MiB moved to host memory in ")
    assert park_state(read_snapshot(path), km.kernel_id) == "parked"
    code, out, _ = run(capsys, "status")
    assert code == 0 and "parked on request: 320.0 MiB in host memory" in out  # and why
    assert "parked 320.0 MiB in host memory" in out
    code, out, err = run(capsys, "resume", km.kernel_id)
    assert code == 0 and out.startswith(f"resumed kernel {km.kernel_id}: 320.0 MiB back on the GPU"), err
    assert cell(kc, CHECK).stdout == "True\n"
    code, out, _ = run(capsys, "resume", km.kernel_id)
    assert code == 0 and "was not parked" in out


def test_park_refuses_with_a_reason(start_kernel, capsys, hami_env):
    slice_root = hami_env.root
    km, _ = start_kernel(memory_limit="1g")
    code, _, err = run(capsys, "park", km.kernel_id)
    assert code == 1 and "no process of kernel" in err  # nothing on the GPU yet
    code, _, err = run(capsys, "park", "no-such-kernel")
    assert code == 1
    assert (f"no process of kernel no-such-kernel runs in a slice under {slice_root}: check the "
            "kernel id") in err  # where it looked
    code, _, err = run(capsys, "resume", "no-such-kernel")
    assert code == 1 and f"no process of kernel no-such-kernel runs in a slice under {slice_root}" in err


def test_hami_status_in_the_parked_kernel_itself_brings_nothing_back(parked_kernel, cell):
    """%hami status reads the slice file only: it shows the kernel parked and
    leaves it so (no CUDA call); the next CUDA call brings it back."""
    km, kc, path, _ = parked_kernel
    shown = cell(kc, "%hami status --json")
    assert shown.error is None
    status = slice_status(path)
    [mine] = [k for k in status["kernels"] if k["kernel_id"] == km.kernel_id]
    assert mine["park_state"] == "parked" and mine["memory_parked"] == CONTEXT + 256 * MiB
    assert mine["memory_used"] == 0
    assert cell(kc, CHECK).stdout == "True\n"
    assert park_state(read_snapshot(path), km.kernel_id) == "running"


def test_the_admin_panel_parks_and_resumes(start_kernel, cell, hami_env):
    km, kc = start_kernel(memory_limit="1g")
    assert cell(kc, FILL).error is None
    panel = AdminPanel(hami_env.root, gpu_source=lambda: ([], None), start=False)
    form = next(iter(panel.forms.values()))
    assert [b.children[0].description for b in form.kernel_rows.children] == ["Park"]
    text = form.park_or_resume(km.kernel_id, "Park")
    assert text and text.startswith(f"parked kernel {km.kernel_id}: 320.0 MiB")
    assert [b.children[0].description for b in form.kernel_rows.children] == ["Resume"]
    shown = re.sub(r"<[^>]+>", "", form.kernel_rows.children[0].children[1].value)  # as a reader sees it
    assert "parked, 320.0 MiB in host memory" in shown
    assert form.park_or_resume(km.kernel_id, "Resume").startswith(f"resumed kernel {km.kernel_id}")
    assert cell(kc, CHECK).stdout == "True\n"
    assert [s.park_state for s in kernel_slots(read_snapshot(km.provisioner.slice_path),
                                               km.kernel_id)] == [0]
