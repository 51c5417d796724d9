"""Every API that takes device memory is charged to the slice, and credited on free."""

import pytest

from native_helpers import (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GiB, MiB, SIM_CONTEXT,
                            allocation_footprint)


@pytest.fixture
def proc(cudrive, make_slice):
    """A process in a 4 GiB slice with a primary context on device 0."""
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.slice = s
    assert s.used(0) == SIM_CONTEXT
    assert s.slot_used(p.pid, 0) == SIM_CONTEXT
    return p


def charged(p):
    """(slice charge, this process's slot charge) on device 0."""
    return p.slice.used(0), p.slice.slot_used(p.pid, 0)


def assert_charge(p, expected):
    assert charged(p) == (expected, expected)


# "procaddr 7000": the CUDA runtime's own lookup, which gets the first
# cuDevicePrimaryCtxRelease export (PyTorch, CuPy and JAX on driver 580).
@pytest.mark.parametrize("resolve", ["dlsym", "procaddr 7000", "procaddr 12000"])
def test_primary_context_is_charged_once_and_credited_at_release(cudrive, make_slice, resolve):
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok(f"resolve {resolve}")
    p.ok("init")
    p.ok("ctx 0")
    p.ok("ctx 0")  # a second retain of the same primary context
    assert s.used(0) == SIM_CONTEXT
    p.ok("ctx 1")
    assert (s.used(0), s.used(1)) == (SIM_CONTEXT, SIM_CONTEXT)
    p.ok("ctxrelease 0")
    assert s.used(0) == SIM_CONTEXT  # still retained once
    p.ok("ctxrelease 0")
    assert s.used(0) == 0
    assert s.used(1) == SIM_CONTEXT


def test_created_context_is_charged_and_credited_at_destroy(proc):
    proc.ok("ctxcreate 0 c1")
    assert_charge(proc, 2 * SIM_CONTEXT)
    proc.ok("ctxdestroy c1")
    assert_charge(proc, SIM_CONTEXT)


