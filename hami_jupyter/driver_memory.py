"""GPU memory straight from the CUDA driver, with no framework.

A few ``ctypes`` calls into ``libcuda.so.1`` (the real driver, or the
simulated one): enough for the quick-start notebook to show the memory cap
on any machine, for ``hami-jupyter doctor`` to check that the driver loads,
and for tests. Inside a slice every call here goes through the preload
library exactly as PyTorch's would.
"""

import ctypes

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2

_driver = None


class CudaError(RuntimeError):
    """A driver call failed; *code* is the ``CUresult``."""

    def __init__(self, call, code, name):
        super().__init__(f"{call} failed: {name} ({code})")
        self.call, self.code, self.name = call, code, name


def driver():
    """The loaded ``libcuda.so.1``; OSError with advice when there is none."""
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise OSError(f"cannot load the CUDA driver libcuda.so.1 ({e}); is the NVIDIA "
                          "driver installed? `hami-jupyter doctor` checks the set-up") from None
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _driver = lib
    return _driver


def _check(call, code):
    if code != CUDA_SUCCESS:
        name = ctypes.c_char_p()
        driver().cuGetErrorName(code, ctypes.byref(name))
        raise CudaError(call, code, (name.value or b"CUDA_ERROR_UNKNOWN").decode())


def init(device=0):
    """Initialise the driver and make *device*'s primary context current."""
    lib = driver()
    _check("cuInit", lib.cuInit(0))
    dev = ctypes.c_int()
    _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), device))
    ctx = ctypes.c_void_p()
    _check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    _check("cuCtxSetCurrent", lib.cuCtxSetCurrent(ctx))


def mem_get_info():
    """``(free, total)`` bytes as the current context sees them (a slice's view inside one)."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check("cuMemGetInfo_v2", driver().cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


class DeviceBuffer:
    """*nbytes* of device memory, freed by :meth:`free` (or when collected)."""

    def __init__(self, nbytes):
        ptr = ctypes.c_uint64()
        _check("cuMemAlloc_v2", driver().cuMemAlloc_v2(ctypes.byref(ptr), nbytes))
        self.ptr, self.nbytes = ptr.value, nbytes

    def write(self, data, offset=0):
        """Copy the bytes *data* into the buffer at *offset*."""
        if offset + len(data) > self.nbytes:
            raise ValueError(f"{len(data)} bytes at {offset} do not fit a {self.nbytes}-byte buffer")
        _check("cuMemcpyHtoD_v2", driver().cuMemcpyHtoD_v2(self.ptr + offset, data, len(data)))

    def read(self, nbytes=None, offset=0):
        """*nbytes* (default: all) of the buffer from *offset*, as bytes."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        out = ctypes.create_string_buffer(nbytes)
        _check("cuMemcpyDtoH_v2", driver().cuMemcpyDtoH_v2(out, self.ptr + offset, nbytes))
        return out.raw

    def free(self):
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            _check("cuMemFree_v2", driver().cuMemFree_v2(ptr))

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass
