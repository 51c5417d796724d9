"""End to end through a real JupyterHub: each user's kernel holds that user's limits.

alice spawns with her default size ("small": 1 GiB, SM 25 %, hard), bob
asks for "large" (2 GiB, SM 50 %, elastic) in his spawn options, as the
spawn form would. Both servers run at once; in each a ``hami-python3``
kernel, started through the server's REST API behind the proxy, must report
its own user's slice in ``%hami status --json`` and see its own cap as the
GPU's total memory through the driver (the preload library enforcing it).
A spawn asking for a size the policy does not have must start no server.
"""

import json
import os
import stat
import time

import pytest

from hami_jupyter.slice_file import HAMI_MODE_ELASTIC, read_snapshot

GIB = 1 << 30

EXPECTED = {
    # user: (spawn options, memory limit, SM share, mode)
    "alice": ({}, 1 * GIB, 25, "hard"),
    "bob": ({"slice_size": "large"}, 2 * GIB, 50, "elastic"),
}

MEM_CHECK = (
    "from hami_jupyter import driver_memory as d\n"
    "d.init()\n"
    "print(d.mem_get_info()[1])\n"
)

pytestmark = pytest.mark.slow


def _status_json(result, where):
    assert result.error is None, f"{where}: %hami status --json failed: {result.error}"
    texts = result.text()
    assert len(texts) == 1, f"{where}: expected one text/plain output, got {result.outputs}"
    return json.loads(texts[0])


def test_each_user_kernel_holds_its_own_slice(hub):
    started = time.monotonic()
    for user, (options, *_) in EXPECTED.items():
        hub.spawn(user, options)
    for user in EXPECTED:
        hub.wait_ready(user)

    # The hub made each slice before the server started.
    for user, (_, memory, sm, mode) in EXPECTED.items():
        slice_file = hub.slice_root / f"{user}.slice"
        limits_file = hub.slice_root / f"{user}.limits"
        assert slice_file.is_file() and limits_file.is_file(), sorted(os.listdir(hub.slice_root))
        assert stat.S_IMODE(slice_file.stat().st_mode) == 0o600
        # The hub's, readable by all (no admin group): here the hub and the
        # servers are the same Unix user, SimpleLocalProcessSpawner's way.
        assert limits_file.stat().st_uid == os.getuid()
        assert stat.S_IMODE(limits_file.stat().st_mode) == 0o644
        snap = read_snapshot(slice_file)
        assert snap.limits_file == str(limits_file)
        fallback = snap.fallback_limit
        assert (fallback.memory_limit, fallback.sm_share) == (memory, sm)
        assert (fallback.mode == HAMI_MODE_ELASTIC) == (mode == "elastic")

    kernels = {user: hub.start_kernel(user) for user in EXPECTED}
    assert kernels["alice"] != kernels["bob"]

    for user, (_, memory, sm, mode) in EXPECTED.items():
        kernel_id = kernels[user]
        where = f"{user}'s kernel {kernel_id}"

        # The driver, under the preload library, shows the slice's cap as the total.
        mem = hub.execute(user, kernel_id, MEM_CHECK)
        assert mem.error is None, f"{where}: {mem.error}\n{hub.log_tail()}"
        assert mem.stdout.split() == [str(memory)], f"{where}: stdout {mem.stdout!r}"

        status = _status_json(hub.execute(user, kernel_id, "%hami status --json"), where)
        assert status["slice"] == user, status
        assert status["path"] == str(hub.slice_root / f"{user}.slice"), status
        assert status["default_limit"] == {"memory_limit": memory, "sm_share": sm, "mode": mode}
        assert [g["memory_limit"] for g in status["gpus"]] == [memory], status["gpus"]
        listed = {k["kernel_id"]: k for k in status["kernels"]}
        assert kernel_id in listed, status["kernels"]
        assert listed[kernel_id]["processes"], f"{where}: no process of it in its slice: {status}"
        other = kernels["bob" if user == "alice" else "alice"]
        assert other not in listed, f"{where}: the other user's kernel is in this slice: {status}"

    assert time.monotonic() - started < 90


def test_a_size_nobody_offers_starts_no_server(hub):
    # "huge" is no size of the policy: the hub must refuse the spawn rather
    # than start a server without limits.
    status, reply = hub.spawn("mallory", {"slice_size": "huge"}, expect=(400,))
    assert "no slice size named 'huge'" in str(reply)
    assert hub.wait_spawn("mallory") is None, "a server started with a size nobody offers"
    assert not (hub.slice_root / "mallory.slice").exists()
