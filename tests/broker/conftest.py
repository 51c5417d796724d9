"""Fixtures of the broker's tests: a real broker, real processes on the simulated GPU.

The simulated driver really moves a parked process's memory to host memory,
and its NVML reports the free bytes and each process's bytes as a driver
does: the broker's input is real. The suite reuses tests/native
(``hami_build``, ``gpu``, ``cudrive``: every process started is killed at
teardown).

* ``root``: this test's slice root (``tmp_path/slices``, 0700); ``socket_path``
  the broker's socket in it.
* ``slices.make(name, limit="8g", guarantee="1g")``: a slice file with that
  limit and guarantee; ``slices.env(name, kernel=...)`` the environment of a
  process in it, under the preload library, in that kernel.
* ``holder(env, size, age=None)``: a cudrive process holding *size* bytes on
  GPU 0 (and, with *age*, idle for that many seconds by its slot).
* ``client(env)``: a :class:`~broker_helpers.RoomClient` with CUDA started
  on GPU 0 (so it has its slot), asking over the socket.
* ``start_broker(*args)``: ``python -m hami_jupyter broker --root ROOT ...``
  (killed at teardown), returned once its first report is written;
  ``start_agent(*args)`` the same with both policies (``hami-jupyter agent``).

The fixtures are functions of broker_fixtures.py, so that the agent's and the
adversarial suites name them too. An ``age`` is the slot's word: the agent
takes it for the time before it watched a process, never for the time since.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))

import native_fixtures  # noqa: E402
import broker_fixtures  # noqa: E402

hami_build, gpu, cudrive = native_fixtures.hami_build, native_fixtures.gpu, native_fixtures.cudrive
root, socket_path, slices = broker_fixtures.root, broker_fixtures.socket_path, broker_fixtures.slices
holder, client, start_broker = broker_fixtures.holder, broker_fixtures.client, broker_fixtures.start_broker
start_agent = broker_fixtures.start_agent
