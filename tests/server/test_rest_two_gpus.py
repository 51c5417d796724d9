"""``hami/v1/kernels/<id>`` on two simulated GPUs: with CUDA_VISIBLE_DEVICES=1,0
the kernel's device 0 is physical GPU 1, and the answer names that GPU's UUID;
and the top-level memory figures are the fullest GPU's, never a sum of caps."""

import json
import subprocess

import test_rest
from test_rest import CONTEXT, USER, allocate, check_against_file

from hami_jupyter import native

MiB = 1 << 20
GiB = 1 << 30

# test_rest's fixtures: the hub user's base URL and JUPYTERHUB_USER.
jp_base_url = test_rest.jp_base_url
hub_user = test_rest.hub_user


def _sim_uuids():
    """The sim's UUIDs by physical index (hami-simctl, on the state the kernel used)."""
    simctl = native.sim_library_dir() / "hami-simctl"
    out = subprocess.run([str(simctl), "status"], stdout=subprocess.PIPE, text=True, check=True,
                         timeout=30)
    return [d["uuid"] for d in json.loads(out.stdout)["devices"]]


async def test_reordered_kernel_is_reported_on_the_physical_gpu(start_kernel, get_json, slice_env,
                                                                 monkeypatch):
    monkeypatch.setenv("HAMI_SIM_DEVICES", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    k = await start_kernel()
    await k.run(allocate(256))
    u0, u1 = _sim_uuids()
    body = await get_json("hami", "v1", "kernels", k.id)
    assert body["slice"] == USER
    # The library meets both visible GPUs, in CUDA's order; the memory is on physical 1.
    used = {g["uuid"]: g["memory_used"] for g in body["gpus"]}
    assert [g["uuid"] for g in body["gpus"]] == [u1, u0], body["gpus"]
    assert used[u1] >= 256 * MiB and used[u0] == 0, used
    assert body["kernel"]["memory_used"] == used[u1]
    # The top line is the GPU that holds the memory: its index, its 1 GiB cap.
    (fuller,) = [g for g in body["gpus"] if g["uuid"] == u1]
    assert (body.get("memory_gpu"), body["memory_used"], body["memory_limit"]) == \
        (fuller["index"], used[u1], GiB), body
    check_against_file(body)


async def test_top_level_memory_is_the_fullest_gpus_never_a_sum_of_caps(start_kernel, get_json,
                                                                        slice_env, monkeypatch):
    """Two GPUs with a 1 GiB cap each, 864 MiB on GPU 0: the answer says 864 MiB
    of 1 GiB on GPU 0 (84 %, a warning), not of 2 GiB (42 %), and the next
    200 MiB on GPU 0 is refused, as 1 GiB says."""
    monkeypatch.setenv("HAMI_SIM_DEVICES", "2")
    k = await start_kernel()
    await k.run(allocate(800))
    body = await get_json("hami", "v1", "kernels", k.id)
    g0, g1 = body["gpus"]
    assert (g0["index"], g1["index"]) == (0, 1), body["gpus"]
    assert (g0["memory_used"], g1["memory_used"]) == (800 * MiB + CONTEXT, 0), body["gpus"]
    assert g0["memory_limit"] == g1["memory_limit"] == slice_env.memory_limit == GiB
    assert (body.get("memory_gpu"), body["memory_used"], body["memory_limit"]) == \
        (0, 800 * MiB + CONTEXT, GiB), body
    assert body["memory_level"] == g0["memory_level"] == "warning"
    refused = await k.run("try:\n    c.DeviceBuffer(200 << 20)\n    print('allocated')\n"
                          "except c.CudaError:\n    print('refused')")
    assert refused.strip() == "refused", refused
    check_against_file(body)
