"""The launch-overhead rows of bench/sm_share.py: their figures and when their rounds may stop.

The hook's cost (tens of ns a launch) is far smaller than how much the
driver's own launch time moves between processes on a shared host (hundreds
of ns): comparing a run without the preload to a run with it gave figures
from -438 to +692 ns for the same code, and after 120 s of such rounds the
95 % intervals were still 103 and 170 ns wide on an H100 (issue 34). So each
process measures the cost inside itself (driver_overhead pairs): blocks of
launches through the hook and through the driver's own entry point
alternate, and a pair's difference is what the hook added, on the same CPU,
cache and driver state. A run without the preload does the same with the
driver's entry point on both sides: its differences are the method's own
noise, and should sit around 0.

The figure of a mode is the median of its pairs' differences over every
round; its 95 % interval is bootstrapped over rounds, then pairs within
them (a process may differ from the next as a whole: code placement, the
CPU it runs on). Rounds are added until both compared modes' intervals are
narrower than CI_WIDTH_NS, or the time cap passes. A row whose interval
stayed wider is not met: its figure cannot tell the target apart.
"""
import random
import statistics

CI_WIDTH_NS = 20.0
COMPARED = ("preload", "preload_sm90")  # each against the driver's own entry point in the same process
MODES = ("none",) + COMPARED  # none: no preload, the driver on both sides: the method's noise


def pooled(samples, mode):
    """Every pair's difference (ns per launch, hook less driver) of *mode*'s rounds."""
    return [d for run in samples[mode] for d in run["diff_ns"]]


def added(samples, mode):
    values = pooled(samples, mode)
    return statistics.median(values) if values else None


def bootstrap_ci(runs, level=0.95, resamples=1000, seed=34):
    """Percentile bootstrap interval (lo, hi) of the median of the pooled
    differences, resampling the rounds (*runs*: one list of differences per
    round) and then the pairs within each; a fixed seed, so that the same
    samples give the same interval. None without two differences."""
    runs = [r for r in runs if r]
    if sum(len(r) for r in runs) < 2:
        return None
    rng = random.Random(seed)
    medians = []
    for _ in range(resamples):
        chosen = rng.choices(runs, k=len(runs)) if len(runs) > 1 else runs
        medians.append(statistics.median([d for r in chosen for d in rng.choices(r, k=len(r))]))
    medians.sort()
    lo = medians[int(resamples * (1 - level) / 2)]
    hi = medians[min(resamples - 1, int(resamples * (1 + level) / 2))]
    return lo, hi


def intervals(samples):
    return {m: bootstrap_ci([run["diff_ns"] for run in samples.get(m, [])]) for m in MODES}


def narrow(ci, width=CI_WIDTH_NS):
    return ci is not None and ci[1] - ci[0] < width


def instructions(samples, mode):
    """Instructions per launch the hook added (mean over rounds), where the
    host let the process count its own; None elsewhere."""
    got = [run["instructions"]["hooked"] - run["instructions"]["real"]
           for run in samples.get(mode, []) if run.get("instructions")]
    return statistics.mean(got) if got else None


def stop_rule(samples, min_rounds, elapsed_s, cap_s):
    """(stop, why): stop once at least *min_rounds* rounds are in and both
    compared modes' intervals are narrower than CI_WIDTH_NS, or once *cap_s*
    has passed."""
    rounds = min(len(samples.get(m, [])) for m in MODES)
    cis = intervals(samples)
    if rounds >= min_rounds and all(narrow(cis[m]) for m in COMPARED):
        return True, f"both 95 % intervals narrower than {CI_WIDTH_NS:g} ns"
    if elapsed_s >= cap_s:
        return True, f"time cap of {cap_s:g} s reached"
    return False, ""
