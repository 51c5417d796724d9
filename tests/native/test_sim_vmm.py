"""The simulated GPU's virtual memory management, with the driver's rules.

What the fast park stands on (docs/parking.md): an address range reserved,
physical memory created and mapped into it, access set before any device may
touch it, unmapped memory faulting. No preload library here: these are the
simulated driver's own answers (native/sim/README.md, "Virtual memory").
"""

import pytest

from native_helpers import CUDA_ERROR_INVALID_VALUE, MiB, SIM_CONTEXT

CUDA_ERROR_ILLEGAL_ADDRESS = 700


@pytest.fixture
def proc(cudrive, gpu):
    """A process of the simulated GPU (no preload), with a context on device 0."""
    return cudrive.with_context(gpu.env())


def test_granularity_and_alignment_rules(proc):
    assert proc.ok("vm gran 0")["granularity"] == 2 * MiB
    assert proc.cmd("vm reserve r0 3m")["rc"] == CUDA_ERROR_INVALID_VALUE  # not a multiple
    proc.ok("vm reserve r 8m")
    proc.ok("memcreate 4m 0 h")
    assert proc.cmd("memcreate 3m 0 odd")["rc"] == CUDA_ERROR_INVALID_VALUE
    assert proc.cmd("vm map r 1m h")["rc"] == CUDA_ERROR_INVALID_VALUE  # address not aligned
    assert proc.cmd("vm map r 6m h")["rc"] == CUDA_ERROR_INVALID_VALUE  # past the range's end
    assert proc.cmd("vm map r 0 h 2m 1m")["rc"] == CUDA_ERROR_INVALID_VALUE  # handle offset not aligned
    proc.ok("vm map r 0 h")
    assert proc.cmd("vm map r 2m h 2m")["rc"] == CUDA_ERROR_INVALID_VALUE  # mapped there already
    assert proc.cmd("vm unmap r 0 2m")["rc"] == CUDA_ERROR_INVALID_VALUE  # only whole mappings
    assert proc.cmd("free r")["rc"] == CUDA_ERROR_INVALID_VALUE  # a range still holding a mapping
    proc.ok("vm unmap r 0 4m")
    proc.ok("free r")


def test_memory_is_reached_only_once_access_is_set_and_a_fault_sticks(cudrive, gpu):
    p = cudrive.with_context(gpu.env(), "vm reserve r 4m", "memcreate 4m 0 h", "vm map r 0 h")
    assert p.ok("vm getaccess r 0 0")["access"] == "none"
    assert p.cmd("write r 7")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS  # mapped, no access yet
    # The fault is sticky, as the real driver's illegal address: the context is done.
    assert p.cmd("sync")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS
    assert p.cmd("alloc 1m x")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS

    q = cudrive.with_context(gpu.env(), "vm reserve r 4m", "memcreate 4m 0 h", "vm map r 0 h",
                             "vm access r 0 4m 0 rw")
    assert q.ok("vm getaccess r 0 0")["access"] == "rw"
    q.ok("write r 7")
    q.ok("touch r 2")  # a kernel reads and writes it
    assert q.ok("check r 9")["equal"]
    q.ok("vm access r 0 4m 0 r")
    assert q.cmd("touch r")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS  # read-only: a kernel's write faults


def test_unmapped_memory_faults_and_a_released_handle_lives_while_mapped(cudrive, gpu):
    p = cudrive.with_context(gpu.env(), "vm reserve r 4m", "memcreate 4m 0 h", "vm map r 0 h",
                             "vm access r 0 4m 0 rw", "write r 5")
    p.ok("free h")  # cuMemRelease: the mapping still holds the memory
    assert gpu.process_used(p.pid, 0) == SIM_CONTEXT + 4 * MiB
    assert p.ok("check r 5")["equal"]
    p.ok("vm unmap r 0 4m")  # the last use: now it goes
    assert gpu.process_used(p.pid, 0) == SIM_CONTEXT
    assert p.cmd("touch r")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS  # a kernel on unmapped memory faults
    assert p.cmd("check r 5")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS


