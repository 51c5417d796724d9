"""nvidia-smi under the preload library reports the slice as the GPU's memory (real GPU)."""

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.gpu


def test_nvidia_smi_shows_the_slice_size(slice_env):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed")
    cmd = [smi, "--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits", "-i", "0"]
    bare = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    hooked = subprocess.run(cmd, env=slice_env(limit="4g"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=60)
    print(f"nvidia-smi without preload: {bare.stdout.strip()}; with a 4 GiB slice: {hooked.stdout.strip()}")
    assert hooked.returncode == 0, hooked.stderr
    total, used, free = (int(v.strip()) for v in hooked.stdout.strip().split(","))
    assert total == 4096
    assert used + free <= 4096
