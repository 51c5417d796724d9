"""Memory answers sized to the slice: cuMemGetInfo, cuDeviceTotalMem, NVML v1 and v2."""

import pytest

from hami_jupyter.slice.change import set_memory_limit

from native_helpers import (
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    NVML_ERROR_INVALID_ARGUMENT,
    GiB,
    MiB,
    SIM_CONTEXT,
    SIM_MEMORY,
    wait_for,
)


def test_mem_get_info_is_sized_to_the_slice(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    res = cudrive.run("init ctx 0 meminfo alloc 1g meminfo", s.env)
    first, second = res.ops("meminfo")
    assert (first["total"], first["free"]) == (4 * GiB, 4 * GiB - SIM_CONTEXT), res.describe()
    assert (second["total"], second["free"]) == (4 * GiB, 3 * GiB - SIM_CONTEXT), res.describe()


def test_mem_get_info_counts_the_other_processes_of_the_slice(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    other = cudrive.start(s.env)
    other.ok("init")
    other.ok("ctx 0")
    other.ok("alloc 1g")
    res = cudrive.run("init ctx 0 meminfo", s.env)
    assert res.one("meminfo")["free"] == 4 * GiB - 2 * SIM_CONTEXT - GiB, res.describe()


def test_mem_get_info_free_is_bounded_by_the_physical_free(cudrive, make_slice, gpu):
    hog = cudrive.start(gpu.env())  # outside any slice, no preload
    hog.ok("init")
    hog.ok("ctx 0")
    hog.ok("alloc 14g")
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    info = p.ok("meminfo")
    physical_free = SIM_MEMORY - gpu.used(0)
    assert physical_free < 4 * GiB - SIM_CONTEXT
    assert (info["total"], info["free"]) == (4 * GiB, physical_free)


def test_mem_get_info_without_a_limit_is_the_physical_answer(cudrive, make_slice, gpu):
    s = make_slice(limit=None, overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok("alloc 1g")
    info = p.ok("meminfo")
    assert (info["total"], info["free"]) == (SIM_MEMORY, SIM_MEMORY - gpu.used(0))


@pytest.mark.parametrize(
    "limit, expected",
    [("4g", 4 * GiB), ("32g", SIM_MEMORY), (None, SIM_MEMORY)],
    ids=["below-physical", "above-physical", "no-limit"],
)
def test_device_total_mem(cudrive, make_slice, limit, expected):
    s = make_slice(limit=limit, overhead="64m")
    res = cudrive.run("init totalmem 0 totalmem 1", s.env)
    assert [r["total"] for r in res.ops("totalmem")] == [expected, expected], res.describe()


def _mem(rec):
    return {"v1": (rec["total"], rec["used"], rec["free"]),
            "v2": (rec["total_v2"], rec["used_v2"], rec["free_v2"])}


def test_nvml_memory_info_is_sized_to_the_slice(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 1g", "nvml"):
        p.ok(line)
    used = SIM_CONTEXT + GiB
    rec = p.ok("nvmlmem 0")
    assert rec["rc_v2"] == 0, rec
    assert _mem(rec) == {"v1": (4 * GiB, used, 4 * GiB - used), "v2": (4 * GiB, used, 4 * GiB - used)}
    untouched = p.ok("nvmlmem 1")
    assert _mem(untouched)["v1"] == (4 * GiB, 0, 4 * GiB)
    assert _mem(untouched)["v2"] == (4 * GiB, 0, 4 * GiB)


def test_nvml_used_is_the_whole_slice(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    other = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 512m"):
        other.ok(line)
    res = cudrive.run("nvml nvmlmem 0", s.env)  # no CUDA context of its own
    rec = res.one("nvmlmem")
    assert rec["rc"] == 0, res.describe()
    assert (rec["total"], rec["used"], rec["free"]) == (4 * GiB, SIM_CONTEXT + 512 * MiB,
                                                        4 * GiB - SIM_CONTEXT - 512 * MiB)


def test_nvml_index_is_physical_when_cuda_visible_devices_remaps(cudrive, make_slice):
    s = make_slice(limit=None, overhead="64m", CUDA_DEVICE_MEMORY_LIMIT_0="1g", CUDA_VISIBLE_DEVICES="1")
    res = cudrive.run("init totalmem 0 nvml nvmlmem 0 nvmlmem 1", s.env)
    assert res.one("totalmem")["total"] == GiB, res.describe()
    nvml0, nvml1 = res.ops("nvmlmem")
    assert nvml1["total"] == GiB, res.describe()  # CUDA ordinal 0 is NVML index 1
    assert nvml0["total"] == SIM_MEMORY, res.describe()


def test_null_output_pointers_are_invalid_value(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    whats = ["alloc", "pitch", "managed", "async", "poolalloc", "meminfo", "totalmem", "memcreate",
             "array", "array3d", "mipmap", "getproc"]
    res = cudrive.run(["init", "ctx", "0"] + [w for what in whats for w in ("null", what)]
                      + ["nvml", "null", "nvmlmem", "meminfo"], s.env)
    assert res.returncode == 0, res.describe()
    by_what = {r["what"]: r for r in res.ops("null")}
    assert sorted(by_what) == sorted(whats + ["nvmlmem"]), res.describe()
    for what in whats:
        rec = by_what[what]
        assert rec["rc"] == CUDA_ERROR_INVALID_VALUE, rec
        for key in ("rc_free_null", "rc_total_null", "rc_null_pitch", "rc_null_prop", "rc_null_desc", "rc_v1"):
            if key in rec:
                assert rec[key] == CUDA_ERROR_INVALID_VALUE, rec
    assert by_what["nvmlmem"]["rc"] == NVML_ERROR_INVALID_ARGUMENT
    assert by_what["nvmlmem"]["rc_v2"] == NVML_ERROR_INVALID_ARGUMENT
    # Nothing was charged by the refused calls.
    assert res.one("meminfo")["free"] == 4 * GiB - SIM_CONTEXT, res.describe()


def test_no_wrap_when_the_limit_drops_below_usage(cudrive, make_slice, gpu):
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    for line in ("init", "ctx 0", "alloc 1g", "nvml"):
        p.ok(line)
    set_memory_limit(s.path, gpu.uuid(0), 512 * MiB)
    # Limits are live (applied within 100 ms): poll for the new total, 1 s at most.
    info = wait_for(lambda: (lambda r: r if r["total"] == 512 * MiB else None)(p.ok("meminfo")),
                    timeout=1.0, what="the lowered limit in cuMemGetInfo")
    assert info["free"] == 0
    assert p.cmd("alloc 1")["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    rec = p.ok("nvmlmem 0")
    assert (rec["total"], rec["used"], rec["free"]) == (512 * MiB, SIM_CONTEXT + GiB, 0)
    assert (rec["total_v2"], rec["free_v2"]) == (512 * MiB, 0)
    # Nothing is freed behind the program's back.
    assert s.used(0) == SIM_CONTEXT + GiB
