"""What a slice looks like right now, as plain data, and as text.

One function, :func:`slice_status`, reads a slice file and its kernel
registry and returns a dict that is the same for every viewer: ``%hami
status`` (text, HTML, ``--json``), ``hami-jupyter status``, the admin panel
and the server extension's REST API. Only plain types are in it, so
``json.dumps`` takes it as is. :func:`format_text` renders it for terminals;
:mod:`.status_html` for notebooks.

Each GPU's memory level ("ok", "warning", "critical") is worked out here with
the fractions of the cap the caller gives (the server extension's
configuration; 0.8 and 0.95 by default), and the dict carries them, so that
every rendering of it words the same thresholds.

Memory a dead process still holds in the file (its slot not yet reclaimed by
a process of the slice) is left out of ``memory_used``: it is no longer in
use, and the slice's next allocation at the cap returns it to the counter.
Memory of a parked kernel (docs/parking.md) is in host memory: it is
``memory_parked``, never ``memory_used``.

Each kernel carries ``notebook``: the path of the notebook it serves, as its
registry entry says (the provisioner records it at launch, the kernel's server
keeps it current); None when unknown. A claim of the slice's user, for people
to read.

The guard (``hami-jupyter guard``) reads every GPU process's real memory from
NVML and publishes what it saw in ``guard.json`` in the slice root
(:mod:`.guard_report`); the slice root is the slice file's folder. Beside the
slice's own (reported) figures each GPU carries the guard's: ``memory_real``
(bytes, None without a fresh report, or when the guard could not read that
GPU; 0 when it saw no process of the slice there) and ``guard_state`` ("ok",
"over" its cap, None without a fresh report), with ``guard_limit`` and
``guard_reported``, the cap and the slice's count as the guard saw them. The
slice's ``guard`` entry says whether a guard is running (``running``: a fresh
report exists), its ``action`` and when it last wrote (``written_unix``; both
from a stale report too, None without one), and ``error``, why a report that
exists could not be read. A report that cannot be read never fails the status.
A GPU the guard sees the slice use where no process of the slice runs under
the library (a bypass, so the slice file has no entry for it) is in the guard
entry's ``elsewhere``: ``{"uuid", "memory_real", "guard_state", "guard_limit",
"guard_reported"}`` each, and every rendering shows it.
"""

import os
import time

from . import guard_report, registry
from .file import read_snapshot
from .layout import (
    HAMI_PARK_PARKED,
    HAMI_PARK_PARKING,
    HAMI_PARK_RESUMING,
    HAMI_PARK_RUNNING,
    HAMI_PARK_REASON_ASKED,
    HAMI_PARK_REASON_GUARD,
    HAMI_PARK_REASON_IDLE,
    HAMI_PARK_REASON_ROOM,
    HAMI_PARK_WAIT_GPU,
    HAMI_PARK_WAIT_SLICE,
)
from .paths import slice_name
from .limits import effective_guarantee
from .size import format_size

# Where a process's GPU state is (hami_slot.park_state), by name; a kernel's is
# the furthest from the GPU of its processes'.
PARK_STATES = {HAMI_PARK_RUNNING: "running", HAMI_PARK_PARKING: "parking", HAMI_PARK_PARKED: "parked",
               HAMI_PARK_RESUMING: "resuming"}
_PARK_ORDER = ("running", "resuming", "parking", "parked")
PARK_WAITS = {HAMI_PARK_WAIT_SLICE: "room under the slice's memory cap",
              HAMI_PARK_WAIT_GPU: "free memory on the GPU"}
# Why a process was parked (hami_slot.park_reason), by the name hami-park takes,
# and in the words its user reads.
PARK_REASONS = {HAMI_PARK_REASON_IDLE: "idle", HAMI_PARK_REASON_ASKED: "asked",
                HAMI_PARK_REASON_ROOM: "room", HAMI_PARK_REASON_GUARD: "guard"}
