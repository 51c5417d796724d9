"""The admin panel's GPU facts are the physical GPU's, also from inside a slice."""

import json
import subprocess
import sys

from hami_jupyter import native

READ = ("import json; from dataclasses import asdict; from hami_jupyter.gpus import read_gpus; "
        "found, message = read_gpus(); print(json.dumps([[asdict(g) for g in found], message]))")
PLAIN = ("import json, pynvml; pynvml.nvmlInit(); "
         "print(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)")


def test_gpu_facts_inside_a_slice_are_physical(tmp_path):
    env = native.sim_env(tmp_path / "sim", HAMI_SIM_DEVICES="1", HAMI_SIM_MEMORY="16g",
                         LD_PRELOAD=str(native.library_path()), HAMI_SLICE=str(tmp_path / "s.slice"),
                         CUDA_DEVICE_MEMORY_LIMIT="1g")
    # Under the preload, NVML itself answers with the slice's size...
    plain = subprocess.run([sys.executable, "-c", PLAIN], env=env, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip() == str(1 << 30), plain.stderr
    # ...but the panel reads the GPU itself.
    r = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=60)
    gpus, message = json.loads(r.stdout)
    assert message is None and [g["memory_total"] for g in gpus] == [16 << 30], r.stderr
