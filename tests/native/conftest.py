"""Fixtures for the preload-library tests: real processes on a simulated GPU.

* ``hami_build`` (session): builds ``native/`` once (``make sim tools`` must
  succeed; ``make all``, the preload library, may fail and is then reported by
  every test that needs it). ``HAMI_TEST_BUILD=asan`` builds and uses
  ``native/build-asan/`` instead, with libasan preloaded first;
  ``HAMI_TEST_BUILD=tsan`` ``native/build-tsan/``, with libtsan preloaded
  first. A sanitizer report on any process's stderr fails the test.
* ``gpu``: a fresh simulated GPU per test (2 devices of 16 GiB, 64 MiB per
  CUDA context); ``gpu.env()`` for a process without the preload,
  ``gpu.status()`` / ``gpu.used(i)`` / ``gpu.peak(i)`` from ``hami-simctl``.
* ``make_slice(name="team", limit="1g", overhead="64m", **env)``: a Slice with
  ``.env`` (a process under the preload library in the slice file
  ``tmp_path/name``), ``.used(i)`` and ``.snapshot()`` (the slice file).
* ``cudrive``: ``cudrive.run(args, env)`` one-shot -> Result (JSON records,
  stderr); ``cudrive.start(env)`` -> Interactive (``.cmd(line)``). Every wait
  has a timeout; every process started is killed at teardown.

Helpers shared by the tests live in native_helpers.py.
"""

from native_fixtures import cudrive, gpu, hami_build, make_slice, shared_gpu  # noqa: F401 (fixtures)
