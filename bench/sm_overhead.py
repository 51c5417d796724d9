"""When the launch-overhead rounds of bench/sm_share.py may stop.

The hook's cost (tens of ns a launch) is far smaller than how much the
driver's own launch time moves between runs on a shared host (hundreds of
ns), so a fixed number of rounds gave figures from -438 to +692 ns for the
same code. Each round runs the three modes back to back, so a round's
difference (with the preload minus without) cancels the host's drift; the
figure is the median of those paired differences, and rounds are added
until the 95 % bootstrap interval of that median is narrower than
CI_WIDTH_NS for both modes, or the time cap is reached. A row whose
interval stayed wider is not met: its figure cannot tell the target apart.
"""
import random
import statistics

CI_WIDTH_NS = 20.0
COMPARED = ("preload", "preload_sm90")  # each against "none", the run without the preload


def paired_diffs(samples, mode):
    """Per round: launch ns of *mode* minus launch ns without the preload."""
    return [x["launch_ns"] - y["launch_ns"] for x, y in zip(samples[mode], samples["none"])]


def bootstrap_ci(values, level=0.95, resamples=2000, seed=29):
    """Percentile bootstrap interval (lo, hi) of the median of *values*; a
    fixed seed so that the same samples give the same interval."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    lo = medians[int(resamples * (1 - level) / 2)]
    hi = medians[min(resamples - 1, int(resamples * (1 + level) / 2))]
    return lo, hi


def intervals(samples):
    return {m: bootstrap_ci(paired_diffs(samples, m)) for m in COMPARED}


def narrow(ci, width=CI_WIDTH_NS):
    return ci is not None and ci[1] - ci[0] < width


def stop_rule(samples, min_rounds, elapsed_s, cap_s):
    """(stop, why): stop once at least *min_rounds* rounds are in and both
    intervals are narrower than CI_WIDTH_NS, or once *cap_s* has passed."""
    rounds = len(samples["none"])
    if rounds >= min_rounds and all(narrow(ci) for ci in intervals(samples).values()):
        return True, f"both 95 % intervals narrower than {CI_WIDTH_NS:g} ns"
    if elapsed_s >= cap_s:
        return True, f"time cap of {cap_s:g} s reached"
    return False, ""
