"""Every seam fails closed: no path leaves a process less limited than asked.

Each test sets up one way a process used to end up uncapped or hung (a
half-made GPU entry, a full slice, a FIFO or a foreign folder for a slice
file, a limits file that cannot be looked for, a lookup path the library did
not intercept) and checks that the process is either held to its cap or
refused CUDA with a line on stderr that says why and what to do.
"""

import ctypes
import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from hami_jupyter.slice.limits import Limits
from hami_jupyter.slice.layout import HAMI_DEVICE_CLAIMING, HAMI_DEVICE_READY, HamiSliceDevice, HamiSliceFile
from hami_jupyter.slice.create import create_limits_file

from native_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GiB, NATIVE

CUDA_ERROR_NOT_READY = 600
NOBODY = 65534


def edit_slice(path, change):
    """Apply *change* to the slice file as a HamiSliceFile (no process runs in it)."""
    with open(path, "r+b") as fh:
        f = HamiSliceFile.from_buffer_copy(fh.read(ctypes.sizeof(HamiSliceFile)))
        change(f)
        fh.seek(0)
        fh.write(bytes(f))


def half_claimed(f):
    f.device[0].state = HAMI_DEVICE_CLAIMING  # its claimer died between the two steps
    f.device[0].uuid = b"GPU-half-written"


def entry_offset(i):
    """Where GPU entry *i* starts in the file (its claim lock is on that byte)."""
    return HamiSliceFile.device.offset + i * ctypes.sizeof(HamiSliceDevice)


def made_slice(cudrive, make_slice, **env):
    """A slice file that one earlier process made (both simulated GPUs entered)."""
    s = make_slice(**env)
    res = cudrive.run("init", s.env)
    assert res.one("init")["rc"] == CUDA_SUCCESS, res.describe()
    return s


def hami_errors(res):
    return "\n".join(res.hami_lines())


# ---- GPU entries -----------------------------------------------------------------------------


def test_an_entry_left_half_claimed_by_a_dead_process_is_repaired(cudrive, make_slice):
    s = made_slice(cudrive, make_slice, limit="1g")
    edit_slice(s.path, half_claimed)
    res = cudrive.run("init ctx 0 alloc 2g alloc 512m", s.env)
    assert res.one("init")["rc"] == CUDA_SUCCESS, res.describe()
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS], res.describe()
    assert "half-claimed" in hami_errors(res)
    uuids = [d.uuid for d in s.snapshot().devices]
    assert "GPU-half-written" not in uuids and len(set(uuids)) == len(uuids) == 2, uuids


def test_nvml_does_not_wait_on_a_dead_claim(cudrive, make_slice):
    s = made_slice(cudrive, make_slice, limit="1g")
    edit_slice(s.path, half_claimed)
    res = cudrive.run("nvml nvmlmem 0", s.env)
    mem = res.one("nvmlmem")
    assert mem["rc"] == 0 and mem["total"] == GiB, res.describe()  # the slice's fallback limit


def test_a_live_claim_that_does_not_finish_refuses_cuda(cudrive, make_slice, tmp_path):
    s = made_slice(cudrive, make_slice, limit="1g")
    edit_slice(s.path, half_claimed)
    # A process stuck half-way through its claim: it holds the entry's lock.
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({str(s.path)!r}, os.O_RDWR)
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, {entry_offset(0)})
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        res = cudrive.run("init ctx 0 alloc 2g", s.env)
        assert res.one("init")["rc"] == CUDA_ERROR_NOT_READY, res.describe()
        assert res.rcs("alloc") != [CUDA_SUCCESS]
        assert "rather than leave that GPU unlimited" in hami_errors(res)
    finally:
        holder.kill()
        holder.wait()


def test_a_slice_with_no_room_for_a_gpu_refuses_cuda(cudrive, make_slice):
    s = made_slice(cudrive, make_slice, limit="1g")
    def full(f):  # 16 other GPUs (MIG instances, say) fill the slice
        for i in range(len(f.device)):
            f.device[i].uuid = f"MIG-{i:08x}-0000-0000-0000-000000000000".encode()
            f.device[i].state = HAMI_DEVICE_READY

    edit_slice(s.path, full)
    res = cudrive.run("init ctx 0 alloc 2g", s.env)
    assert res.one("init")["rc"] == CUDA_ERROR_OUT_OF_MEMORY, res.describe()
    assert res.rcs("alloc") != [CUDA_SUCCESS]
    err = hami_errors(res)
    assert "has no room for GPU 0" in err and "CUDA_VISIBLE_DEVICES" in err, err