PARK_REASON_WORDS = {"idle": "while idle",
                     "asked": "on request",
                     "room": "to make room for another user's work",
                     "guard": "by the guard (over the cap by the driver's figures)"}

WARNING_FRACTION = 0.80  # of the memory cap: a warning, unless configured otherwise
CRITICAL_FRACTION = 0.95  # of the memory cap: nearly out

# The guard's real figure is shown beside the reported one only when they differ
# by more than this (the CUDA context and NVML's rounding are not news).
REAL_SLACK_BYTES = 16 << 20
REAL_SLACK_FRACTION = 0.02  # of the reported figure


def check_fractions(warning, critical):
    """ValueError unless 0 < *warning* <= *critical* <= 1."""
    for name, value in (("warning", warning), ("critical", critical)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"the {name} fraction of the memory cap must be a number above 0 "
                             f"and at most 1, not {value!r}")
    if warning > critical:
        raise ValueError(f"the warning fraction ({warning}) must not be above the critical "
                         f"fraction ({critical})")


def memory_level(used, limit, warning=WARNING_FRACTION, critical=CRITICAL_FRACTION):
    """"ok", "warning" or "critical" for *used* of *limit* (0 = none), by the
    fractions of the cap *warning* and *critical*."""
    if not limit:
        return "ok"
    if used >= critical * limit:
        return "critical"
    if used >= warning * limit:
        return "warning"
    return "ok"


def _read_guard(root):
    """``(report or None, why it cannot be read or None)`` for the slice root *root*."""
    try:
        return guard_report.read_report(root), None
    except (guard_report.GuardReportError, OSError) as e:
        return None, str(e)


