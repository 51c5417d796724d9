"""Find the native files: the preload library, the simulated GPU, the tools.

This module is the one place that knows where they live, so nothing else
hard-codes a path. Every location holds the same layout as ``native/build/``::

    libvgpu.so                 the preload library
    hami-park                  parks a process's GPU state (beside the library, which runs it)
    sim/libcuda.so.1           simulated CUDA driver
    sim/libnvidia-ml.so.1      simulated NVML
    sim/libnvcuvid.so.1        simulated NVDEC (video decoders)
    sim/hami-simctl            inspects and drives the simulated GPU
    tools/cudrive              runs driver-API calls (tests, benchmarks)

Search order:

1. ``$HAMI_NATIVE_DIR`` when set. It is then the only place searched: an
   explicit choice (an ASan build, say) must not silently fall back to a
   different build.
2. ``_native/`` inside this package, where an installed wheel carries them.
3. ``native/build/`` of the source checkout this package was imported from
   (an editable install or a plain checkout).
"""

import os
from pathlib import Path

ENV_DIR = "HAMI_NATIVE_DIR"

_PACKAGE_DIR = Path(__file__).resolve().parent
_WHEEL_DIR = _PACKAGE_DIR / "_native"
_CHECKOUT_DIR = _PACKAGE_DIR.parent / "native" / "build"


def _search_dirs(env=None):
    override = (os.environ if env is None else env).get(ENV_DIR)
    if override:
        return [Path(override)]
    return [_WHEEL_DIR, _CHECKOUT_DIR]


def _find(relpath, make_target, env=None):
    dirs = _search_dirs(env)
    for d in dirs:
        candidate = d / relpath
        if candidate.is_file():
            return candidate
    where = ", ".join(str(d) for d in dirs)
    if (os.environ if env is None else env).get(ENV_DIR):
        hint = f"${ENV_DIR} is set; point it at a folder laid out like native/build/"
    else:
        hint = (
            f"build it with `make -C native {make_target}` in the source checkout, "
            "or install the package with `pip install .`"
        )
    raise FileNotFoundError(f"hami-jupyter: {relpath} not found (looked in {where}); {hint}")


def library_path(env=None):
    """Path of the preload library ``libvgpu.so``; *env* (default ``os.environ``):
    the environment whose ``HAMI_NATIVE_DIR`` counts (a process to be started)."""
    return _find("libvgpu.so", "all", env)


def park_tool_path():
    """Path of ``hami-park``, which moves a process's GPU state to host memory and back."""
    return _find("hami-park", "all")


def sim_library_dir():
    """Folder holding the simulated ``libcuda.so.1`` and ``libnvidia-ml.so.1``."""
    sim_dir = _find("sim/libcuda.so.1", "sim").parent
    if not (sim_dir / "libnvidia-ml.so.1").is_file():
        raise FileNotFoundError(
            f"hami-jupyter: {sim_dir} has libcuda.so.1 but no libnvidia-ml.so.1; "
            "rebuild with `make -C native sim`"
        )
    return sim_dir


def simctl_path():
    """Path of ``hami-simctl``, which inspects and drives the simulated GPU."""
    return _find("sim/hami-simctl", "sim")


def cudrive_path():
    """Path of ``cudrive``, which runs CUDA driver-API calls for tests and benchmarks."""
    return _find("tools/cudrive", "tools")


def sim_env(state_path, base=None, **overrides):
    """Environment for a process that should see the simulated GPU.

    Returns a copy of *base* (default ``os.environ``) with the simulated
    driver's folder first on ``LD_LIBRARY_PATH`` and ``HAMI_SIM_STATE`` set to
    *state_path* (the simulated GPU's state file). *overrides* are added last,
    converted to strings, e.g. ``sim_env(p, CUDA_DEVICE_MEMORY_LIMIT="1g")``.
    """
    env = dict(os.environ if base is None else base)
    sim_dir = str(sim_library_dir())
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{sim_dir}:{old}" if old else sim_dir
    env["HAMI_SIM_STATE"] = os.fspath(state_path)
    env.update({k: str(v) for k, v in overrides.items()})
    return env
