"""The test command (dev/test.sh) runs every pass and says how each one ended (issue 39, item 15).

A fresh-clone run failed in its release pass, and ``set -e`` stopped the
script there: the ASan and TSan passes never ran and said nothing. The passes
now go through dev/passes.sh: each runs whatever the one before it did, each
one's summary is printed at the end, and the exit status is nonzero when any
failed.
"""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
set -euo pipefail
source dev/passes.sh
first() { echo "=========== 3 passed in 1.00s ==========="; }
second() { echo "=========== 1 failed, 2 passed in 2.00s ==========="; false; echo "after the failure"; }
third() { echo "third ran"; echo "=========== 4 passed in 3.00s ==========="; }
run_pass first first
run_pass second second
run_pass third third
passes_summary
echo "not reached: the summary failed"
"""


def test_a_failing_pass_stops_none_after_it_and_fails_the_run():
    done = subprocess.run(["bash", "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "third ran" in out  # the pass after the failing one ran
    assert "after the failure" not in out  # a pass ends at its own first failing step
    assert "not reached" not in out
    summary = out[out.index("dev/test.sh: summary"):].splitlines()[1:]
    assert [line.split()[:2] for line in summary] == [["first", "ok"], ["second", "FAILED"], ["third", "ok"]]
    assert "1 failed, 2 passed in 2.00s" in summary[1] and "4 passed in 3.00s" in summary[2], summary


def test_the_test_command_runs_each_pass_through_the_runner():
    text = (REPO / "dev" / "test.sh").read_text()
    assert "source dev/passes.sh" in text
    for name in ("jest", "release", "asan", "tsan"):
        assert f"run_pass {name} " in text, name
    assert text.rstrip().endswith("passes_summary")