# ---- what HAMI_SLICE names -------------------------------------------------------------------


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


@pytest.mark.parametrize("kind, make, word", [
    ("fifo", _fifo, "FIFO"),
    ("directory", os.mkdir, "directory"),
    ("socket", _socket, "socket"),
])
@pytest.mark.parametrize("script", ["nvml nvmlmem 0", "init ctx 0 alloc 2g"])
def test_a_slice_that_is_not_a_regular_file_is_refused_at_once(cudrive, make_slice, tmp_path, kind, make,
                                                                 word, script):
    s = make_slice(name=f"{kind}.slice", limit="1g")
    keep = make(s.path)
    try:
        res = cudrive.run(script, s.env, timeout=20)  # a FIFO used to block NVML-only processes here
    finally:
        if keep is not None:
            keep.close()
    assert res.rcs("alloc") != [CUDA_SUCCESS], res.describe()
    err = hami_errors(res)
    assert str(s.path) in err and word in err, res.describe()


def test_a_dangling_symbolic_link_is_refused_with_a_message(cudrive, make_slice, tmp_path):
    s = make_slice(name="link.slice", limit="1g")
    os.symlink(tmp_path / "gone.slice", s.path)
    for script in ("nvml nvmlmem 0", "init ctx 0 alloc 2g"):
        res = cudrive.run(script, s.env)
        err = hami_errors(res)
        assert "symbolic link" in err and "gone.slice" in err, res.describe()
        assert res.rcs("alloc") != [CUDA_SUCCESS]


# ---- whose folder, whose file ----------------------------------------------------------------


@pytest.fixture
def foreign_folder(tmp_path):
    """A slice folder another user made first (as /tmp/hami-jupyter-<uid> could be)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a folder to another user")
    tmp_path.chmod(0o755)
    folder = tmp_path / "planted"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    return folder


def test_a_slice_folder_owned_by_another_user_is_refused(cudrive, make_slice, foreign_folder):
    s = make_slice(name="planted/victim.slice", limit="1g")
    res = cudrive.run("init ctx 0 alloc 512m", s.env)
    assert res.one("init")["rc"] != CUDA_SUCCESS, res.describe()
    err = hami_errors(res)
    assert "belongs to uid 65534" in err and "HAMI_SLICE_ROOT" in err, err
    assert not (foreign_folder / "victim.slice").exists()  # nothing written into it


def test_a_slice_file_planted_by_another_user_is_refused(cudrive, make_slice, tmp_path):
    """As /tmp/cudevshr.cache could be: made first by someone else in a shared folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a file to another user")
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    s = make_slice(name="shared/cudevshr.cache", limit="1g")
    assert cudrive.run("init", s.env).one("init")["rc"] == CUDA_SUCCESS  # ours: fine
    os.chown(s.path, NOBODY, NOBODY)
    res = cudrive.run("init", s.env)
    assert res.one("init")["rc"] != CUDA_SUCCESS
    assert "belongs to uid 65534" in hami_errors(res)


