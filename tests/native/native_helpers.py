"""Helpers of the preload-library tests (fixtures are in conftest.py).

* ``hami_build`` (session): builds ``native/`` once (``make sim tools`` must
  succeed; ``make all``, the preload library, may fail and is then reported by
  every test that needs it). ``HAMI_TEST_BUILD=asan`` builds and uses
  ``native/build-asan/`` instead (AddressSanitizer and UBSan),
  ``HAMI_TEST_BUILD=tsan`` ``native/build-tsan/`` (ThreadSanitizer); either
  sanitizer's runtime is preloaded first, and any report on a process's
  stderr fails the test.
* ``gpu``: a fresh simulated GPU per test (2 devices of 16 GiB, 64 MiB per
  CUDA context), with ``gpu.status()`` from ``hami-simctl``.
* ``make_slice(...)``: the environment of a process under the preload library
  in a slice file under ``tmp_path``, and ``.snapshot()`` to read that file.
* ``cudrive``: runs ``cudrive`` one-shot (``cudrive.run``) or interactively
  (``cudrive.start``). Every wait has a timeout and every process started is
  killed at teardown.
"""

import json
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

SIM_DEVICES = 2
SIM_MEMORY = 16 * GiB
SIM_CONTEXT = 64 * MiB

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
NVML_ERROR_INVALID_ARGUMENT = 2

# How long any single wait may take before the test fails instead of hanging.
DEFAULT_TIMEOUT = float(os.environ.get("HAMI_TEST_TIMEOUT", "60"))

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer", "FATAL: ThreadSanitizer", "ThreadSanitizer: CHECK failed")

# HAMI_TEST_BUILD: the native build the tests use, and where make puts it.
BUILDS = {"": "build", "release": "build", "asan": "build-asan", "tsan": "build-tsan"}
RUNTIMES = {"asan": "libasan.so", "tsan": "libtsan.so"}
# Races inside the simulated driver that it has by design (the file says why,
# line by line). Nothing of the preload library is ever suppressed.
TSAN_SUPPRESSIONS = Path(__file__).resolve().parent / "tsan-sim.supp"


# ---- build -------------------------------------------------------------------


