"""The server log's line for a kernel start states the limits in force.

Issue 12, item 7(a): the log said ``starts in slice .../alice.slice (memory
64.0 GiB; kept)`` while the cap in force was 40 GiB (a GPU with a limit of its
own in the hub's limits file). The line must give the limits the slice holds
its processes to, every GPU with a limit of its own, and whose they are.
"""

import getpass
import logging

from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.create import create_limits_file, create_slice

GiB = 1 << 30
USER = getpass.getuser()
SIM_GPU0 = "GPU-5a1f0000-0000-4000-8000-000000000000"  # the simulated GPU's first UUID
MEM = "from hami_jupyter import driver_memory as cuda; cuda.init(); print(cuda.mem_get_info()[1])"


def start_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and " starts in slice " in r.getMessage()]


def test_start_line_gives_the_hubs_per_gpu_cap(hami_env, start_kernel, cell, caplog):
    caplog.set_level(logging.INFO)
    path = hami_env.root / f"{USER}.slice"
    default = Limits(memory_limit=8 * GiB, sm_share=60, mode="hard")
    create_slice(path, USER, default, devices=[(SIM_GPU0, 16 * GiB)])
    create_limits_file(path, default, device_limits={0: Limits(memory_limit=5 * GiB, sm_share=60)})

    km, kc = start_kernel(env={"HAMI_MEMORY_LIMIT": "8g", "HAMI_SM_LIMIT": "60"})
    (line,) = start_lines(caplog)
    assert str(path) in line
    assert f"GPU {SIM_GPU0}: memory 5.0 GiB" in line, line
    assert "memory 8.0 GiB, SM 60 % (hard) by default" in line, line
    assert f"the hub's limits file {path.with_suffix('.limits')}" in line, line
    assert "; kept)" not in line
    # What the line says is what the kernel meets.
    r = cell(kc, MEM)
    assert r.error is None and int(r.stdout) == 5 * GiB, r


def test_start_line_names_the_limits_file_in_force(hami_env, start_kernel, caplog):
    caplog.set_level(logging.INFO)
    path = hami_env.root / f"{USER}.slice"
    held = Limits(memory_limit=2 * GiB)
    create_slice(path, USER, held)
    create_limits_file(path, held)
    start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    (line,) = start_lines(caplog)
    assert "under memory 2.0 GiB, SM unlimited (limits in force, from the hub's limits file" in line, line


def test_start_line_of_a_slice_the_start_creates(hami_env, start_kernel, caplog):
    caplog.set_level(logging.INFO)
    start_kernel(env={"HAMI_MEMORY_LIMIT": "1g"})
    (line,) = start_lines(caplog)
    assert "under memory 1.0 GiB, SM unlimited (limits in force, from the slice file, created now)" in line
