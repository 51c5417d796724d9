"""``python flaky_nvml.py guard ...``: hami-jupyter with NVML made to fail.

The simulated GPU cannot lose a GPU, so this wrapper patches pynvml before
the command runs, as ``FLAKY_NVML`` (comma-separated) says:

- ``lost1``: GPU index 1 is "lost" (NVML_ERROR_GPU_IS_LOST) while the file
  ``FLAKY_NVML_LOST`` exists: remove it and the GPU comes back;
- ``count``: every other ``nvmlDeviceGetCount`` fails (the driver stops
  answering for a moment);
- ``crash``: the guard's second and third intervals raise an exception that
  is no NVML error at all.
"""

import os
import sys

import pynvml

modes = set(filter(None, os.environ.get("FLAKY_NVML", "").split(",")))

if "lost1" in modes:
    flag = os.environ["FLAKY_NVML_LOST"]
    real_handle = pynvml.nvmlDeviceGetHandleByIndex

    def handle(index):
        if index == 1 and os.path.exists(flag):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return real_handle(index)

    pynvml.nvmlDeviceGetHandleByIndex = handle

if "count" in modes:
    real_count = pynvml.nvmlDeviceGetCount
    calls = [0]

    def count():
        calls[0] += 1
        if calls[0] % 2 == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        return real_count()

    pynvml.nvmlDeviceGetCount = count

if "crash" in modes:
    from hami_jupyter.agent import watch as service

    real_measure = service.measure
    rounds = [0]

    def measure(*args, **kwargs):
        rounds[0] += 1
        if rounds[0] in (2, 3):
            raise ZeroDivisionError(f"injected failure in interval {rounds[0]}")
        return real_measure(*args, **kwargs)

    service.measure = measure

from hami_jupyter.commands.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