def _count(value):
    """*value* when it is a whole number of bytes, else None (the report is only JSON)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _guard_gpus(report, names):
    """``{uuid: the guard's GPU dict}`` of the slice, under the first of *names*
    the fresh *report* knows; {} when none does; None when the report is not
    shaped as its format says (then nothing of it is believed)."""
    for name in names:
        try:
            seen = guard_report.slice_view(report, name)
        except (AttributeError, TypeError, ValueError):
            return None
        if seen:
            return {u: g for u, g in seen.items() if isinstance(g, dict)}
    return {}


def _guard_fields(uuid, fresh, seen, errors):
    """The guard's fields of one GPU of the slice (see the module docstring)."""
    none = {"memory_real": None, "guard_state": None, "guard_limit": None, "guard_reported": None}
    if not fresh or seen is None:
        return none
    g = seen.get(uuid)
    if g is None:
        # The guard sees every GPU process of the host: none of this slice's
        # means none uses this GPU, unless it could not read the GPU at all.
        if any(uuid and uuid in str(e) for e in errors):
            return none
        return {"memory_real": 0, "guard_state": "ok", "guard_limit": None, "guard_reported": None}
    real = _count(g.get("real_bytes"))
    if real is None:
        return none
    state = g.get("state")
    return {"memory_real": real,
            "guard_state": state if state in ("over", "held") else "ok",
            "guard_limit": _count(g.get("limit_bytes")),
            "guard_reported": _count(g.get("reported_bytes"))}


def guard_entry(report, error):
    """The slice's ``guard`` entry for *report* (as :func:`.guard_report.read_report`
    gives it, or None) and the error reading it (or None)."""
    fresh = bool(report) and not report.get("stale")
    return {"running": fresh,
            "action": report.get("action") if report else None,
            "written_unix": report.get("written_unix") if report else None,
            "error": error,
            "elsewhere": [],
            "parked": []}


def _guard_parked(report, names):
    """The guard's park records of this slice's processes (kept whatever the
    report's age: a parked process stays parked while the guard is down)."""
    found = []
    for record in (report or {}).get("parked") or []:
        if isinstance(record, dict) and record.get("slice") in names and isinstance(record.get("pid"), int):
            found.append({k: record.get(k) for k in ("pid", "user", "command", "uuid", "process_bytes",
                                                      "real_bytes", "unix", "why", "preload", "for")})
    return found


def over_cap_since(used, limit, changed_unix):
    """When the slice holds more than a cap lowered since: the time of that
    change (the memory was held before it); None otherwise."""
    return changed_unix if limit and used > limit else None


def _live_used(snap):
    """``{device index: bytes in use}`` of a snapshot: a dead process's memory
    still in the counter (its slot not yet reclaimed) left out."""
    stale = {}
    for s in snap.stale_slots:
        for d, used in s.memory_used.items():
            stale[d] = stale.get(d, 0) + used
    return {d.index: max(0, d.memory_used - stale.get(d.index, 0)) for d in snap.devices}


def gpu_use(path):
    """``{GPU UUID: bytes the slice at *path* has in use there}``: the memory
    figures of :func:`slice_status` alone (no registry, no guard), for a view
    of many slices at once. Raises what :func:`slice_status` raises."""
    snap = read_snapshot(path)
    used = _live_used(snap)
    return {d.uuid: used[d.index] for d in snap.devices}


def slice_status(path, warning=WARNING_FRACTION, critical=CRITICAL_FRACTION):
    """The slice at *path* now, as a dict (see the module docstring); memory
    levels by the fractions of the cap *warning* and *critical*.

    Raises the slice-file errors of :mod:`.file` (missing, corrupt,
    unsupported version) unchanged: callers turn them into advice.
    """
    snap = read_snapshot(path)
    live_used = _live_used(snap)

    parked_by_device = {}
    for s in snap.slots:
        for d, parked in (s.parked or {}).items():
            parked_by_device[d] = parked_by_device.get(d, 0) + parked

    report, guard_error = _read_guard(os.path.dirname(os.path.abspath(snap.path)))
    guard = guard_entry(report, guard_error)
    guard["parked"] = _guard_parked(report, (snap.name, slice_name(snap.path)))
    seen = _guard_gpus(report, (snap.name, slice_name(snap.path))) if guard["running"] else {}
    errors = report.get("errors") if guard["running"] else None
    errors = errors if isinstance(errors, list) else []

    gpus = []
    for d in snap.devices:
        used = live_used[d.index]
        limit = d.limit.memory_limit
        cap = min(limit, d.memory_total) if limit and d.memory_total else (limit or d.memory_total)
        gpus.append({
            "index": d.index,
            "uuid": d.uuid,
            "memory_total": d.memory_total,
            "memory_used": used,
            "memory_parked": parked_by_device.get(d.index, 0),
            "memory_peak": d.memory_peak,
            "memory_limit": limit,
            # What the slice keeps whatever others need (the limit when none is set).
            "memory_guarantee": d.limit.guarantee,
            "memory_level": memory_level(used, cap if limit else 0, warning, critical),
            "over_cap_since": over_cap_since(used, limit, snap.limits_changed_unix_ns / 1e9),
            "sm_count": d.sm_count,
            "sm_share": d.limit.sm_share,
            "sm_util": d.sm_util,
            "mode": d.limit.mode,
            "limit_is_fallback": d.limit_is_fallback,
            "decoders": d.decoders,
            "max_decoders": d.limit.max_decoders,
            **_guard_fields(d.uuid, guard["running"], seen, errors),
        })

    known = {d.uuid for d in snap.devices}
    for uuid in sorted(seen or {}):
        fields = _guard_fields(uuid, guard["running"], seen, errors)
        if uuid not in known and fields["memory_real"]:
            guard["elsewhere"].append({"uuid": uuid, **fields})

    registered = {k.kernel_id: k for k in registry.kernels(snap.path)}
    uuid_of = {d.index: d.uuid for d in snap.devices}
    kernels, others = {}, []
    for s in snap.slots:
        proc = {
            "pid": s.pid,
            "comm": s.comm,
            "uid": s.uid,
            "memory_used": {uuid_of[d]: v for d, v in s.memory_used.items()},
            "sm_util": {uuid_of[d]: v for d, v in s.sm_util.items()},
            "active_unix": s.active_unix_ns / 1e9,
            "decoders": {uuid_of[d]: v for d, v in (s.decoders or {}).items() if v},
            "frames_decoded": s.frames_decoded,
            "frames_mapped": s.frames_mapped,
            "decode_ms": round(s.decode_ns / 1e6, 3),
            "parked": {uuid_of[d]: v for d, v in (s.parked or {}).items() if v},
            # Part of memory_used: what the driver took by itself (the true-up).
            "memory_driver": {uuid_of[d]: v for d, v in (s.driver_bytes or {}).items() if v},
            "park_state": PARK_STATES.get(s.park_stage(), "running"),
            "park_wait": PARK_WAITS.get(s.park_wait) if s.park_wanted else None,
            # Why it was parked: idle, asked, room, guard; None while not parked.
            "park_reason": (PARK_REASONS.get(s.park_reason)
                            if s.park_stage() != HAMI_PARK_RUNNING else None),
            # A wait for the memory broker to make room on the GPU, or None.
            "room_wait": ({"uuid": uuid_of.get(s.room_wait_device), "bytes": s.room_wait_bytes,
                           "since_unix": s.room_wait_since_unix_ns / 1e9}
                          if s.room_wait_since_unix_ns else None),
            "gpu_active_unix": s.gpu_active_unix_ns / 1e9,
        }
        if not s.kernel_id:
            others.append(proc)
            continue
        k = kernels.get(s.kernel_id)
        if k is None:
            entry = registered.get(s.kernel_id)
            k = kernels[s.kernel_id] = {
                "kernel_id": s.kernel_id,
                "notebook": (entry.notebook or None) if entry else None,
                "user": entry.user if entry else None,
                "kernelspec": entry.kernelspec if entry else None,
                "pid": entry.pid if entry else None,
                "processes": [],
            }
        k["processes"].append(proc)
    for kernel_id, entry in registered.items():
        # A kernel that has not touched the GPU yet has no slot: still show it.
        if kernel_id not in kernels:
            kernels[kernel_id] = {"kernel_id": kernel_id, "notebook": entry.notebook or None,
                                  "user": entry.user, "kernelspec": entry.kernelspec,
                                  "pid": entry.pid, "processes": []}
    for k in kernels.values():
        k["memory_used"] = sum(sum(p["memory_used"].values()) for p in k["processes"])
        k["sm_util"] = sum(sum(p["sm_util"].values()) for p in k["processes"])
        k["decoders"] = sum(sum(p["decoders"].values()) for p in k["processes"])
        k["frames_decoded"] = sum(p["frames_decoded"] for p in k["processes"])
        k["memory_parked"] = sum(sum(p["parked"].values()) for p in k["processes"])
        k["park_state"] = max((p["park_state"] for p in k["processes"]), key=_PARK_ORDER.index,
                              default="running")
        waits = [p["park_wait"] for p in k["processes"] if p["park_wait"]]
        k["park_wait"] = waits[0] if waits else None
        reasons = [p["park_reason"] for p in k["processes"] if p["park_reason"]]
        k["park_reason"] = reasons[0] if reasons else None
        room = [p["room_wait"] for p in k["processes"] if p["room_wait"]]
        k["room_wait"] = min(room, key=lambda w: w["since_unix"]) if room else None

    return {
        "slice": snap.name,
        "path": os.path.abspath(snap.path),
        "read_unix": time.time(),
        "limits_generation": snap.limits_generation,
        "limits_changed_unix": snap.limits_changed_unix_ns / 1e9,
        "default_limit": snap.fallback_limit.as_dict(),
        "warning_fraction": warning,
        "critical_fraction": critical,
        "gpus": gpus,
        "kernels": list(kernels.values()),
        "other_processes": others,
        "dead_processes": len(snap.stale_slots),
        "guard": guard,
    }


def kernel_name(kernel):
    """What people call a kernel (an entry of ``kernels``): its notebook's path
    (its Jupyter session's, as JupyterLab names it), else its id."""
    return kernel.get("notebook") or kernel["kernel_id"]


def _bar(fraction, width=20):
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    return "[" + "#" * full + "." * (width - full) + "]"


def _memory_line(used, limit, total):
    if limit:
        pct = 100.0 * used / limit
        return f"{_bar(used / limit)} {format_size(used)} / {format_size(limit)} ({pct:.0f} %)"
    if total:
        return f"{format_size(used)} used, no cap ({format_size(total)} on the GPU)"
    return f"{format_size(used)} used, no cap"


def guarantee_text(limit, guarantee):
    """"guaranteed 2.0 GiB of the 8.0 GiB cap" for a memory cap *limit* and the
    guarantee in force *guarantee* (bytes; a ``gpus`` entry's
    ``memory_limit`` and ``memory_guarantee``); None when the guarantee is
    the cap (none set), as it is without oversubscription, or unknown (None:
    a reading from before slice file 1.7)."""
    limit = limit or 0
    if guarantee is None or guarantee == limit:
        return None
    if not limit:
        return f"guaranteed {format_size(guarantee)}, no cap"
    return f"guaranteed {format_size(guarantee)} of the {format_size(limit)} cap"


def default_guarantee_text(status):
    """:func:`guarantee_text` of the slice's default entry (every GPU without its own)."""
    d = status["default_limit"]
    return guarantee_text(d["memory_limit"],
                          effective_guarantee(d["memory_limit"], d.get("memory_guarantee", 0)))


# What a user can do at a full cap, after the level's line.
RELEASE_WORDS = "free tensors you no longer need; `%hami release` returns framework caches"

LENT_WORDS = ("the rest is lent: while the GPU is short, the memory broker may park this "
              "slice's idle kernels above the guarantee (never a running cell)")


def _sm_line(gpu):
    share = f"share {gpu['sm_share']} % ({gpu['mode']})" if gpu["sm_share"] else "no SM limit"
    return f"SM {gpu['sm_util']} % now, {share}"


def real_differs(real, reported):
    """Whether the guard's *real* bytes differ from the *reported* ones by more
    than REAL_SLACK_BYTES + REAL_SLACK_FRACTION of them (False without *real*)."""
    if real is None:
        return False
    return abs(real - reported) > REAL_SLACK_BYTES + REAL_SLACK_FRACTION * reported


def real_text(gpu):
    """"real 1.1 GiB (guard)" when the guard's figure of *gpu* (a ``gpus`` entry)
    differs from the reported ``memory_used`` (see :func:`real_differs`), else ""."""
    real = gpu.get("memory_real")
    if not real_differs(real, gpu["memory_used"]):
        return ""
    return f"real {format_size(real)} (guard)"


def guard_over_text(gpu, status=None):
    """The line for a GPU (a ``gpus`` entry) the guard sees over its cap, with the
    guard's action from *status* when given; None when it is not over."""
    if gpu.get("guard_state") != "over" or gpu.get("memory_real") is None:
        return None
    limit = gpu.get("guard_limit")
    reported = gpu.get("guard_reported")
    text = guard_report.over_text({
        "state": "over", "real_bytes": gpu["memory_real"],
        "limit_bytes": gpu.get("memory_limit", 0) if limit is None else limit,
        "reported_bytes": gpu.get("memory_used", 0) if reported is None else reported}, format_size)
    action = ((status or {}).get("guard") or {}).get("action")
    return f"{text}; the guard's action: {action}" if action else text


def over_cap_text(gpu):
    """"over its new cap since 14:02, held before the change" for a GPU whose
    slice holds more than a lowered cap, else None. What that means for new
    allocations is the level's line (:func:`level_words`), said once."""
    since = gpu.get("over_cap_since")
    if since is None:
        return None
    return (f"over its new {format_size(gpu['memory_limit'])} cap since "
            f"{time.strftime('%H:%M', time.localtime(since))}, held before the change: nothing "
            "it holds is taken")


def guard_parked_text(record, now=None):
    """One line for a process of the slice the guard parked."""
    now = time.time() if now is None else now
    ago = max(0, int(now - (record.get("unix") or now)))
    held = format_size(record.get("process_bytes") or 0)
    safe = "its memory is safe in host memory and it waits until an administrator"
    if record.get("for") == "room":  # the memory broker's, its slot refusing a park
        return (f"pid {record['pid']} ({record.get('command') or '?'}) held off the GPU {ago // 60} min ago "
                f"to make room for another user's work (its slot refused a park); {safe} resumes or ends it")
    # What is true of it: without the library, or under it and charged less than it held.
    how = ("under the preload library, more than the library had charged it (the slice's counters were "
           "changed, or it took memory past what the library let through)" if record.get("preload")
           else "outside the preload library")
    return (f"pid {record['pid']} ({record.get('command') or '?'}) parked by the guard "
            f"{ago // 60} min ago: it held {held} past the slice's cap, {how}; {safe} resumes it "
            "(after raising the cap) or ends it")


def level_words(level, status, gpu=None):
    """What a memory level means, true in each state, with the thresholds *status*
    was read with; with *gpu* (a ``gpus`` entry) the figures of that GPU:

    - warning: "84 % of the memory cap is in use (a warning from 80 %)";
    - critical within the cap: "97 % of the memory cap is in use: 30.0 MiB left,
      a larger allocation is refused";
    - critical over the cap (a cap lowered below what the slice holds):
      "117 % of the memory cap is in use: over the cap, so new allocations are
      refused until use falls below it". Never "will fail soon" beside a
      refusal that already happens (issue 35, item 4).
    """
    used, limit = (gpu or {}).get("memory_used"), (gpu or {}).get("memory_limit")
    if not limit or used is None:
        share = status["warning_fraction"] if level == "warning" else status["critical_fraction"]
        return f"over {share * 100:.0f} % of the memory cap is in use"
    share = f"{100 * used / limit:.0f} % of the memory cap is in use"
    if level == "warning":
        return f"{share} (a warning from {status['warning_fraction'] * 100:.0f} %)"
    if used > limit:
        return f"{share}: over the cap, so new allocations are refused until use falls below it"
    return f"{share}: {format_size(limit - used)} left, a larger allocation is refused"


def parking_text(kernel):
    """", parked to make room for another user's work: 8.0 GiB in host memory"
    (why, when known, and what a resume waits for), a wait for room on the GPU
    (:func:`room_wait_text`), or "" on the GPU. Takes a kernel's or a process's
    entry."""
    state = kernel.get("park_state", "running")
    text = ""
    if state != "running":
        why = PARK_REASON_WORDS.get(kernel.get("park_reason")) if state == "parked" else None
        text = (f", {state}{' ' + why if why else ''}: "
                f"{format_size(kernel.get('memory_parked', sum((kernel.get('parked') or {}).values())))}"
                " in host memory")
        if kernel.get("park_wait"):
            text += f", resume waits for {kernel['park_wait']}"
    room = room_wait_text(kernel.get("room_wait"))
    if room:
        text += f", {room}"
    return text


def room_wait_text(room):
    """"waiting for 8.0 GiB of GPU room since 14:02" for a ``room_wait`` entry
    (a process's or a kernel's: the memory broker is making room on a full
    GPU), else None."""
    if not room:
        return None
    since = room.get("since_unix")
    when = f" since {time.strftime('%H:%M', time.localtime(since))}" if since else ""
    return f"waiting for {format_size(room.get('bytes') or 0)} of GPU room{when}"


def _video(p):
    """", NVDEC 2 decoders, 120 frames (118 mapped, 35.2 ms)" or "" without video work."""
    n = sum(p["decoders"].values())
    if not n and not p["frames_decoded"]:
        return ""
    return (f", NVDEC {n} decoder(s), {p['frames_decoded']} frames "
            f"({p['frames_mapped']} mapped, {p['decode_ms']:.1f} ms)")


def _driver(p):
    """" (96.0 MiB the driver's own)" when the true-up charged the process for
    memory the driver took by itself, else ""."""
    n = sum((p.get("memory_driver") or {}).values())
    return f" ({format_size(n)} the driver's own)" if n else ""


def format_text(status):
    """Plain-text rendering for terminals and logs."""
    lines = [f"hami slice {status['slice']!r}  ({status['path']})"]
    if not status["gpus"]:
        d = status["default_limit"]
        cap = format_size(d["memory_limit"]) if d["memory_limit"] else "no memory cap"
        sm = f"SM share {d['sm_share']} % ({d['mode']})" if d["sm_share"] else "no SM limit"
        guaranteed = default_guarantee_text(status)
        lines.append(f"  no GPU used in this slice yet; each GPU gets: {cap}"
                     f"{' (' + guaranteed + ')' if guaranteed else ''}, {sm}")
    for g in status["gpus"]:
        lines.append(f"  GPU {g['index']} {g['uuid']}")
        real = real_text(g)
        lines.append(f"    memory {_memory_line(g['memory_used'], g['memory_limit'], g['memory_total'])}"
                     + (f", {real}" if real else ""))
        guaranteed = guarantee_text(g["memory_limit"], g.get("memory_guarantee"))
        if guaranteed:
            lines.append(f"    {guaranteed}: {LENT_WORDS}")
        if g.get("memory_parked"):
            lines.append(f"    parked {format_size(g['memory_parked'])} in host memory (not on the GPU, "
                         "back when its kernel runs again)")
        lines.append(f"    {_sm_line(g)}")
        if g["decoders"] or g["max_decoders"]:
            cap = f" of {g['max_decoders']}" if g["max_decoders"] else ""
            lines.append(f"    NVDEC {g['decoders']}{cap} video decoder(s) in use")
        if g["memory_level"] == "warning":
            lines.append(f"    WARNING: {level_words('warning', status, g)}")
        elif g["memory_level"] == "critical":
            lines.append(f"    CRITICAL: {level_words('critical', status, g)} "
                         f"({RELEASE_WORDS})")
        held = over_cap_text(g)
        if held:
            lines.append(f"    {held}")
        over = guard_over_text(g, status)
        if over:
            lines.append(f"    OVER CAP: {over}")
    for record in (status.get("guard") or {}).get("parked") or []:
        lines.append(f"  PARKED: {guard_parked_text(record)}")
    for g in (status.get("guard") or {}).get("elsewhere") or []:
        lines.append(f"  GPU {g['uuid']} (no process of this slice runs the library there)")
        lines.append(f"    memory real {format_size(g['memory_real'])} (guard)")
        over = guard_over_text(g, status)
        if over:
            lines.append(f"    OVER CAP: {over}")
    if status["kernels"]:
        lines.append("  kernels:")
    for k in status["kernels"]:
        who = ", ".join(x for x in (k.get("notebook") and k["kernel_id"], k["user"],
                                    k["kernelspec"]) if x)
        lines.append(f"    {kernel_name(k)}{'  (' + who + ')' if who else ''}: "
                     f"{format_size(k['memory_used'])}, SM {k['sm_util']} %{parking_text(k)}")
        for p in k["processes"]:
            lines.append(f"      pid {p['pid']} {p['comm']}: "
                         f"{format_size(sum(p['memory_used'].values()))}{_driver(p)}, "
                         f"SM {sum(p['sm_util'].values())} %{_video(p)}{parking_text(p)}")
    if status["other_processes"]:
        lines.append("  other processes (not started by a kernel):")
    for p in status["other_processes"]:
        lines.append(f"    pid {p['pid']} {p['comm']}: {format_size(sum(p['memory_used'].values()))}"
                     f"{_driver(p)}, "
                     f"SM {sum(p['sm_util'].values())} %{parking_text(p)}")
    if status["dead_processes"]:
        lines.append(f"  {status['dead_processes']} dead process(es) not reclaimed yet "
                     "(their memory is not counted above)")
    return "\n".join(lines)
