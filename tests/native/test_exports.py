"""libvgpu.so exports the hooked driver and NVML entry points and dlsym, nothing else."""

import re
import shutil
import subprocess

import pytest

ALLOWED = re.compile(r"^(cu[A-Z]\w*|cuvid[A-Z]\w*|nvml[A-Z]\w*|dlsym)$")

# Entry points the library must provide under their exported names, so that a
# program linked against libcuda directly is intercepted too.
REQUIRED = {
    "dlsym",
    "cuInit",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemCreate",
    "cuMemFree_v2",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuMemGetInfo_v2",
    "cuDeviceTotalMem_v2",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
}


@pytest.fixture(scope="module")
def exported(hami_build):
    lib = hami_build.require_lib()
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("nm (binutils) is needed to list the library's exports", pytrace=False)
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, check=True, timeout=60).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if kind == "A":
            continue  # version-script node names, not code or data
        symbols[name.split("@")[0]] = kind
    return symbols


def test_only_hooked_entry_points_and_dlsym_are_exported(exported):
    stray = sorted(name for name in exported if not ALLOWED.match(name))
    assert not stray, f"symbols outside cu*/cuvid*/nvml*/dlsym leave libvgpu.so: {stray}"


def test_internal_helpers_are_not_exported(exported):
    internal = sorted(name for name in exported if "hami" in name.lower() or name.startswith("_"))
    assert not internal, internal


def test_the_hooks_are_exported(exported):
    missing = sorted(REQUIRED - set(exported))
    assert not missing, f"hooked entry points not exported: {missing}"


def test_exports_are_functions(exported):
    data = sorted(name for name, kind in exported.items() if kind not in ("T", "W", "i"))
    assert not data, f"exported symbols that are not functions: {data}"
