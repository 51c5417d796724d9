"""What bench/oversubscribe.py decides before it starts, and how it judges a run.

Pure arithmetic over facts handed in (the GPU's memory, a session's
footprint, the host's available memory): no GPU, torch or agent here, so
tests/bench/test_oversubscribe_plan.py checks it anywhere.

- :func:`parse_headrooms`: ``--headroom 16g,0``, one row each;
- :func:`size_sessions`: how many sessions by default, and why (enough to
  need 25 % more GPU memory than the GPU holds, no more than host memory can
  hold for the parked ones);
- :class:`CellPlan`: when each session's cells start (the real run and the
  estimate draw the same times);
- :func:`estimate`: how long the whole invocation takes;
- :func:`verdicts`: each of issue 38's targets for a row, met or not.
"""

import math
import os
import random
from dataclasses import dataclass, field

GiB = 1 << 30
MiB = 1 << 20

OVERSUBSCRIPTION = 1.25  # the sessions' footprints together, as a multiple of the GPU's memory
HOST_MARGIN = 0.10  # of the host's available memory, kept beside the agent's reserve ...
HOST_MARGIN_MIN = 4 * GiB  # ... and at least this much
SESSION_HOST_GUESS = 3 * GiB  # a session's own host memory until one is measured


def fmt(n):
    """Bytes in GiB, one decimal: the unit every figure of this bench is printed in."""
    return f"{n / GiB:.1f} GiB"


def parse_headrooms(text, gib):
    """``--headroom``: a comma list of sizes, one row each, run in that order.
    None (the option left out) is one row with one working set of headroom.
    Returns ``[(label, bytes)]``; ValueError says which entry is wrong."""
    from hami_jupyter.slice.size import parse_size

    if text is None:
        text = f"{gib:g}g"
    rows = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"--headroom {text!r}: an empty entry; give sizes separated by commas (16g,0)")
        try:
            rows.append((entry, parse_size(entry)))
        except ValueError as e:
            raise ValueError(f"--headroom {text!r}: {e}") from None
    return rows


def estimated_footprint(gib):
    """A session's GPU memory before one is measured: the working set, one
    more copy of the parameters (Adam's step keeps temporaries of their size
    in PyTorch's cache; the parameters are 1/8 of the working set) and 0.75 GiB
    for the CUDA context, cuBLAS's workspace and the activations. 16 GiB gives
    18.75 GiB; the H200 parked 18.6-18.8 GiB per 16-GiB session (issue 38)."""
    return int(gib * GiB * 9 / 8 + 0.75 * GiB)