def test_a_folder_every_user_can_write_is_refused_unless_sticky(cudrive, make_slice, tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    s = make_slice(name="open/team.slice", limit="1g")
    res = cudrive.run("init", s.env)
    assert res.one("init")["rc"] != CUDA_SUCCESS
    assert "writable by every user" in hami_errors(res)
    folder.chmod(0o1777)  # as /tmp: nobody can swap our files there
    res = cudrive.run("init ctx 0 alloc 2g", s.env)
    assert res.one("init")["rc"] == CUDA_SUCCESS, res.describe()
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert stat.S_IMODE(s.path.stat().st_mode) == 0o600  # slots are nobody else's to read


def test_a_limits_file_of_another_user_fails_closed(cudrive, make_slice, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a file to another user")
    s = made_slice(cudrive, make_slice, limit="1g")
    lpath, _ = create_limits_file(s.path, Limits(memory_limit=GiB))
    os.chown(lpath, NOBODY, NOBODY)
    res = cudrive.run("init ctx 0 alloc 2g", s.env)
    assert res.one("init")["rc"] != CUDA_SUCCESS
    assert "belongs to uid 65534" in hami_errors(res)


def test_a_limits_file_that_cannot_be_looked_for_fails_closed(cudrive, make_slice, tmp_path):
    """The slice path fits PATH_MAX, "<path>.limits" does not: the hub's limits
    must not be traded for the user-owned block in the slice file."""
    s = made_slice(cudrive, make_slice, name="team.slice", limit=None)  # in-file block: no limit
    create_limits_file(s.path, Limits(memory_limit=GiB))  # the hub's: 1 GiB
    padding = 4095 - len(f"{tmp_path}/team.slice")
    long_path = f"{tmp_path}/{'./' * (padding // 2)}{'/' * (padding % 2)}team.slice"
    assert len(long_path) == 4095 and os.path.samefile(long_path, s.path)
    env = dict(s.env, HAMI_SLICE=long_path)
    res = cudrive.run("init ctx 0 alloc 2g", env)
    assert res.rcs("alloc") != [CUDA_SUCCESS], res.describe()
    assert "cannot be looked for" in hami_errors(res)


# ---- lookups ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unoptimised_lib(hami_build):
    """libvgpu.so built at -O0, where a tail call from C is never made."""
    if hami_build.asan:
        pytest.skip("the -O0 build is checked in the release pass")
    out = NATIVE / "build-O0"
    res = subprocess.run(["make", "-C", str(NATIVE), f"OUT={out}", "OPT=-O0 -g", "all"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:]
    return out / "libvgpu.so"


@pytest.mark.parametrize("lookup", ["next", "default", "dlsym"])
@pytest.mark.parametrize("build", ["release", "O0"])
def test_every_dlsym_lookup_of_an_application_gets_the_hook(cudrive, make_slice, request, lookup, build):
    env = make_slice(limit="1g").env
    if build == "O0":
        env["LD_PRELOAD"] = str(request.getfixturevalue("unoptimised_lib"))
    res = cudrive.run(f"resolve {lookup} init ctx 0 alloc 2g alloc 512m", env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS], res.describe()


def test_an_unknown_pointer_for_a_hooked_name_is_refused(cudrive, make_slice):
    env = make_slice(limit="1g").env
    env["HAMI_SIM_INTERNAL_PROCS"] = "1"  # the driver hands out an internal cuMemAlloc
    res = cudrive.run("resolve procaddr 12000 init ctx 0 alloc 2g", env)
    assert res.rcs("alloc") != [CUDA_SUCCESS], res.describe()
    assert 'cuGetProcAddress("cuMemAlloc", version 12000) returned an entry point' in hami_errors(res)
    # Without the preload the same driver answers, so the refusal is the library's.
    bare = dict(env)
    del bare["LD_PRELOAD"]
    assert cudrive.run("resolve procaddr 12000 init ctx 0 alloc 2g", bare).rcs("alloc") == [CUDA_SUCCESS]


# ---- environment against the slice file ------------------------------------------------------


def test_an_environment_limit_the_slice_file_overrides_is_said_once(cudrive, make_slice):
    s = made_slice(cudrive, make_slice, limit="1g")
    env = dict(s.env, CUDA_DEVICE_MEMORY_LIMIT="2g")
    res = cudrive.run("init ctx 0 alloc 1536m", env)
    assert res.rcs("alloc") == [CUDA_ERROR_OUT_OF_MEMORY], res.describe()  # the file's 1 GiB holds
    warnings = [line for line in res.hami_lines() if "environment asks for" in line]
    assert len(warnings) == 2, res.describe()  # one per GPU, each once
    assert "2.0 GiB" in warnings[0] and "1.0 GiB" in warnings[0] and "the slice file applies" in warnings[0]
    same = cudrive.run("init", s.env)
    assert not [line for line in same.hami_lines() if "environment asks for" in line]