def test_measured_context_overhead(cudrive, make_slice, gpu):
    # HAMI_CONTEXT_OVERHEAD unset: the library measures what the context took.
    # This process creates the simulated GPU, with 100 MiB per context.
    s = make_slice(limit="4g", overhead=None, HAMI_SIM_CONTEXT_BYTES="100m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    assert gpu.process_used(p.pid, 0) == 100 * MiB
    assert s.used(0) == 100 * MiB
    assert s.slot_used(p.pid, 0) == 100 * MiB


def test_mem_alloc(proc):
    proc.ok("alloc 256m a")
    assert_charge(proc, SIM_CONTEXT + 256 * MiB)
    proc.ok("free a")
    assert_charge(proc, SIM_CONTEXT)


def test_mem_alloc_pitch_charges_pitch_times_height(proc):
    rec = proc.ok("pitch 1000 3000 4 a")
    assert rec["pitch"] >= 1000
    assert_charge(proc, SIM_CONTEXT + allocation_footprint(rec["pitch"] * 3000))
    proc.ok("free a")
    assert_charge(proc, SIM_CONTEXT)


def test_mem_alloc_managed(proc):
    proc.ok("managed 96m a")
    assert_charge(proc, SIM_CONTEXT + 96 * MiB)
    proc.ok("free a")
    assert_charge(proc, SIM_CONTEXT)


def test_mem_alloc_async_charges_pool_growth(proc):
    before = proc.ok("poolattr default")["reserved"]
    proc.ok("async 256m a")
    grown = proc.ok("poolattr default")["reserved"] - before
    assert grown >= 256 * MiB
    assert_charge(proc, SIM_CONTEXT + before + grown)
    proc.ok("free a")
    proc.ok("sync")
    proc.ok("pooltrim default 0")
    assert proc.ok("poolattr default")["reserved"] == 0
    assert_charge(proc, SIM_CONTEXT)


def test_mem_alloc_async_per_thread_stream(cudrive, make_slice):
    s = make_slice(limit="4g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("resolve procaddr 12000 2")  # cuMemAllocAsync -> the _ptsz entry point
    p.ok("init")
    p.ok("ctx 0")
    p.ok("async 128m a")
    reserved = p.ok("poolattr default")["reserved"]
    assert reserved >= 128 * MiB
    assert s.used(0) == SIM_CONTEXT + reserved
    p.ok("free a")
    p.ok("sync")
    p.ok("pooltrim default 0")
    assert s.used(0) == SIM_CONTEXT


def test_mem_alloc_from_pool_charges_pool_growth_and_trim_credits(proc):
    proc.ok("pool 0 P")
    proc.ok("poolalloc P 128m a")
    proc.ok("poolalloc P 64m b")
    reserved = proc.ok("poolattr P")["reserved"]
    assert reserved >= 192 * MiB
    assert_charge(proc, SIM_CONTEXT + reserved)
    proc.ok("free a")
    proc.ok("free b")
    proc.ok("sync")
    proc.ok("pooltrim P 0")
    assert proc.ok("poolattr P")["reserved"] == 0
    assert_charge(proc, SIM_CONTEXT)
    proc.ok("pooldestroy P")
    assert_charge(proc, SIM_CONTEXT)


def test_pool_destroy_credits_what_the_pool_held(proc):
    proc.ok("pool 0 P")
    proc.ok("poolalloc P 200m a")
    reserved = proc.ok("poolattr P")["reserved"]
    assert_charge(proc, SIM_CONTEXT + reserved)
    proc.ok("free a")
    proc.ok("sync")
    proc.ok("pooldestroy P")
    assert_charge(proc, SIM_CONTEXT)


def test_pool_growth_is_capped(cudrive, make_slice, gpu):
    s = make_slice(limit="1g", overhead="64m")
    p = cudrive.start(s.env)
    p.ok("init")
    p.ok("ctx 0")
    p.ok("pool 0 P")
    p.ok("poolalloc P 512m a")
    assert p.cmd("poolalloc P 512m b")["rc"] != CUDA_SUCCESS
    assert p.cmd("async 512m c")["rc"] != CUDA_SUCCESS
    assert s.used(0) <= GiB
    assert gpu.peak(0) <= GiB


def test_mem_create_on_device_is_charged(proc):
    proc.ok("memcreate 64m 0 h")
    assert_charge(proc, SIM_CONTEXT + 64 * MiB)
    proc.ok("free h")
    assert_charge(proc, SIM_CONTEXT)


def test_mem_create_on_host_is_not_charged(proc):
    proc.ok("memcreate 64m host h")
    assert_charge(proc, SIM_CONTEXT)
    proc.ok("free h")
    assert_charge(proc, SIM_CONTEXT)


@pytest.mark.parametrize(
    "command",
    [
        "array 1024 1024 f32 4",
        "array 4000 3 u8 1",
        "array3d 256 256 16 f16 2",
        "mipmap 512 512 0 f32 1 4",
    ],
)
def test_arrays_are_charged_and_fully_credited(proc, command):
    rec = proc.ok(f"{command} arr")
    slice_used, slot_used = charged(proc)
    assert slice_used == slot_used
    assert slice_used - SIM_CONTEXT >= rec["raw_bytes"]
    proc.ok("free arr")
    assert_charge(proc, SIM_CONTEXT)


def test_every_kind_together_then_freeall(proc):
    for line in ("alloc 10m", "pitch 512 512 4", "managed 10m", "memcreate 2m 0",
                 "array 64 64 f32 1", "array3d 64 64 4 u8 4", "mipmap 64 64 0 f32 1 3", "async 10m"):
        proc.ok(line)
    assert charged(proc)[0] > SIM_CONTEXT + 30 * MiB
    rec = proc.ok("freeall")
    assert rec["failed"] == 0
    proc.ok("sync")
    proc.ok("pooltrim default 0")
    assert_charge(proc, SIM_CONTEXT)


def test_failed_driver_calls_are_not_charged(proc):
    assert proc.cmd("alloc 0")["rc"] != CUDA_SUCCESS
    assert proc.cmd("null alloc")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert proc.cmd("null managed")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert proc.cmd("null memcreate")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert proc.cmd("null array")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert_charge(proc, SIM_CONTEXT)


def test_free_by_raw_pointer_credits_a_tracked_allocation(proc):
    ptr = proc.ok("alloc 32m a")["ptr"]
    assert_charge(proc, SIM_CONTEXT + 32 * MiB)
    proc.ok(f"freeraw {ptr}")
    assert_charge(proc, SIM_CONTEXT)


def test_untracked_free_is_passed_to_the_driver(cudrive, make_slice, gpu):
    script = "init ctx 0 freeraw 0x7f0000001000 freeraw 0"
    bare = cudrive.run(script, gpu.env())
    s = make_slice(limit="4g", overhead="64m")
    hooked = cudrive.run(script, s.env)
    # The driver's own answers, unchanged: the preload passed the calls through.
    assert hooked.rcs("freeraw") == bare.rcs("freeraw"), (bare.describe(), hooked.describe())


def test_untracked_free_leaves_the_charge_alone(proc):
    proc.ok("alloc 64m a")
    proc.cmd("freeraw 0x7f0000001000")
    assert_charge(proc, SIM_CONTEXT + 64 * MiB)


# A context's known cost is reserved before the driver makes it: a slice with
# no room refuses the context, and the GPU never holds it, not even for a moment
# (found by the kill storm under ThreadSanitizer, which catches that moment).
@pytest.mark.parametrize("make", ["ctx 0", "ctxcreate 0 c1"])
def test_a_context_with_no_room_is_never_made(cudrive, make_slice, gpu, make):
    s = make_slice(limit="1g", overhead="64m")
    holder = cudrive.start(s.env)
    holder.ok("init")
    holder.ok("ctx 0")
    holder.ok("alloc 928m")  # 64 MiB context + 928 MiB: 32 MiB left
    gpu.reset_peak()
    p = cudrive.start(s.env)
    p.ok("init")
    rec = p.cmd(make)
    assert rec["rc"] == CUDA_ERROR_OUT_OF_MEMORY, rec
    assert gpu.peak(0) <= GiB, f"the GPU held {gpu.peak(0)} bytes for a moment, over the 1 GiB cap"
    assert s.used(0) == GiB - 32 * MiB