@dataclass
class Build:
    """Where the built native files are, and what did not build."""

    sanitizer: str  # "" (release), "asan" (AddressSanitizer + UBSan) or "tsan" (ThreadSanitizer)
    out: Path
    lib_error: str = ""
    runtime: str = ""  # the sanitizer's runtime library, preloaded first

    @property
    def sanitized(self):
        return bool(self.sanitizer)

    @property
    def asan(self):
        """Any sanitizer build (the name is older than the TSan build): processes that
        load the instrumented libraries need ``runtime`` preloaded."""
        return self.sanitized

    @property
    def asan_runtime(self):
        return self.runtime

    @property
    def sim_dir(self):
        return self.out / "sim"

    @property
    def simctl(self):
        return self.out / "sim" / "hami-simctl"

    @property
    def cudrive(self):
        return self.out / "tools" / "cudrive"

    @property
    def lib(self):
        return self.out / "libvgpu.so"

    def require_lib(self):
        """Path of libvgpu.so, or fail the test with make's output."""
        if self.lib_error or not self.lib.is_file():
            pytest.fail(
                f"the preload library {self.lib} did not build, so this test cannot run:\n"
                f"{self.lib_error or 'file missing after make'}",
                pytrace=False,
            )
        return self.lib

    def preload(self):
        """The LD_PRELOAD value for a process under the preload library."""
        lib = str(self.require_lib())
        if self.runtime:
            return f"{self.runtime} {lib}"
        return lib

    def sanitizer_env(self):
        """The sanitizer's options for a process that loads the built libraries."""
        if self.sanitizer == "asan":
            return {"ASAN_OPTIONS": "detect_leaks=0:verify_asan_link_order=0",
                    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
        if self.sanitizer == "tsan":
            # Every report is printed and the process goes on (the test fails on
            # the report); children of multi-threaded forks may start threads;
            # no second's sleep at every exit (TSan's default, for threads to end).
            options = ["halt_on_error=0", "die_after_fork=0", "second_deadlock_stack=1", "history_size=4",
                       "atexit_sleep_ms=0"]
            if TSAN_SUPPRESSIONS.is_file():
                options.append(f"suppressions={TSAN_SUPPRESSIONS}")
            return {"TSAN_OPTIONS": ":".join(options)}
        return {}


def build_name_from_env():
    """HAMI_TEST_BUILD: "" (release), "asan" or "tsan"; anything else fails every test."""
    name = os.environ.get("HAMI_TEST_BUILD", "")
    if name not in BUILDS:
        pytest.fail(f"HAMI_TEST_BUILD={name!r}: use asan, tsan or nothing", pytrace=False)
    return "" if name == "release" else name


def build_native(sanitizer="", asan=None):
    """Build native/ once: sim and tools must build; the library's failure is kept."""
    if asan is not None:  # the older form: build_native(asan=True)
        sanitizer = "asan" if asan else ""
    extra = [f"BUILD={sanitizer}"] if sanitizer else []
    build = Build(sanitizer=sanitizer, out=NATIVE / BUILDS[sanitizer])
    rc, log = _make(extra + ["sim", "tools"])
    if rc != 0:
        pytest.fail(f"the simulated GPU or cudrive did not build (exit {rc}):\n{log}", pytrace=False)
    rc, log = _make(extra + ["all"])
    if rc != 0:
        build.lib_error = f"make exited {rc}:\n{log}"
    if sanitizer:
        name = RUNTIMES[sanitizer]
        res = subprocess.run(["cc", f"-print-file-name={name}"], stdout=subprocess.PIPE, text=True)
        build.runtime = res.stdout.strip()
        if not build.runtime or not os.path.isabs(build.runtime):
            pytest.fail(f"cc -print-file-name={name} gave {build.runtime!r}", pytrace=False)
    return build


def _make(args):
    cmd = ["make", "-C", str(NATIVE), "-j", str(os.cpu_count() or 1)] + args
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return res.returncode, f"$ {' '.join(cmd)}\n{res.stdout[-6000:]}"




# ---- simulated GPU -----------------------------------------------------------


class SimGpu:
    """One simulated GPU (state file) shared by every process a test starts."""

    def __init__(self, build, state, **config):
        self.build = build
        self.state = state
        self.config = config  # HAMI_SIM_* settings of this GPU beyond the defaults below

    def env(self, **extra):
        """Environment of a process that sees this simulated GPU (no preload)."""
        env = dict(os.environ)
        for name in list(env):
            # Nothing from the caller's environment may configure the library.
            if name.startswith(("HAMI_", "CUDA_", "LIBCUDA_", "ASAN_", "UBSAN_", "TSAN_")) or name == "LD_PRELOAD":
                del env[name]
        env.update(
            LD_LIBRARY_PATH=str(self.build.sim_dir),
            HAMI_SIM_STATE=str(self.state),
            HAMI_SIM_DEVICES=str(SIM_DEVICES),
            HAMI_SIM_MEMORY="16g",
            HAMI_SIM_CONTEXT_BYTES="64m",
        )
        env.update({k: str(v) for k, v in self.config.items()})
        env.update(self.build.sanitizer_env())
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def simctl(self, *args):
        res = subprocess.run(
            [str(self.build.simctl), *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=DEFAULT_TIMEOUT,
        )
        if res.returncode != 0:
            raise AssertionError(f"hami-simctl {' '.join(args)} exited {res.returncode}: {res.stderr}")
        return res.stdout

    def status(self):
        """``hami-simctl status`` as a dict."""
        return json.loads(self.simctl("status"))

    def device(self, index):
        return self.status()["devices"][index]

    def used(self, index):
        return self.device(index)["used"]

    def peak(self, index):
        return self.device(index)["peak_used"]

    def uuid(self, index):
        return self.device(index)["uuid"]

    def reset_peak(self):
        self.simctl("reset-peak")

    def process_used(self, pid, index):
        """What the sim says process *pid* holds on device *index* (0 if unknown)."""
        for proc in self.status()["processes"]:
            if proc["pid"] == pid and proc.get("alive", True):
                return proc["used"][index]
        return 0




# ---- slice file ----------------------------------------------------------------


def read_slice(path):
    """A snapshot of the slice file at *path* (the one place that reads it)."""
    from hami_jupyter.slice.file import read_snapshot

    return read_snapshot(path)


def slice_device(snap, uuid):
    """The snapshot's device entry for GPU *uuid*, or None."""
    for dev in snap.devices:
        if dev.uuid == uuid:
            return dev
    return None


def slot_of(snap, pid):
    """The live slot of process *pid*, or None."""
    for slot in snap.slots:
        if slot.pid == pid:
            return slot
    return None


def slice_env(gpu, path, limit="1g", overhead="64m", **extra):
    """Environment of a process under the preload library in the slice file *path*.

    limit=None leaves CUDA_DEVICE_MEMORY_LIMIT unset; overhead=None leaves
    HAMI_CONTEXT_OVERHEAD unset (the library then measures it); path=None sets
    no slice file (a private slice). Extra keyword arguments are added to the
    environment; a value of None removes the variable.
    """
    env = gpu.env(LD_PRELOAD=gpu.build.preload())
    # The GPU schedule of SM-share windows is host-wide by default: give each
    # simulated GPU its own, beside its state file.
    env["HAMI_SCHEDULE_DIR"] = str(gpu.state.parent)
    # HAMI_TEST_FAST_PARK=0|1: the library's HAMI_FAST_PARK for every process
    # whose test does not choose, so the suites run with either kind of park.
    if os.environ.get("HAMI_TEST_FAST_PARK") in ("0", "1"):
        env["HAMI_FAST_PARK"] = os.environ["HAMI_TEST_FAST_PARK"]
    if path is not None:
        env["HAMI_SLICE"] = str(path)
    if limit is not None:
        env["CUDA_DEVICE_MEMORY_LIMIT"] = str(limit)
    if overhead is not None:
        env["HAMI_CONTEXT_OVERHEAD"] = str(overhead)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


class Slice:
    """A slice file path and the environment of a process in it."""

    def __init__(self, gpu, path, env):
        self.gpu = gpu
        self.path = path
        self.env = env

    def snapshot(self):
        return read_slice(self.path)

    def used(self, index=0):
        """The slice's memory_used on physical sim device *index* (0 if not met yet)."""
        if not self.path.exists():
            return 0
        dev = slice_device(self.snapshot(), self.gpu.uuid(index))
        return dev.memory_used if dev else 0

    def slot_used(self, pid, index=0):
        """What process *pid*'s slot holds on physical sim device *index* (None: no live slot)."""
        snap = self.snapshot()
        slot = slot_of(snap, pid)
        if slot is None:
            return None
        dev = slice_device(snap, self.gpu.uuid(index))
        return slot.memory_used.get(dev.index, 0) if dev else 0




# ---- cudrive -------------------------------------------------------------------


@dataclass
class Result:
    """A finished one-shot cudrive run."""

    records: list
    stderr: str
    returncode: int
    wall: float
    args: list = field(default_factory=list)

    def ops(self, op):
        return [r for r in self.records if r["op"] == op]

    def one(self, op):
        found = self.ops(op)
        assert len(found) == 1, f"expected one {op!r} record, got {found}\n{self.describe()}"
        return found[0]

    def rcs(self, op):
        return [r["rc"] for r in self.ops(op)]

    def hami_lines(self):
        return [line for line in self.stderr.splitlines() if line.startswith("hami:")]

    def describe(self):
        lines = "\n".join(json.dumps(r) for r in self.records)
        return f"cudrive {' '.join(self.args)}\nexit {self.returncode}\nstdout:\n{lines}\nstderr:\n{self.stderr[-4000:]}"


def _parse_lines(text):
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def check_sanitizers(stderr, what):
    for mark in SANITIZER_MARKS:
        assert mark not in stderr, f"{what}: sanitizer report on stderr:\n{stderr[-6000:]}"


def as_uid(uid):
    """A ``preexec_fn`` that runs the child as *uid* (its own group too, no others); None for None."""
    if uid is None:
        return None

    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop


class Interactive:
    """cudrive reading commands from its standard input, one line at a time
    (as user *uid*, when given: the test must run as root)."""

    def __init__(self, path, env, stderr_path, uid=None):
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [str(path), "stdin"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # teardown kills forked children too
            preexec_fn=as_uid(uid),
        )
        self.pid = self.proc.pid
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.pids = {self.pid}

    def stderr(self):
        if not self._stderr.closed:
            self._stderr.flush()
        return Path(self.stderr_path).read_text(errors="replace")

    def hami_lines(self):
        """What the library said on stderr so far (its lines begin "hami:")."""
        return [line for line in self.stderr().splitlines() if line.startswith("hami:")]

    def send(self, line):
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(f"cudrive {self.pid} is gone; stderr:\n{self.stderr()[-4000:]}")

    def read(self, timeout=DEFAULT_TIMEOUT):
        """The next JSON line from stdout (fails after *timeout* s or at EOF)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"cudrive {self.pid}: no answer within {timeout} s; stderr:\n{self.stderr()[-4000:]}"
                )
            if not self._sel.select(min(left, 0.5)):
                continue
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                continue
            if chunk == b"":
                self.proc.wait(timeout=5)
                raise AssertionError(
                    f"cudrive {self.pid} ended (exit {self.proc.returncode}) with no answer; "
                    f"stderr:\n{self.stderr()[-4000:]}"
                )
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        record = json.loads(line)
        self.pids.add(record.get("pid", self.pid))
        return record

    def cmd(self, line, timeout=DEFAULT_TIMEOUT):
        """Send one command line, return its one JSON answer."""
        self.send(line)
        return self.read(timeout)

    def ok(self, line, timeout=DEFAULT_TIMEOUT):
        """Like cmd, but the command must succeed."""
        rec = self.cmd(line, timeout)
        assert rec["rc"] == 0, f"{line!r} failed: {rec}\nstderr:\n{self.stderr()[-4000:]}"
        return rec

    def until(self, op, timeout=DEFAULT_TIMEOUT):
        """Read answers up to and including the first with this op."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            rec = self.read(max(0.1, deadline - time.monotonic()))
            out.append(rec)
            if rec["op"] == op:
                return out

    def ready(self):
        """True when an answer can be read at once (a whole line is buffered or
        stdout has data): lets a caller poll several processes without blocking."""
        if b"\n" in self._buf:
            return True
        return bool(self._sel.select(0))

    def alive(self):
        return self.proc.poll() is None

    def kill9(self):
        """SIGKILL the process and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=DEFAULT_TIMEOUT)

    def close(self, timeout=DEFAULT_TIMEOUT):
        """End standard input (ends `stdin` and `hold`) and wait for the exit code."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"cudrive {self.pid} did not exit within {timeout} s after EOF")

    def teardown(self):
        for pid in self.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except (OSError, ValueError):
                pass
        self._sel.close()
        self._stderr.close()


class CudriveRunner:
    def __init__(self, build, tmp_path):
        self.build = build
        self.tmp_path = tmp_path
        self.started = []
        self._count = 0

    @property
    def path(self):
        return self.build.cudrive

    def run(self, args, env, timeout=DEFAULT_TIMEOUT, input=None, check_sanitizers_=True, uid=None):
        """Run cudrive with *args* (a list or a string), as user *uid* when given; returns a Result."""
        if isinstance(args, str):
            args = args.split()
        args = [str(a) for a in args]
        start = time.monotonic()
        proc = subprocess.Popen(
            [str(self.path), *args],
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=as_uid(uid),
        )
        try:
            out, err = proc.communicate(input=input.encode() if input is not None else None, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(
                f"cudrive {' '.join(args)} did not finish within {timeout} s\n"
                f"stdout:\n{out.decode(errors='replace')[-4000:]}\nstderr:\n{err.decode(errors='replace')[-4000:]}"
            )
        res = Result(_parse_lines(out.decode(errors="replace")), err.decode(errors="replace"),
                     proc.returncode, time.monotonic() - start, args)
        if check_sanitizers_:
            check_sanitizers(res.stderr, res.describe())
        return res

    def start(self, env, uid=None):
        """Start ``cudrive stdin`` (as user *uid* when given); returns an Interactive (killed at teardown)."""
        self._count += 1
        it = Interactive(self.path, env, self.tmp_path / f"cudrive-{self._count}.stderr", uid)
        self.started.append(it)
        return it

    def with_context(self, env, *lines, uid=None):
        """An interactive CUDA process with a context on device 0 that ran LINES
        (each must succeed), as user *uid* when given."""
        p = self.start(env, uid)
        for line in ("init", "ctx 0", *lines):
            p.ok(line)
        return p

    def teardown(self):
        for it in self.started:
            it.teardown()
        for it in self.started:
            check_sanitizers(it.stderr(), f"cudrive {it.pid}")




# ---- small helpers for the tests -------------------------------------------------


def wait_for(predicate, timeout, interval=0.01, what="condition"):
    """Poll *predicate* until it returns a true value; fail after *timeout* s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout} s (last: {last!r})")
        time.sleep(interval)


_SIZE_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*(bytes|byte|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|K|M|G|T|k|m|g|t)?(?![A-Za-z])"
)
_UNITS = {
    None: 1, "bytes": 1, "byte": 1, "B": 1,
    "KiB": KiB, "KB": KiB, "K": KiB, "k": KiB,
    "MiB": MiB, "MB": MiB, "M": MiB, "m": MiB,
    "GiB": GiB, "GB": GiB, "G": GiB, "g": GiB,
    "TiB": 1 << 40, "TB": 1 << 40, "T": 1 << 40, "t": 1 << 40,
}


def fast_park_tested():
    """Whether the suites run with the fast park on (HAMI_TEST_FAST_PARK=1):
    processes then park themselves, moving the memory they made for it (2 MiB
    and more) and leaving their context and the rest on the GPU."""
    return os.environ.get("HAMI_TEST_FAST_PARK") == "1"


def context_parked(context):
    """What a park takes off the GPU of a process's context: all of it with the
    driver's checkpoint, nothing when the process parks itself."""
    return 0 if fast_park_tested() else context


def allocation_footprint(size, preload=True):
    """What cuMemAlloc(size) takes on the simulated GPU: exactly the size
    (the simulated driver's allocations), rounded up to the 2 MiB granularity
    when the library backs it for the fast park (HAMI_TEST_FAST_PARK=1)."""
    if preload and fast_park_tested() and size >= 2 * MiB:
        return (size + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
    return size


def mentions_size(text, nbytes):
    """True when *text* states *nbytes*: in bytes, or in a binary unit to 3 digits."""
    for number, unit in _SIZE_RE.findall(text):
        value = float(number) * _UNITS[unit or None]
        if value == nbytes:
            return True
        if unit and unit not in ("bytes", "byte", "B") and abs(value - nbytes) <= nbytes * 0.005:
            return True
    return False