def resident(gpu_bytes, footprint, headroom=0):
    """How many sessions stay on the GPU while *headroom* bytes are kept free."""
    return max(0, (gpu_bytes - headroom) // footprint)


def parked_at_most(n, gpu_bytes, footprint, headroom):
    """The most sessions parked at once (their GPU state in host memory) when
    *n* take turns. With the headroom kept, the GPU holds ``resident(...,
    headroom)`` and the rest are parked; when a resume fits in the free memory
    that leaves, it comes back before the next park for the headroom, else
    (no headroom, or one too small) a park makes its room first and one more
    is parked until the resume is done."""
    kept = resident(gpu_bytes, footprint, headroom)
    if n <= kept:
        return 0
    fits_a_resume = kept < resident(gpu_bytes, footprint)
    return min(n, n - kept + (0 if fits_a_resume else 1))


def host_margin(host_available):
    return max(HOST_MARGIN_MIN, int(HOST_MARGIN * host_available))


def host_need(n, gpu_bytes, footprint, headroom, session_host, host_reserve):
    """Host memory *n* sessions need at their worst: each one's own memory,
    the parked ones' GPU state, and the agent's reserve (a park that would
    leave less available is refused)."""
    return n * session_host + parked_at_most(n, gpu_bytes, footprint, headroom) * footprint + host_reserve


def sessions_for_gpu(gpu_bytes, footprint, factor=OVERSUBSCRIPTION):
    """The fewest sessions whose footprints add up to *factor* times the GPU
    (and at least one more than the GPU holds)."""
    return max(math.ceil(factor * gpu_bytes / footprint), resident(gpu_bytes, footprint) + 1)


def sessions_for_host(gpu_bytes, footprint, headrooms, session_host, host_available, host_reserve):
    """The most sessions whose worst host need, under every headroom of the
    run, stays below the available memory less the margin (0 if not even one)."""
    budget = host_available - host_margin(host_available)
    n = 0
    while n < 10000 and all(host_need(n + 1, gpu_bytes, footprint, h, session_host, host_reserve) <= budget
                            for h in headrooms):
        n += 1
    return n


@dataclass
class Sizing:
    gpu_bytes: int
    footprint: int
    footprint_from: str  # "measured ...", "estimated ...", "given"
    session_host: int
    session_host_from: str
    host_available: int
    host_reserve: int
    headrooms: list  # bytes, one per row
    for_gpu: int
    for_host: int
    sessions: int
    asked: int = None  # --sessions
    warnings: list = field(default_factory=list)

    def lines(self):
        """The sizing and why, as printed before the run starts."""
        g, fp = self.gpu_bytes, self.footprint
        out = [f"GPU: {fmt(g)}; a session's footprint {fmt(fp)} ({self.footprint_from}); "
               f"{resident(g, fp)} fit at once",
               f"for the GPU: {self.for_gpu} sessions ({fmt(self.for_gpu * fp)}, "
               f"{self.for_gpu * fp / g:.0%} of the GPU; the target is {OVERSUBSCRIPTION:.0%})",
               f"host: {fmt(self.host_available)} available, less the agent's reserve {fmt(self.host_reserve)} "
               f"and a margin of {fmt(host_margin(self.host_available))}; a session's own host memory "
               f"{fmt(self.session_host)} ({self.session_host_from})"]
        for h in self.headrooms:
            k = parked_at_most(self.sessions, g, fp, h)
            need = host_need(self.sessions, g, fp, h, self.session_host, self.host_reserve)
            out.append(f"  headroom {fmt(h)}: {resident(g, fp, h)} stay on the GPU; {self.sessions} sessions "
                       f"park up to {k} at once: {self.sessions} x {fmt(self.session_host)} + {k} x {fmt(fp)} "
                       f"+ {fmt(self.host_reserve)} = {fmt(need)} of host memory")
        out.append(f"for the host: at most {self.for_host} sessions")
        why = "given by --sessions" if self.asked else (
            "as many as the GPU needs" if self.sessions == self.for_gpu else "as many as host memory holds")
        out.append(f"sessions: {self.sessions} ({why}; {fmt(self.sessions * fp)} asked of {fmt(g)}, "
                   f"{self.sessions * fp / g:.0%})")
        return out + [f"WARNING: {w}" for w in self.warnings]


def size_sessions(gpu_bytes, footprint, session_host, host_available, host_reserve, headrooms, asked=None,
                  footprint_from="measured", session_host_from="measured"):
    """How many sessions to run: by default the fewest that need 25 % more
    GPU memory than the GPU holds, but no more than host memory holds for the
    parked ones; *asked* (``--sessions``) overrides, with a warning where host
    memory cannot hold it or the GPU would not be oversubscribed."""
    for_gpu = sessions_for_gpu(gpu_bytes, footprint)
    for_host = sessions_for_host(gpu_bytes, footprint, headrooms, session_host, host_available, host_reserve)
    sessions = asked if asked else min(for_gpu, for_host)
    warnings = []
    if sessions > for_host:
        warnings.append(f"host memory holds {for_host} sessions of this size taking turns, not {sessions}: "
                        f"parks may be refused for want of host memory")
    if sessions <= resident(gpu_bytes, footprint):
        warnings.append(f"{sessions} sessions of {fmt(footprint)} fit the GPU at once: nothing needs a park")
    return Sizing(gpu_bytes, footprint, footprint_from, session_host, session_host_from, host_available,
                  host_reserve, list(headrooms), for_gpu, for_host, sessions, asked, warnings)


class CellPlan:
    """When each session's cells start: the first at a random offset up to
    the longest idle spell, each next one an idle spell after the last one
    answered, drawn from one seed in the order sessions come up. The run asks
    :meth:`due` every tick; :func:`simulated_run_s` asks it the same way on a
    made-up clock, so the estimate draws the times the run will."""

    def __init__(self, sessions, bursts, idle, seed, t0=0.0):
        self.rng = random.Random(seed)
        self.idle = idle
        self.bursts = bursts
        self.at = {i: t0 + self.rng.uniform(0, idle[1]) for i in range(sessions)}
        self.started = {i: 0 for i in range(sessions)}

    def due(self, now, free):
        """The sessions of *free* (not in a cell now) whose next cell starts now."""
        out = []
        for i in sorted(free):
            if self.started[i] >= self.bursts:
                continue
            if self.at[i] is None:  # its last cell has answered: its idle spell starts now
                self.at[i] = now + self.rng.uniform(*self.idle)
            if now >= self.at[i]:
                out.append(i)
                self.started[i] += 1
                self.at[i] = None
        return out

    def done(self):
        return all(n >= self.bursts for n in self.started.values())


TICK_S = 0.05


def simulated_run_s(sessions, bursts, idle, seed, cell_s):
    """Seconds from the first cell's plan to the last cell's end, each cell
    taking *cell_s*."""
    plan, ends, now = CellPlan(sessions, bursts, idle, seed), {}, 0.0
    while not plan.done():
        for i in plan.due(now, [i for i in range(sessions) if ends.get(i, 0.0) <= now]):
            ends[i] = now + cell_s
        now += TICK_S
    return max(ends.values(), default=0.0)


@dataclass
class Timing:
    """Seconds the estimate counts with. The first four are replaced by the
    reference's first session once it has run (process start, building the
    working set, one step); the rest are records: the H200 parked a 16-GiB
    session (18.7 GiB) in 8.5-13.1 s in issue 38, the H100 resumed 8 GiB in
    1.6-2.0 s (bench/parking.py)."""
    make_s: float = 30.0  # make -C native on a fresh machine
    process_s: float = 10.0  # Python, torch's import and the CUDA context
    build_s_per_gib: float = 0.5  # the model on the CPU and to the GPU, the data on the GPU
    step_s_per_gib: float = 0.004  # one training step (fp32, no TF32)
    measured: bool = False
    park_gib_per_s: float = 1.8
    resume_gib_per_s: float = 5.0
    stagger_s: float = 0.5  # between two sessions' starts
    end_s: float = 15.0  # the sessions' quit (10 s at most) and the agent's end
    grace_s: float = 30.0  # cells under way at a row's run limit get this long (a cell still waiting then
    # has waited about as long as the target allows)


def reference_workers(n, gpu_bytes, footprint, cpus, host_each=0, host_available=0):
    """Processes that compute the reference side by side: as many as fit the
    GPU with one session's room to spare, one per two CPUs, at most 8, and
    within half the host's available memory at *host_each* each (its own
    memory and the model, built on the CPU first)."""
    by_host = host_available // 2 // host_each if host_each and host_available else n
    return max(1, min(n, resident(gpu_bytes, footprint) - 1, cpus // 2, 8, by_host))


def setup_s(sizing, t, gib, headroom):
    """A row's set-up: the sessions start *stagger_s* apart, each builds its
    working set, and those past what the GPU keeps wait for a park each, one
    after another."""
    n, fp = sizing.sessions, sizing.footprint
    parks = max(0, n - resident(sizing.gpu_bytes, fp, headroom))
    return t.stagger_s * n + t.process_s + t.build_s_per_gib * gib + parks * fp / GiB / t.park_gib_per_s


def row_limits(time_left, rows_left, setup_est, run_limit, setup_limit, t):
    """``(run_limit, setup_limit)`` for the next row under ``--time-limit``:
    the time left is shared evenly by the rows left, and a row's cells stop
    early enough that its set-up, its cells' grace and its end fit its share
    (never more than the limits asked for)."""
    share = time_left / rows_left
    return (max(0.0, min(run_limit, share - setup_est - t.grace_s - t.end_s)),
            max(0.0, min(setup_limit, share - t.grace_s - t.end_s)))


def estimate(sizing, t, gib, bursts, steps, idle, seed, run_limit, cpus, reference_seeds=None, measure=True,
             time_limit=None):
    """``{part: seconds}`` for the whole invocation: build, reference, each row
    (a row's cells cut at *run_limit*, and at its share of *time_limit*)."""
    n, fp = sizing.sessions, sizing.footprint
    build = t.build_s_per_gib * gib
    step = t.step_s_per_gib * gib
    seeds = n if reference_seeds is None else reference_seeds
    parts = {"make": t.make_s}
    ref = 0.0
    if measure:  # the first session alone: it measures the footprint
        ref += t.process_s + build + bursts * steps * step
        seeds = max(0, seeds - 1)
    if seeds:
        k = reference_workers(seeds, sizing.gpu_bytes, fp, cpus, sizing.session_host + int(gib * GiB / 8),
                              sizing.host_available)
        ref += t.process_s + math.ceil(seeds / k) * build + seeds * bursts * steps * step
    parts["reference"] = ref
    park_s, resume_s = fp / GiB / t.park_gib_per_s, fp / GiB / t.resume_gib_per_s
    for i, h in enumerate(sizing.headrooms):
        kept = resident(sizing.gpu_bytes, fp, h)
        setup = setup_s(sizing, t, gib, h)
        parked = parked_at_most(n, sizing.gpu_bytes, fp, h) / n
        # A cell of a parked session waits for its resume, and for a park first
        # where the headroom leaves no room for it.
        wait = parked * (resume_s + (0 if kept < resident(sizing.gpu_bytes, fp) else park_s))
        run = simulated_run_s(n, bursts, idle, seed, steps * step + wait)
        limit = run_limit
        if time_limit:
            left = time_limit - sum(parts.values())
            limit = row_limits(left, len(sizing.headrooms) - i, setup, run_limit, float("inf"), t)[0]
        parts[f"row {i + 1}"] = setup + min(run, limit + t.grace_s) + t.end_s
    return parts


def minutes(s):
    return f"{s / 60:.1f} min"


# ---- the targets (issue 38) ---------------------------------------------------------

P95_WITH_HEADROOM_S = 6.0
P95_WITHOUT_S = 15.0
LONGEST_WAIT_S = 30.0


def p95(values):
    """The 95th percentile by nearest rank: of 11 values the longest, of 40 the 38th."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def verdicts(row):
    """Each target of issue 38 for one row's figures (a dict as
    bench/oversubscribe.py writes it): ``[{"name", "target", "measured", "met"}]``,
    in the same order for every row."""
    ran = row.get("cells", 0) > 0
    limit = P95_WITH_HEADROOM_S if row["headroom_bytes"] else P95_WITHOUT_S
    p = row.get("obstructed_p95_s")
    longest = row.get("longest_wait_s")
    cut = " (cut by the run limit)" if row.get("incomplete") else ""

    def one(name, target, measured, met):
        return {"name": name, "target": target, "measured": measured, "met": bool(met)}

    return [
        one("set-ups", "0 failed set-ups", str(row["failed_setups"]), row["failed_setups"] == 0),
        one("cells", "all cells run", f"{row.get('cells', 0)} of {row['cells_planned']}{cut}",
            row.get("cells", 0) == row["cells_planned"] and not row.get("incomplete")),
        one("steps", "0 failed steps", str(row["failed_steps"]) if ran else "not run",
            ran and row["failed_steps"] == 0),
        one("parks", "0 failed parks", str(row.get("broker_park_failures", 0)),
            row.get("broker_park_failures", 0) == 0),
        one("losses", "losses bit for bit", ("yes" if row.get("losses_equal_reference") else "no") if ran
            else "not run", ran and row.get("losses_equal_reference")),
        one("p95", f"obstructed cells p95 <= {limit:g} s ({'with' if row['headroom_bytes'] else 'without'} "
                   f"a headroom)",
            "not run" if not ran else ("none obstructed" if p is None
                                       else f"{p:.1f} s ({row['obstructed_cells']} obstructed)"),
            ran and (p is None or p <= limit)),
        one("longest", f"no cell waits more than {LONGEST_WAIT_S:g} s",
            "not run" if not ran else ("-" if longest is None else f"longest {longest:.1f} s"),
            ran and (longest is None or longest <= LONGEST_WAIT_S)),
    ]


def targets_table(rows):
    """Every row's targets side by side, in markdown, a miss in bold."""
    out = ["| target | " + " | ".join(f"row {r['row']}: headroom {r['headroom']}" for r in rows) + " |",
           "|" + " --- |" * (len(rows) + 1)]
    for j, first in enumerate(rows[0]["targets"]):
        texts = list(dict.fromkeys(r["targets"][j]["target"] for r in rows))
        common = os.path.commonprefix(texts)
        common = common[:common.rfind(" ") + 1] if len(texts) > 1 else common  # at a word's start
        label = common + " / ".join(text[len(common):] for text in texts)
        cells = [r["targets"][j]["measured"] + ("" if r["targets"][j]["met"] else " (**missed**)") for r in rows]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)
