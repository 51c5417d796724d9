"""Helpers of the adversarial suite (fixtures are in conftest.py).

* ``Tally``: outcomes counted by class, printed as one line.
* ``frozen(pids)``: a context in which every listed process is stopped
  (SIGSTOP, waited for), so that the slice file and the simulated GPU can be
  read at one consistent moment; SIGCONT on the way out, whatever happens.
* ``sim_live_used(status, index)``: what the simulated GPU says its live
  processes hold on one device (the ground truth of real usage).
* ``run_fill(...)``: one cudrive run that fills the GPU, with a time limit.
* ``build_program(...)``: one of the suite's C programs, built with the
  library's sanitizer, so that races in the program's own threads show too.
"""

import os
import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager

from native_helpers import NATIVE, SANITIZER_MARKS

# Outcome classes shared by the corrupted-file and environment tests.
CAPPED = "capped"              # ran, and stopped at (or below) the cap
REFUSED = "refused"            # CUDA refused, with a "hami:" line on stderr
SILENT_REFUSAL = "silent-refusal"  # CUDA refused without a word: a failure
FAIL_OPEN = "FAIL-OPEN"        # got past the cap, or ran where it had to refuse
CRASH = "CRASH"                # ended by a signal, or a sanitizer report
HANG = "HANG"                  # did not finish in time


class Tally(Counter):
    """Outcomes by class: ``str(t)`` is ``capped 12, refused 30``."""

    def __str__(self):
        return ", ".join(f"{k} {v}" for k, v in sorted(self.items())) or "nothing"


def process_state(pid):
    """The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z'...), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


@contextmanager
def frozen(pids, timeout=10.0):
    """Stop every process of *pids* (and wait until each is stopped); resume at exit."""
    pids = list(pids)
    sent = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                sent.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for pid in sent:
            while process_state(pid) not in (None, "T", "t", "Z", "X"):
                if time.monotonic() > deadline:
                    raise AssertionError(f"process {pid} did not stop within {timeout} s")
                time.sleep(0.001)
        yield
    finally:
        for pid in sent:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def sim_live_used(status, index):
    """Bytes the simulated GPU's live processes hold on device *index*."""
    return sum(p["used"][index] for p in status["processes"] if p.get("alive", True))


def sanitizer_report(stderr):
    return any(mark in stderr for mark in SANITIZER_MARKS)


def hami_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("hami:")]


def run_fill(cudrive, env, timeout, fill="fill 64m"):
    """cudrive ``init ctx 0 <fill>`` in *env*: ``(exit status, stdout, stderr)``;
    the status is None when it did not finish within *timeout* s (then killed)."""
    proc = subprocess.Popen([str(cudrive.path), "init", "ctx", "0", *fill.split()], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


# Compiler flags of the suite's C programs, per library build (hami_build.sanitizer).
PROGRAM_FLAGS = {
    "": ["-O2"],
    "asan": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"],
    "tsan": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=thread"],
}


def build_program(source, out, sanitizer):
    """Build the threaded C program *source* into *out* with *sanitizer*'s flags."""
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", *PROGRAM_FLAGS[sanitizer],
           f"-I{NATIVE / 'include'}", "-pthread", "-o", str(out), str(source), "-ldl"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}"
    return out
