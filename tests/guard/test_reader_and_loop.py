"""The NVML reader against a pynvml that fails in every way it can, and the loop in-process.

The reader is given a stand-in for the pynvml module, so that every error a
driver can answer with is tried; the loop is run in this process with a
reader that lists real child processes (``sleep``), so that what it ends is
real too.
"""

import logging
import os
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from guard_helpers import wait_exec

from hami_jupyter import audit
from hami_jupyter.agent import service, watch
from hami_jupyter.agent.facts.nvml import GpuProcess, NvmlReader, NvmlUnavailable, Reading
from hami_jupyter.slice.create import ensure_slice
from hami_jupyter.slice.guard_report import read_report
from hami_jupyter.slice.settings import resolve_limits

MiB = 1 << 20
GiB = 1 << 30


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {3: "Not Supported", 9: "Driver Not Loaded", 15: "GPU is lost"}.get(self.value, str(self.value))


class FakeNvml:
    """pynvml as far as the reader uses it. *gpus*: index -> (uuid, compute, graphics),
    where a list is ``[(pid, bytes)]`` and an int is the error code raised."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3

    def __init__(self, gpus, init_error=None):
        self.gpus = gpus
        self.init_error = init_error
        self.count_errors = []  # raised by the next nvmlDeviceGetCount calls, in order
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        if self.count_errors:
            raise NVMLError(self.count_errors.pop(0))
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        uuid = self.gpus[index][0]
        if isinstance(uuid, int):
            raise NVMLError(uuid)
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.gpus[handle][0].encode()

    def _list(self, handle, which):
        listed = self.gpus[handle][which]
        if isinstance(listed, int):
            raise NVMLError(listed)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._list(handle, 1)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._list(handle, 2)


def reader_of(fake):
    reader = NvmlReader(fake)
    reader.start()
    return reader


def test_compute_and_graphics_processes_of_every_gpu_one_figure_each():
    fake = FakeNvml({0: ("GPU-a", [(10, 100), (11, 200)], [(10, 100), (12, 50)]),
                     1: ("GPU-b", [(10, 300)], [])})
    got = reader_of(fake).read()
    assert got.errors == [] and got.unread == set()
    assert got.by_gpu() == {"GPU-a": {10: 100, 11: 200, 12: 50}, "GPU-b": {10: 300}}


def test_a_lost_gpu_or_a_list_that_fails_is_an_error_and_unread_never_half_read():
    fake = FakeNvml({0: (15, [], []),  # lost before its UUID could be read
                     1: ("GPU-b", 15, [(20, 5)]),  # its compute list fails
                     2: ("GPU-c", [(30, 7)], 3)})  # no graphics on this GPU: fine
    got = reader_of(fake).read()
    assert got.errors == ["GPU index 0: NVML: GPU is lost",
                          "GPU GPU-b: NVML cannot list its compute processes: GPU is lost"]
    assert got.unread == {"index 0", "GPU-b"}
    assert got.by_gpu() == {"GPU-c": {30: 7}}  # nothing of GPU-b, not even its graphics list


def test_memory_nvml_does_not_report_counts_as_nothing_and_says_so():
    got = reader_of(FakeNvml({0: ("GPU-a", [(10, None), (11, (1 << 64) - 1)], [])})).read()
    assert got.by_gpu() == {"GPU-a": {10: 0, 11: 0}}
    assert got.errors == ["GPU GPU-a: NVML does not say how much memory pid 10 holds (counted as 0)",
                          "GPU GPU-a: NVML does not say how much memory pid 11 holds (counted as 0)"]


def test_when_nvml_stops_answering_it_is_started_again():
    fake = FakeNvml({0: ("GPU-a", [(10, 1)], [])})
    reader = reader_of(fake)
    fake.count_errors = [9]
    got = reader.read()
    assert got.errors == ["NVML cannot count the GPUs: Driver Not Loaded; it is started again next time"]
    assert got.unread == {"all"} and got.processes == []
    assert reader.read().by_gpu() == {"GPU-a": {10: 1}}
    assert fake.inits == 2


def test_no_nvml_at_all_is_refused_at_start():
    with pytest.raises(NvmlUnavailable, match="NVML does not start: Driver Not Loaded"):
        NvmlReader(FakeNvml({}, init_error=9)).start()


# ---- the loop, in this process ------------------------------------------------------------


class ListedReader:
    """A reader that lists what the test says; raises when told to."""

    def __init__(self, uuid="GPU-t"):
        self.uuid, self.listed, self.raises, self.reads = uuid, {}, [], 0

    def start(self):
        pass

    def read(self):
        self.reads += 1
        if self.raises:
            raise self.raises.pop(0)
        return Reading(gpus={self.uuid: 0},
                       processes=[GpuProcess(pid, self.uuid, b) for pid, b in self.listed.items()])


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "slices"
    path.mkdir(mode=0o700)
    ensure_slice(path / "alice.slice", "alice", resolve_limits({"memory_limit": "1g"}, {}))
    return path


@pytest.fixture
def sleeper(root):
    started = []

    def start(slice_name="alice"):
        env = {"PATH": os.environ["PATH"], "HAMI_SLICE": str(root / f"{slice_name}.slice")}
        child = subprocess.Popen(["sleep", "60"], env=env)
        started.append(child)
        return wait_exec(child, "sleep")

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_an_interval_that_raises_is_logged_and_the_loop_goes_on(root, sleeper, caplog):
    reader = ListedReader()
    reader.raises = [RuntimeError("the first interval breaks")]
    child = sleeper()
    reader.listed = {child.pid: 2 * GiB}
    guard = watch.Watch.alone(root, interval=0.05, reader=reader)
    guard.start()
    stop = threading.Event()
    runner = threading.Thread(target=guard.run, args=(stop,))
    with caplog.at_level(logging.INFO, "hami_jupyter.guard"):
        runner.start()
        try:
            deadline = time.monotonic() + 10
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            runner.join(10)
    assert child.returncode == -9  # the intervals after the broken one did their job
    assert "this interval failed; the guard goes on with the next" in caplog.text
    assert "RuntimeError: the first interval breaks" in caplog.text
    [action] = read_report(root)["actions"]
    assert action["pid"] == child.pid and action["real_bytes"] == 2 * GiB
    [record] = [r for r in audit.read_records(audit.default_path(root)) if r["action"] == "guard-kill"]
    assert record["pid"] == child.pid


def test_one_look_over_is_not_enough_to_act(root, sleeper):
    reader = ListedReader()
    child = sleeper()
    guard = watch.Watch.alone(root, reader=reader)
    guard.start()
    reader.listed = {child.pid: 2 * GiB}
    report = guard.round()
    assert report["slices"]["alice"]["gpus"]["GPU-t"]["state"] == "over"  # shown at once
    assert child.poll() is None and report["actions"] == []
    reader.listed = {child.pid: 100 * MiB}  # it was a moment: back within the cap
    guard.round()
    reader.listed = {child.pid: 2 * GiB}
    assert guard.round()["actions"] == []  # a new first look
    assert child.poll() is None
    assert [a["pid"] for a in guard.round()["actions"]] == [child.pid]  # the second look in a row


def test_a_gpu_not_read_keeps_what_was_known_of_it(root, sleeper):
    reader = ListedReader()
    child = sleeper()
    guard = watch.Watch.alone(root, reader=reader, action="warn")
    guard.start()
    reader.listed = {child.pid: 2 * GiB}
    guard.round()
    assert len(guard.round()["actions"]) == 1  # warned
    real_read = reader.read
    reader.read = lambda: Reading(unread={"GPU-t"}, errors=["GPU GPU-t: NVML: GPU is lost"])
    report = guard.round()
    assert report["errors"] == ["GPU GPU-t: NVML: GPU is lost"] and report["slices"]["alice"]["gpus"] == {}
    reader.read = real_read
    assert len(guard.round()["actions"]) == 1  # still the same over state: no second warning


def test_not_root_is_said_and_the_guard_runs(root, monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with caplog.at_level(logging.INFO, "hami_jupyter.guard"):
        assert service.main(root, once=True, reader=ListedReader()) == 0
    assert "not running as root (uid 4242)" in caplog.text
    assert read_report(root)["slices"]["alice"] == {"path": str(root / "alice.slice"), "gpus": {}}


def test_a_process_nvml_lists_but_proc_does_not_show_is_listed_unattributed(root):
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its PID names no process (as one in a PID namespace we do not see)
    reader = ListedReader()
    reader.listed = {gone.pid: 3 * GiB}
    report = watch.Watch.alone(root, reader=reader).round()
    [entry] = report["unattributed"]
    assert (entry["pid"], entry["uuid"], entry["real_bytes"]) == (gone.pid, "GPU-t", 3 * GiB)
    assert "not in the agent's /proc" in entry["why"]
    assert report["actions"] == []


def test_a_report_that_cannot_be_written_is_said_once_and_the_guard_goes_on(root, monkeypatch, caplog):
    def refuse(report, root):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(watch, "write_report", refuse)
    guard = watch.Watch.alone(root, reader=ListedReader())
    with caplog.at_level(logging.INFO, "hami_jupyter.guard"):
        for _ in range(3):
            guard.round()
    assert caplog.text.count(f"cannot write the report in {root}: Permission denied") == 1


def test_a_process_ended_but_still_listed_costs_nobody_else_their_process(root, sleeper):
    older, newer = sleeper(), sleeper()
    reader = ListedReader()
    reader.listed = {older.pid: 100 * MiB, newer.pid: 2 * GiB}
    guard = watch.Watch.alone(root, reader=reader)
    guard.start()
    guard.round()
    assert [a["pid"] for a in guard.round()["actions"]] == [newer.pid]
    # Not reaped yet (a zombie keeps its /proc entry), and the driver is slow to
    # free it: NVML still lists its 2 GiB. The slice still looks over...
    for _ in range(3):
        report = guard.round()
        assert report["slices"]["alice"]["gpus"]["GPU-t"]["state"] == "over"
    # ...but what it held is on its way back: the older process is not ended for it.
    assert older.poll() is None
    assert [a["pid"] for a in report["actions"]] == [newer.pid]
    assert newer.wait(10) == -9
