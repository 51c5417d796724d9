"""Hatch build hook: compile native/ and ship the results inside the wheel;
refuse to ship a development build of the JupyterLab extension.

The preload library, the simulated GPU and the driver-API runner are plain C
built by ``make`` with the system compiler (no CUDA toolkit). A wheel carries
them under ``hami_jupyter/_native/`` in the same layout as ``native/build/``,
which is where :mod:`hami_jupyter.native` looks for them. Because the wheel
then holds machine code it is tagged ``py3-none-<platform>``, not
``py3-none-any``.

Editable installs (``pip install -e .``) build nothing: the code finds the
files in ``native/build/`` of the checkout, built by ``make -C native`` or
``./dev/test.sh``.

The JupyterLab extension is built by the ``jupyter-builder`` hook, which runs
before this one (pyproject.toml lists it first): from the checkout always with
``jlpm build:prod``, and not at all in an unpacked sdist, which carries the
build (see ``skip-if-exists`` there). Should a development build reach a wheel
or an sdist all the same (an sdist made with ``SKIP_JUPYTER_BUILDER`` after
``jlpm build``, say), this hook stops the build rather than ship its source
maps.
"""

import os
import subprocess
import sysconfig
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Path inside native/build/ -> the same path under hami_jupyter/_native/.
NATIVE_FILES = (
    "libvgpu.so",
    "hami-park",
    "sim/libcuda.so.1",
    "sim/libnvidia-ml.so.1",
    "sim/libnvcuvid.so.1",
    "sim/hami-simctl",
    "tools/cudrive",
)


# The built JupyterLab extension that wheels ship (see pyproject.toml).
LABEXTENSION_BUILD = "hami_jupyter/labextension"


def development_build_marks(build_dir):
    """The files that show *build_dir* holds a development build of the lab
    extension (``jlpm build``, ``jupyter-builder build --development``): the
    webpack configuration ``build_log.json`` that only development builds write,
    and source maps. Empty for a production build (``jlpm build:prod``) or none."""
    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        return []
    marks = [build_dir / "build_log.json"] if (build_dir / "build_log.json").exists() else []
    return marks + sorted(build_dir.rglob("*.map"))


class HamiBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if version == "editable":
            return
        if self.target_name in ("wheel", "sdist"):
            self._refuse_development_labextension()
        if self.target_name == "wheel":
            self._build_native(build_data)

    def _refuse_development_labextension(self):
        marks = development_build_marks(Path(self.root) / LABEXTENSION_BUILD)
        if marks:
            shown = ", ".join(str(m.relative_to(self.root)) for m in marks[:3])
            raise RuntimeError(
                f"{LABEXTENSION_BUILD}/ holds a development build of the JupyterLab "
                f"extension ({shown}); wheels and sdists carry only the production "
                "build: run `jlpm build:prod` in labextension/ (or delete "
                f"{LABEXTENSION_BUILD}/) and build again"
            )

    def _build_native(self, build_data):
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
