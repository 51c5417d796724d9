"""Hatch build hook: compile native/ and ship the results inside the wheel.

The preload library, the simulated GPU and the driver-API runner are plain C
built by ``make`` with the system compiler (no CUDA toolkit). A wheel carries
them under ``hami_jupyter/_native/`` in the same layout as ``native/build/``,
which is where :mod:`hami_jupyter.native` looks for them. Because the wheel
then holds machine code it is tagged ``py3-none-<platform>``, not
``py3-none-any``.

Editable installs (``pip install -e .``) build nothing: the code finds the
files in ``native/build/`` of the checkout, built by ``make -C native`` or
``./dev/test.sh``.
"""

import os
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Path inside native/build/ -> the same path under hami_jupyter/_native/.
NATIVE_FILES = (
    "libvgpu.so",
    "sim/libcuda.so.1",
    "sim/libnvidia-ml.so.1",
    "sim/libnvcuvid.so.1",
    "sim/hami-simctl",
    "tools/cudrive",
)


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel" or version == "editable":
            return
        native = Path(self.root) / "native"
        jobs = str(os.cpu_count() or 1)
        cmd = ["make", "-C", str(native), "-j", jobs, "all", "sim", "tools"]
        self.app.display_info("hami-jupyter: " + " ".join(cmd))
        result = subprocess.run(cmd)
        if result.returncode != 0:
            raise RuntimeError(
                f"building native/ failed ({' '.join(cmd)} exited {result.returncode}); "
                "the wheel needs a C compiler and make"
            )
        for rel in NATIVE_FILES:
            built = native / "build" / rel
            if not built.is_file():
                raise RuntimeError(f"make succeeded but {built} is missing")
            build_data["force_include"][str(built)] = f"hami_jupyter/_native/{rel}"
        build_data["pure_python"] = False
        # Machine code, but no Python extension module: any Python 3 on this platform.
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"
