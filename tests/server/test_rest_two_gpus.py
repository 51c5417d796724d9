"""``hami/v1/kernels/<id>`` on two simulated GPUs with CUDA_VISIBLE_DEVICES=1,0:
the kernel's device 0 is physical GPU 1, and the answer names that GPU's UUID."""

import json
import subprocess

import test_rest
from test_rest import USER, allocate, check_against_file

from hami_jupyter import native

MiB = 1 << 20

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
    check_against_file(body)
