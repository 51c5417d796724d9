"""hami_jupyter.native finds the native files in one order and says how to build them."""

import pytest

from hami_jupyter import native

LAYOUT = ("libvgpu.so", "sim/libcuda.so.1", "sim/libnvidia-ml.so.1", "sim/libnvcuvid.so.1", "sim/hami-simctl",
          "tools/cudrive")


def _fake_build(root):
    for rel in LAYOUT:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return root


def test_override_dir_is_used(tmp_path, monkeypatch):
    root = _fake_build(tmp_path / "asan")
    monkeypatch.setenv(native.ENV_DIR, str(root))
    assert native.library_path() == root / "libvgpu.so"
    assert native.sim_library_dir() == root / "sim"
    assert native.simctl_path() == root / "sim" / "hami-simctl"
    assert native.cudrive_path() == root / "tools" / "cudrive"


def test_override_dir_missing_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(native.ENV_DIR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HAMI_NATIVE_DIR"):
        native.library_path()


def test_missing_build_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.delenv(native.ENV_DIR, raising=False)
    monkeypatch.setattr(native, "_WHEEL_DIR", tmp_path / "wheel")
    monkeypatch.setattr(native, "_CHECKOUT_DIR", tmp_path / "checkout")
    with pytest.raises(FileNotFoundError) as info:
        native.cudrive_path()
    assert "make -C native tools" in str(info.value)
    assert "pip install ." in str(info.value)


def test_wheel_dir_comes_before_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(native.ENV_DIR, raising=False)
    wheel = _fake_build(tmp_path / "wheel")
    checkout = _fake_build(tmp_path / "checkout")
    monkeypatch.setattr(native, "_WHEEL_DIR", wheel)
    monkeypatch.setattr(native, "_CHECKOUT_DIR", checkout)
    assert native.library_path() == wheel / "libvgpu.so"
    (wheel / "libvgpu.so").unlink()
    assert native.library_path() == checkout / "libvgpu.so"


def test_sim_env(tmp_path, monkeypatch):
    root = _fake_build(tmp_path / "build")
    monkeypatch.setenv(native.ENV_DIR, str(root))
    env = native.sim_env(tmp_path / "state", base={"LD_LIBRARY_PATH": "/opt/lib", "HOME": "/h"},
                         CUDA_DEVICE_MEMORY_LIMIT="1g", HAMI_LOG_LEVEL=4)
    assert env["LD_LIBRARY_PATH"] == f"{root / 'sim'}:/opt/lib"
    assert env["HAMI_SIM_STATE"] == str(tmp_path / "state")
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "1g"
    assert env["HAMI_LOG_LEVEL"] == "4"
    assert env["HOME"] == "/h"
    assert native.sim_env(tmp_path / "state", base={})["LD_LIBRARY_PATH"] == str(root / "sim")
