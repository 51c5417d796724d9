"""Interception through dlsym and cuGetProcAddress/_v2: hooks where they belong,
the driver's own entry points everywhere else.

cudrive reports, for every pointer it resolves, the file dladdr() places it in
("lib"), so "is this the hook or the driver?" is answered inside one process
and address-space randomisation does not matter.
"""

from pathlib import Path

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GiB, MiB, SIM_CONTEXT

HOOK = "libvgpu.so"
DRIVER = "libcuda.so.1"


def lib(rec):
    return Path(rec.get("lib", "")).name


def resolve_both(cudrive, env, base, exported, version=12000, flags=0, v1=False):
    getproc = "getproc1" if v1 else "getproc"
    res = cudrive.run(f"{getproc} {base} {version} {flags} dlsym {exported}", env)
    via_proc = res.one(getproc)
    via_dlsym = res.one("dlsym")
    assert via_proc["rc"] == CUDA_SUCCESS and via_dlsym["rc"] == CUDA_SUCCESS, res.describe()
    return via_proc, via_dlsym


@pytest.mark.parametrize(
    "base, exported, flags",
    [
        ("cuMemAlloc", "cuMemAlloc_v2", 0),
        ("cuMemFree", "cuMemFree_v2", 0),
        ("cuMemGetInfo", "cuMemGetInfo_v2", 0),
        ("cuDeviceTotalMem", "cuDeviceTotalMem_v2", 0),
        ("cuMemAllocPitch", "cuMemAllocPitch_v2", 0),
        ("cuMemAllocManaged", "cuMemAllocManaged", 0),
        ("cuMemCreate", "cuMemCreate", 0),
        ("cuArrayCreate", "cuArrayCreate_v2", 0),
        ("cuMemAllocAsync", "cuMemAllocAsync", 0),
        ("cuMemAllocAsync", "cuMemAllocAsync_ptsz", 2),
        ("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 2),
    ],
)
def test_get_proc_address_gives_the_hook_dlsym_gives(cudrive, make_slice, base, exported, flags):
    s = make_slice()
    via_proc, via_dlsym = resolve_both(cudrive, s.env, base, exported, flags=flags)
    assert via_proc["ptr"] == via_dlsym["ptr"]
    assert lib(via_proc) == HOOK, via_proc
    assert via_proc["status"] == 0


def test_get_proc_address_v1_gives_the_hook(cudrive, make_slice):
    s = make_slice()
    via_proc, via_dlsym = resolve_both(cudrive, s.env, "cuMemAlloc", "cuMemAlloc_v2", v1=True)
    assert via_proc["ptr"] == via_dlsym["ptr"]
    assert lib(via_proc) == HOOK


def test_per_thread_stream_flag_gives_the_ptsz_hook(cudrive, make_slice):
    s = make_slice()
    res = cudrive.run("getproc cuMemAllocAsync 12000 2 getproc cuMemAllocAsync 12000 0 "
                      "dlsym cuMemAllocAsync_ptsz dlsym cuMemAllocAsync", s.env)
    ptsz, legacy = res.ops("getproc")
    dl_ptsz, dl_legacy = res.ops("dlsym")
    assert ptsz["ptr"] == dl_ptsz["ptr"] and legacy["ptr"] == dl_legacy["ptr"], res.describe()
    assert ptsz["ptr"] != legacy["ptr"], res.describe()
    assert lib(ptsz) == lib(legacy) == HOOK, res.describe()


def test_without_preload_everything_is_the_driver(cudrive, gpu):
    res = cudrive.run("getproc cuMemAlloc 12000 0 dlsym cuMemAlloc_v2 getproc cuMemAllocAsync 12000 2",
                      gpu.env())
    for rec in res.records:
        assert rec["rc"] == CUDA_SUCCESS and lib(rec) == DRIVER, res.describe()
    assert res.one("dlsym")["ptr"] == res.ops("getproc")[0]["ptr"], res.describe()


@pytest.mark.parametrize("base", ["cuDriverGetVersion", "cuGetExportTable"])
def test_entry_points_that_touch_no_context_pass_through(cudrive, make_slice, base):
    s = make_slice()
    via_proc, via_dlsym = resolve_both(cudrive, s.env, base, base)
    assert via_proc["ptr"] == via_dlsym["ptr"]
    assert lib(via_proc) == DRIVER, via_proc
    assert lib(via_dlsym) == DRIVER, via_dlsym


@pytest.mark.parametrize("base", ["cuDeviceGetName", "cuStreamCreate", "cuCtxGetCurrent"])
def test_other_unhooked_entry_points_get_the_parking_gate(cudrive, make_slice, base):
    """Every other driver function is handed out behind the parking gate
    (docs/parking.md): one thunk per function, the same through both paths."""
    s = make_slice()
    via_proc, via_dlsym = resolve_both(cudrive, s.env, base, base)
    assert via_proc["ptr"] == via_dlsym["ptr"]
    assert lib(via_proc) == HOOK, via_proc


@pytest.mark.parametrize("resolve", ["dlsym", "procaddr"])
def test_calls_through_the_gate_reach_the_driver(cudrive, make_slice, resolve):
    """Arguments pass through a thunk untouched, whatever the prototype."""
    res = cudrive.run(f"resolve {resolve} init count uuid 0 ctx 0 alloc 1m a write a 7 check a 7",
                      make_slice().env)
    assert all(r["rc"] == CUDA_SUCCESS for r in res.records), res.describe()
    assert res.one("count")["count"] >= 1 and res.one("check")["equal"], res.describe()


def test_unknown_symbol_gets_the_drivers_answer(cudrive, make_slice, gpu):
    script = "getproc cuNoSuchEntryPoint 12000 0 dlsym cuNoSuchEntryPoint"
    bare = cudrive.run(script, gpu.env())
    hooked = cudrive.run(script, make_slice().env)
    b, h = bare.one("getproc"), hooked.one("getproc")
    assert (h["rc"], h["status"], h["ptr"]) == (b["rc"], b["status"], b["ptr"]), (bare.describe(), hooked.describe())
    assert h["rc"] != CUDA_SUCCESS and h["ptr"] == "0x0"
    assert hooked.one("dlsym")["ptr"] == "0x0"


def test_null_function_pointer_output(cudrive, make_slice):
    res = cudrive.run("null getproc", make_slice().env)
    rec = res.one("null")
    # cudrive reports a crash as rc -1 (CUDRIVE_CRASH): the answer must be the error code.
    assert (rec["rc"], rec["rc_v1"]) == (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE), res.describe()


@pytest.mark.parametrize("resolve", ["dlsym", "procaddr", "procaddr1", "procaddr 12000 2"])
def test_cap_holds_on_every_resolution_path(cudrive, make_slice, gpu, resolve):
    s = make_slice(limit="1g", overhead="64m")
    res = cudrive.run(f"resolve {resolve} init ctx 0 meminfo totalmem 0 "
                      "alloc 256m alloc 256m alloc 256m alloc 256m "
                      "managed 256m pitch 1024 262144 4 async 128m", s.env)
    assert res.one("resolve")["rc"] == 0, res.describe()
    info = res.one("meminfo")
    assert (info["total"], info["free"]) == (GiB, GiB - SIM_CONTEXT), res.describe()
    assert res.one("totalmem")["total"] == GiB, res.describe()
    # 64m of context + 3 x 256m leaves 192m: no 256m call of any kind fits; 128m does.
    assert res.rcs("alloc") == [0, 0, 0, CUDA_ERROR_OUT_OF_MEMORY], res.describe()
    assert res.one("managed")["rc"] == CUDA_ERROR_OUT_OF_MEMORY, res.describe()
    assert res.one("pitch")["rc"] == CUDA_ERROR_OUT_OF_MEMORY, res.describe()
    assert res.one("async")["rc"] == 0, res.describe()
    assert gpu.peak(0) <= GiB


def test_charges_through_get_proc_address_match_dlsym(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("resolve procaddr")
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 100m a")
    p.ok("managed 50m b")
    assert s.used(0) == SIM_CONTEXT + 150 * MiB
    p.ok("free a")
    p.ok("free b")
    assert s.used(0) == SIM_CONTEXT
