"""Environment fuzz: malformed limits and settings fail closed, never "no limit".

Every case is a process with a fresh slice file, a valid 1 GiB memory limit
and context overhead, and then one to three settings taken from crafted lists
(the known hard cases: "\\t50" as an SM share, CUDA_DEVICE_MEMORY_LIMIT_16 and
_00, slice names "..", " " and one with a newline) or made by mutating valid
values at random: CUDA_DEVICE_MEMORY_LIMIT[_n], CUDA_DEVICE_SM_LIMIT[_n],
HAMI_SM_MODE, HAMI_MAX_DECODERS[_n], HAMI_SLICE (and HAMi's
CUDA_DEVICE_MEMORY_SHARED_CACHE), HAMI_CONTEXT_OVERHEAD.

The test judges each environment by the one grammar of the design (below,
``judge``): a malformed setting must make cuInit refuse with a "hami:" line
naming the variable; a well-formed environment must run with exactly the
limits it asks for (the slice file says so) and never get more memory than
its cap from the simulated GPU. Running despite a malformed setting, or with
less of a limit than asked, is a fail-open outcome.
"""

import json
import random
import re
import time
from dataclasses import dataclass

from adversarial_helpers import CAPPED, CRASH, FAIL_OPEN, HANG, REFUSED, Tally, hami_lines, run_fill, sanitizer_report
from native_helpers import GiB, SIM_CONTEXT, slice_device, slice_env

from hami_jupyter.slice.size import parse_size

RUN_TIMEOUT = 10.0
RANDOM_CASES = 200
BASE_LIMIT = GiB

MEMORY = "CUDA_DEVICE_MEMORY_LIMIT"
SM = "CUDA_DEVICE_SM_LIMIT"
DECODERS = "HAMI_MAX_DECODERS"
MODE = "HAMI_SM_MODE"
SLICE = "HAMI_SLICE"
SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
OVERHEAD = "HAMI_CONTEXT_OVERHEAD"
MAX_ORDINAL = 15  # a slice holds 16 GPUs

# ---- the grammar (docs: design.md "Malformed values are a clear error") ------------------------

_SMALL = re.compile(r"[0-9]{1,3}")
_ORDINAL = re.compile(r"0|[1-9][0-9]?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,62}")


def _size(value):
    try:
        return parse_size(value)
    except (ValueError, TypeError):
        return None


def _memory(value):
    n = _size(value)
    return n if n else None  # zero is no limit only by leaving the variable out


def _small(limit):
    def parse(value):
        return int(value) if _SMALL.fullmatch(value) and int(value) <= limit else None
    return parse


def valid_name(name):
    return bool(_NAME.fullmatch(name)) and not name.endswith(".slice")


def _slice_value(value):
    if not value:
        return False
    if "/" not in value:
        return valid_name(value)
    base = value.rsplit("/", 1)[1]
    if len(base) > 6 and base.endswith(".slice"):
        base = base[:-6]
    return valid_name(base)


PER_GPU = ((MEMORY, _memory), (SM, _small(100)), (DECODERS, _small(255)))


@dataclass
class Verdict:
    bad: list        # names of malformed variables (then CUDA must be refused)
    memory: dict     # "default" / ordinal -> bytes
    sm: dict
    decoders: dict
    mode: str
    overhead: int

    def limit(self, table, ordinal):
        return table.get(ordinal, table.get("default", 0))


def judge(env):
    """What the environment asks for, or which of its variables are malformed."""
    bad, tables = [], {MEMORY: {}, SM: {}, DECODERS: {}}
    for name, value in env.items():
        for prefix, parse in PER_GPU:
            if name == prefix:
                key = "default"
            elif name.startswith(prefix + "_"):
                suffix = name[len(prefix) + 1:]
                if not _ORDINAL.fullmatch(suffix) or int(suffix) > MAX_ORDINAL:
                    bad.append(name)
                    break
                key = int(suffix)
            else:
                continue
            parsed = parse(value)
            if parsed is None:
                bad.append(name)
            else:
                tables[prefix][key] = parsed
            break
    mode = env.get(MODE, "hard")
    if mode not in ("hard", "elastic"):
        bad.append(MODE)
    overhead = _size(env[OVERHEAD]) if OVERHEAD in env else None
    if OVERHEAD in env and overhead is None:
        bad.append(OVERHEAD)
    slice_var = SLICE if SLICE in env else SHARED_CACHE
    if slice_var in env and not _slice_value(env[slice_var]):
        bad.append(slice_var)
    return Verdict(bad, tables[MEMORY], tables[SM], tables[DECODERS], mode,
                   overhead if overhead is not None else SIM_CONTEXT)


# ---- cases ---------------------------------------------------------------------------------------

