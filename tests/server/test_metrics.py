"""The slices' gauges on the server's ``/metrics`` (the default test base URL,
``/a%40b/``), compared with what ``slice_status`` reads from the file."""

import getpass

import pytest
from fake_guard import seen, write_guard
from prometheus_client.parser import text_string_to_metric_families

from hami_jupyter.server import _load_jupyter_server_extension
from hami_jupyter.slice.paths import user_slice_name
from hami_jupyter.slice.status import slice_status

MiB = 1 << 20
CONTEXT = 64 * MiB  # the simulated GPU's context
SLICE_GAUGES = ("hami_slice_memory_used_bytes", "hami_slice_memory_limit_bytes",
                "hami_slice_sm_share_percent", "hami_slice_sm_utilization_percent")
KERNEL_GAUGES = ("hami_kernel_memory_used_bytes", "hami_kernel_sm_utilization_percent")
GUARD_GAUGES = ("hami_slice_memory_real_bytes", "hami_guard_up")


async def scrape(jp_fetch):
    """{metric name: [(labels, value)]} of the hami gauges, and the text."""
    response = await jp_fetch("metrics")
    assert response.code == 200
    text = response.body.decode()
    samples = {name: [] for name in SLICE_GAUGES + KERNEL_GAUGES + GUARD_GAUGES}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in samples:
                samples[s.name].append((s.labels, s.value))
    return samples, text


@pytest.mark.parametrize("hub_user, slice_ref", [(None, None), ("carol", "team")])
async def test_gauges_carry_the_slice_file_numbers(start_kernel, jp_fetch, monkeypatch,
                                                   slice_env, hub_user, slice_ref):
    if hub_user:
        monkeypatch.setenv("JUPYTERHUB_USER", hub_user)
    if slice_ref:
        monkeypatch.setenv("HAMI_SLICE", slice_ref)
    name = slice_ref or user_slice_name()
    slice_user = hub_user or name  # the hub's user, else the slice's name
    kernel_user = hub_user or getpass.getuser()  # as the kernel registry has it
    k = await start_kernel()
    plain = await start_kernel("python3")
    await k.run("from hami_jupyter import driver_memory as c\n"
                "c.init()\n"
                "b = c.DeviceBuffer(300 << 20)")

    samples, _ = await scrape(jp_fetch)
    status = slice_status(slice_env.root / f"{name}.slice")
    (gpu,) = status["gpus"]
    labels = {"slice": name, "user": slice_user, "gpu_uuid": gpu["uuid"]}
    assert samples["hami_slice_memory_used_bytes"] == [(labels, 300 * MiB + CONTEXT)]
    assert samples["hami_slice_memory_limit_bytes"] == [(labels, slice_env.memory_limit)]
    assert samples["hami_slice_sm_share_percent"] == [(labels, slice_env.sm_share)]
    assert samples["hami_slice_sm_utilization_percent"] == [(labels, gpu["sm_util"])]
    assert gpu["memory_used"] == 300 * MiB + CONTEXT

    (mine,) = status["kernels"]
    kernel_labels = {**labels, "user": kernel_user, "kernel_id": k.id}
    assert samples["hami_kernel_memory_used_bytes"] == [(kernel_labels, mine["memory_used"])]
    assert samples["hami_kernel_sm_utilization_percent"] == [(kernel_labels, mine["sm_util"])]
    assert mine["memory_used"] == 300 * MiB + CONTEXT
    assert all(plain.id not in str(v) for v in samples.values())


async def test_collector_registered_once(jp_serverapp, jp_fetch, start_kernel):
    k = await start_kernel()
    await k.run("from hami_jupyter import driver_memory as c\nc.init()")
    before, _ = await scrape(jp_fetch)
    _load_jupyter_server_extension(jp_serverapp)  # a second load, e.g. by a second config
    after, text = await scrape(jp_fetch)
    assert after == before
    assert after["hami_slice_memory_used_bytes"][0][1] == CONTEXT
    for name in SLICE_GAUGES + KERNEL_GAUGES + GUARD_GAUGES:
        assert text.count(f"# HELP {name} ") == 1, name


async def test_scrape_answers_whatever_the_slices(start_kernel, jp_fetch, slice_env):
    samples, text = await scrape(jp_fetch)  # no kernels: the gauges, no samples
    no_guard = [({"slice_root": str(slice_env.root)}, 0.0)]
    assert samples.pop("hami_guard_up") == no_guard  # the slice root's, kernels or not
    assert all(v == [] for v in samples.values())
    assert "# TYPE hami_slice_memory_used_bytes gauge" in text
    await start_kernel()  # no GPU work: nothing maps the file
    (slice_env.root / f"{user_slice_name()}.slice").write_bytes(b"junk" * 2048)
    samples, text = await scrape(jp_fetch)
    assert samples.pop("hami_guard_up") == no_guard
    assert all(v == [] for v in samples.values())
    assert "# TYPE hami_slice_memory_used_bytes gauge" in text


async def test_the_guards_real_memory_and_whether_it_runs(start_kernel, jp_fetch, slice_env):
    k = await start_kernel()
    await k.run("from hami_jupyter import driver_memory as c\n"
                "c.init()\n"
                "b = c.DeviceBuffer(300 << 20)")
    name = user_slice_name()
    (gpu,) = slice_status(slice_env.root / f"{name}.slice")["gpus"]
    labels = {"slice": name, "user": name, "gpu_uuid": gpu["uuid"]}
    root = {"slice_root": str(slice_env.root)}
    used = 300 * MiB + CONTEXT

    samples, _ = await scrape(jp_fetch)  # no guard: no real figure, and the guard is down
    assert samples["hami_slice_memory_real_bytes"] == []
    assert samples["hami_guard_up"] == [(root, 0.0)]

    report = write_guard(slice_env.root, {name: {gpu["uuid"]: seen(used + 500 * MiB, used, 1 << 30)}},
                         interval=5.0)
    samples, _ = await scrape(jp_fetch)
    assert samples["hami_slice_memory_real_bytes"] == [(labels, used + 500 * MiB)]
    assert samples["hami_slice_memory_used_bytes"] == [(labels, used)]  # the slice's own, beside
    assert samples["hami_guard_up"] == [(root, 1.0)]

    write_guard(slice_env.root, {name: {gpu["uuid"]: seen(used + 500 * MiB, used, 1 << 30)}},
                written_unix=report["written_unix"] - 600)  # it stopped writing
    samples, _ = await scrape(jp_fetch)
    assert samples["hami_slice_memory_real_bytes"] == []
    assert samples["hami_guard_up"] == [(root, 0.0)]