def test_new_memory_at_the_same_address_reads_what_is_copied_back(proc):
    """What the fast park does: unmap and release, then map new memory at the
    same range; the old bytes are gone until copied back."""
    for line in ("vm reserve r 4m", "memcreate 4m 0 h", "vm map r 0 h", "vm access r 0 4m 0 rw", "write r 66",
                 "vm unmap r 0 4m", "free h", "memcreate 4m 0 h2", "vm map r 0 h2", "vm access r 0 4m 0 rw"):
        proc.ok(line)
    assert proc.ok("check r 0")["equal"]  # new memory: not the old bytes


def test_ranges_and_pointer_attributes_answer_for_the_reservation(proc):
    proc.ok("vm reserve r 8m")
    attrs = proc.ok("ptrattr r 4m")
    assert (attrs["start_offset"], attrs["size"], attrs["mapped"], attrs["ipc"]) == (0, 8 * MiB, 0, 0)
    proc.ok("memcreate 4m 0 h")
    proc.ok("vm map r 4m h")
    attrs = proc.ok("ptrattr r 5m")
    assert (attrs["start_offset"], attrs["size"], attrs["mapped"], attrs["ordinal"]) == (0, 8 * MiB, 1, 0)
    got = proc.ok("range r 5m")
    assert (got["base_offset"], got["size"]) == (0, 8 * MiB)
    proc.ok("alloc 3m a")  # the driver's own allocation: its own range, IPC-capable
    attrs = proc.ok("ptrattr a 1m")
    assert (attrs["start_offset"], attrs["size"], attrs["mapped"], attrs["ipc"]) == (0, 3 * MiB, 1, 1)


def test_ipc_exports_only_the_drivers_own_allocations(proc):
    proc.ok("alloc 4m a")
    proc.ok("ipc a")
    proc.ok("vmalloc 4m 0 v")
    assert proc.cmd("ipc v")["rc"] == CUDA_ERROR_INVALID_VALUE


def test_peer_memory_of_a_mapped_range_needs_its_access_set(cudrive, gpu):
    """Peer access reaches the driver's allocations of the peer at once; memory
    mapped into a reserved range only once cuMemSetAccess names the device."""
    p = cudrive.with_context(gpu.env(), "ctx 1", "vm reserve r 4m", "memcreate 4m 1 h", "vm map r 0 h",
                             "vm access r 0 4m 1 rw", "alloc 4m a", "ctx 0", "peer 1")
    p.ok("touch a")  # the driver's allocation on device 1, from device 0's context
    assert p.cmd("touch r")["rc"] == CUDA_ERROR_ILLEGAL_ADDRESS

    q = cudrive.with_context(gpu.env(), "ctx 1", "vm reserve r 4m", "memcreate 4m 1 h", "vm map r 0 h",
                             "vm access r 0 4m 1 rw", "vm access r 0 4m 0 rw", "ctx 0", "peer 1")
    q.ok("touch r")


def test_a_checkpoint_keeps_mapped_memory_and_its_contents(cudrive, gpu):
    p = cudrive.with_context(gpu.env(), "vmalloc 8m 0 v", "write v 42")
    for step in ("lock", "checkpoint"):
        assert cudrive.run(f"init ckpt {step} {p.pid}", gpu.env()).one("ckpt")["rc"] == 0
    assert gpu.process_used(p.pid, 0) == 0
    for step in ("restore", "unlock"):
        assert cudrive.run(f"init ckpt {step} {p.pid}", gpu.env()).one("ckpt")["rc"] == 0
    assert p.ok("check v 42")["equal"]
    [me] = [x for x in gpu.status()["processes"] if x["pid"] == p.pid]
    assert me["locks"] == 1  # the witness of which way a process was parked