CRAFTED = [
    # (class, variables; None unsets)
    *[("sm-share", {SM: v}) for v in ["\t50", " 50", "50 ", "50\n", "+50", "-1", "101", "1000", "5O", "",
                                      "0x32", "50%", "\u0665\u0660", "50.0", "0050", "050", "1e2"]],
    *[("sm-share-ordinal", {f"{SM}_{n}": "50"}) for n in ["16", "00", "01", "-1", "x", "", "1_", "99", "0 "]],
    *[("memory", {MEMORY: v}) for v in ["1gg", " 1g", "1g ", "\t1g", "1g\n", "-1g", "1e9", "0x40000000",
                                        "1,5g", "1.5.g", "1..5g", "g", ".g", "1.g", "18446744073709551616",
                                        "99999999999999999999", "17179869184t", "0", "0g", "0.0g", "",
                                        "1 g", "\uff11g", "1gi", "1GiB", "1Gb", "512MiB", "1.5k"]],
    *[("memory-ordinal-only", {MEMORY: None, f"{MEMORY}_{n}": "1g"}) for n in ["16", "00", "01", "64", "-0",
                                                                                "1a", "", "0x0"]],
    ("memory-ordinal-only", {MEMORY: None, f"{MEMORY}_0": "1g"}),
    ("memory-ordinal", {f"{MEMORY}_0": "2g"}),
    ("memory-ordinal", {f"{MEMORY}_0": "512m", f"{MEMORY}_1": "1x"}),
    *[("decoders", {DECODERS: v}) for v in ["256", "-1", " 4", "4 ", "x", "", "1000", "4", "0"]],
    *[("decoders-ordinal", {f"{DECODERS}_{n}": "4"}) for n in ["16", "00", "0", "1"]],
    *[("sm-mode", {MODE: v}) for v in ["Hard", "HARD", "hard ", " elastic", "", "soft", "elastic\n",
                                       "elastic", "hard"]],
    *[("slice-name", {SLICE: v}) for v in ["..", ".", " ", "a\nb", "", "-x", ".hidden", "a b", "a/..", "../x",
                                           "/", "x.slice", "a" * 64, "a" * 63, "\u00fc", "a*b", "ok-name",
                                           "user@example.org"]],
    *[("shared-cache", {SLICE: None, SHARED_CACHE: v}) for v in ["..", "", " ", "ok"]],
    *[("context-overhead", {OVERHEAD: v}) for v in ["-1", "64 m", "abc", "", "1e6", "64m ", "0", "128m"]],
]

_NOISE = list("0123456789kmgtKMGTiIbB.,-+ \t\n_xe%/") + ["\u0660", "\uff10", "\u00a0", "\x7f", "\x01"]
_SEEDS = {
    MEMORY: ["1g", "1024m", "1073741824", "1GiB", "0.5g"],
    SM: ["50", "25", "100", "0", "7"],
    DECODERS: ["4", "0", "255", "16"],
    MODE: ["hard", "elastic"],
    SLICE: ["team", "alice", "a.b_c@d+e-f"],
    OVERHEAD: ["64m", "0", "128m"],
}


def _mutate(rng, text):
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(4)
        at = rng.randrange(len(chars) + 1)
        if op == 0 or not chars:
            chars.insert(at, rng.choice(_NOISE))
        elif op == 1:
            del chars[min(at, len(chars) - 1)]
        elif op == 2:
            chars[min(at, len(chars) - 1)] = rng.choice(_NOISE)
        else:
            chars = chars + chars[: rng.randint(1, len(chars))]
    return "".join(chars)


def _random_name(rng, prefix):
    r = rng.random()
    if r < 0.5:
        return prefix
    if r < 0.8:
        return f"{prefix}_{rng.randrange(18)}"
    return f"{prefix}_" + _mutate(rng, str(rng.randrange(16)))


def random_cases(rng, count):
    out = []
    for _ in range(count):
        variables = {}
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.choice([MEMORY, SM, DECODERS, MODE, SLICE, OVERHEAD])
            value = rng.choice(_SEEDS[kind])
            if rng.random() < 0.8:
                value = _mutate(rng, value)
            name = _random_name(rng, kind) if kind in (MEMORY, SM, DECODERS) else kind
            if "=" in name or "\0" in name or "\0" in value:
                continue
            variables[name] = value
        if variables:
            out.append(("random", variables))
    return out


# ---- running a case ----------------------------------------------------------------------------


def _records(out):
    return {r["op"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}


def _slice_path(env):
    """Where the library puts the slice file for this environment (a valid one)."""
    value = env.get(SLICE, env.get(SHARED_CACHE))
    if "/" in value:
        return value
    return f"{env['HAMI_SLICE_ROOT']}/{value}.slice"


def _less_limited(verdict, dev):
    """How the slice file's limit for CUDA ordinal 0 is less than asked, or ''."""
    from hami_jupyter.slice.file import read_snapshot

    asked_mem = verdict.limit(verdict.memory, 0)
    asked_sm = verdict.limit(verdict.sm, 0)
    asked_sm = 0 if asked_sm in (0, 100) else asked_sm
    asked_dec = verdict.limit(verdict.decoders, 0)
    got = dev.limit
    got_sm = 0 if got.sm_share in (0, 100) else got.sm_share
    why = []
    if asked_mem and (not got.memory_limit or got.memory_limit > asked_mem):
        why.append(f"memory {got.memory_limit} for {asked_mem}")
    if asked_sm and (not got_sm or got_sm > asked_sm):
        why.append(f"SM share {got.sm_share} for {asked_sm}")
    if asked_dec and (not got.max_decoders or got.max_decoders > asked_dec):
        why.append(f"decoders {got.max_decoders} for {asked_dec}")
    if asked_sm and got.mode != verdict.mode:
        why.append(f"mode {got.mode} for {verdict.mode}")
    del read_snapshot
    return ", ".join(why)


def test_malformed_environments_fail_closed(cudrive, gpu, seed, report, tmp_path):
    from hami_jupyter.slice.file import read_snapshot

    base_seed, rng_seed = seed
    rng = random.Random(rng_seed)
    report(f"seed {base_seed} (HAMI_ADVERSARIAL_SEED), stream {rng_seed}")
    cases = CRAFTED + random_cases(rng, RANDOM_CASES)
    folder = tmp_path / "fuzz"
    folder.mkdir(mode=0o700)
    uuid0 = gpu.uuid(0)
    outcomes, by_class, bad = Tally(), {}, []
    notes = Tally()
    started = time.monotonic()
    for n, (cls, variables) in enumerate(cases):
        root = folder / f"r{n}"
        root.mkdir(mode=0o700)
        env = slice_env(gpu, folder / f"c{n}.slice", limit="1g", overhead="64m", HAMI_SLICE_ROOT=root)
        for name, value in variables.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        verdict = judge(env)
        rc, out, err = run_fill(cudrive, env, RUN_TIMEOUT)
        recs = _records(out)
        ran = recs.get("init", {}).get("rc") == 0 and recs.get("ctx", {}).get("rc") == 0
        got = (recs["fill"]["bytes"] + SIM_CONTEXT) if ran and "fill" in recs else 0
        shown = {k: v for k, v in variables.items()}
        if rc is None:
            outcome, why = HANG, f"no exit within {RUN_TIMEOUT} s"
        elif rc < 0 or sanitizer_report(err) or "fill" not in recs:
            outcome, why = CRASH, f"exit {rc}"
        elif verdict.bad:
            if ran:
                outcome = FAIL_OPEN
                why = (f"ran despite malformed {verdict.bad}"
                       + (f", and got {got} bytes: unlimited" if got > BASE_LIMIT else ""))
            elif not any(any(b.split("=")[0] in line for b in verdict.bad) for line in hami_lines(err)):
                outcome, why = REFUSED, ""
                notes["refused without naming the variable"] += 1
            else:
                outcome, why = REFUSED, ""
        elif not ran:
            outcome, why = REFUSED, ""
            notes[f"well-formed but refused ({cls})"] += 1
        else:
            cap = verdict.limit(verdict.memory, 0)
            bound = cap + max(0, SIM_CONTEXT - verdict.overhead) if cap else None
            outcome, why = CAPPED, ""
            if bound is not None and got > bound:
                outcome, why = FAIL_OPEN, f"got {got} bytes for a {cap}-byte cap"
            else:
                try:
                    dev = slice_device(read_snapshot(_slice_path(env)), uuid0)
                    less = _less_limited(verdict, dev) if dev else "no entry for GPU 0"
                except Exception as e:  # noqa: BLE001 - any reading error is reported with the case
                    less = f"slice file unreadable: {e}"
                if less:
                    outcome, why = FAIL_OPEN, f"the slice holds less than asked: {less}"
        outcomes[outcome] += 1
        by_class.setdefault(cls, Tally())[outcome] += 1
        if outcome in (FAIL_OPEN, CRASH, HANG):
            bad.append(f"case {n} ({cls}) {shown!r}: {outcome}: {why}\n  stderr: "
                       f"{' | '.join(hami_lines(err))[:400] or err.strip()[-400:]}")
    took = time.monotonic() - started
    report(f"{len(cases)} environments ({len(CRAFTED)} crafted, {len(cases) - len(CRAFTED)} random) "
           f"in {took:.1f} s: {outcomes}")
    for cls in sorted(by_class):
        report(f"  {cls}: {by_class[cls]}")
    if notes:
        report(f"notes (not failures): {notes}")
    for line in bad:
        report(f"  {line.splitlines()[0]}")
    assert not bad, f"{len(bad)} of {len(cases)} environments failed:\n" + "\n".join(bad[:30])
