"""The slices of a Jupyter server's kernels, as the JSON its REST API answers.

Plain functions of the server's kernel manager, so they can be tested without
a server. A kernel is in a slice when the HAMi provisioner started it; the
slice's state comes from :func:`hami_jupyter.slice.status.slice_status`, the
same reading ``%hami status`` shows, summed up for a status bar, with memory
levels by the server's configured thresholds (:class:`.config.SliceDisplay`),
and the guard's figures beside the slice's own (``memory_real``,
``guard_state`` and ``guard`` of the slice; per GPU in ``gpus``).
The top-level memory figures are those of the slice's *fullest* GPU (named by
``memory_gpu``), never sums: a cap holds per GPU, so 3.5 GiB on one GPU of a
slice with two 4 GiB GPUs is 3.5 of 4 GiB, the next 1 GiB refused, not 3.5 of
8 GiB.
The answer of ``hami/v1/slices`` also says where the server runs (``node``),
that host's GPUs (``host_gpus``) and how idle each kernel is
(``kernel_activity``), from :mod:`.host`: what the hub service needs to place
this server's slices among the hub's nodes and GPUs.
Each kernel answer carries the whole GPU beside the slice's own figures
(``whole_gpus``, ``whole_gpus_error``: :mod:`.whole_gpu`).
Every kernel record carries ``notebook``, the path of the notebook it serves:
this server's kernels by their Jupyter sessions (:mod:`.sessions`), others
as their registry entries claim.
A slice file that cannot be read is one line of advice
(:mod:`hami_jupyter.advice`), never an error of the whole answer: the other
slices and kernels still show.
"""

import os
import time

from ..advice import advice
from ..provisioning.provisioner import HamiProvisioner
from ..slice.file import SliceFileError
from ..slice.limits import effective_guarantee
from ..slice.paths import SliceNameError, slice_name, slice_path
from ..slice.status import CRITICAL_FRACTION, WARNING_FRACTION, slice_status
from . import host
from .whole_gpu import whole_gpus

NOT_HAMI = ("the kernel was not started by the HAMi provisioner (its kernelspec does not "
            "use hami-provisioner), so no GPU slice limits it")
NOT_LAUNCHED = "the kernel has not been launched in its slice yet"

_LEVELS = ("ok", "warning", "critical")


class UnknownKernel(KeyError):
    """No kernel of this server has the id."""


def _provisioner(kernel_manager, kernel_id):
    """The provisioner of kernel *kernel_id*; :class:`UnknownKernel` if there is none."""
    # Asked first: jupyter_server's get_kernel answers an unknown id with its own 404.
    if kernel_id not in kernel_manager:
        raise UnknownKernel(kernel_id)
    return getattr(kernel_manager.get_kernel(kernel_id), "provisioner", None)


def kernel_slice_path(kernel_manager, kernel_id):
    """The slice file of kernel *kernel_id*; None when it is not in a slice."""
    provisioner = _provisioner(kernel_manager, kernel_id)
    return provisioner.slice_path if isinstance(provisioner, HamiProvisioner) else None


def server_slice_path():
    """The server's own slice ($HAMI_SLICE, a name or a path) if set and present."""
    ref = os.environ.get("HAMI_SLICE")
    if not ref:
        return None
    try:
        path = slice_path(ref)
    except SliceNameError:
        return None
    return path if path.is_file() else None


def server_slices(kernel_manager):
    """``({kernel_id: slice path or None}, [every slice path once, in order])``.

    The slices are those of the server's running kernels, then the server's own.
    """
    by_kernel = {k: kernel_slice_path(kernel_manager, k) for k in kernel_manager.list_kernel_ids()}
    paths = [p for p in by_kernel.values() if p is not None]
    own = server_slice_path()
    if own is not None:
        paths.append(own)
    unique = {}
    for p in paths:
        unique.setdefault(os.path.abspath(p), p)
    return by_kernel, list(unique.values())


def read_slice(path, server_kernels, fractions=(WARNING_FRACTION, CRITICAL_FRACTION),
               notebooks=None):
    """``slice_status`` of *path* (memory levels by *fractions*: warning,
    critical) with each kernel flagged ``this_server``, or the ``{"slice",
    "path", "error"}`` advice when the file cannot be read. *notebooks*
    (``{kernel_id: path}``, :func:`.sessions.kernel_notebooks`) names this
    server's kernels by their sessions, which this server knows first hand;
    other kernels keep the name their registry entry gives."""
    try:
        status = slice_status(path, *fractions)
    except (OSError, SliceFileError) as e:
        return {"slice": slice_name(path), "path": os.path.abspath(path),
                "error": f"hami: {advice(e, path)}"}
    for k in status["kernels"]:
        k["this_server"] = k["kernel_id"] in server_kernels
        if k["this_server"] and (notebooks or {}).get(k["kernel_id"]):
            k["notebook"] = notebooks[k["kernel_id"]]
    return status


def slices_body(kernel_manager, fractions=(WARNING_FRACTION, CRITICAL_FRACTION), notebooks=None):
    """The body of ``GET hami/v1/slices``; *notebooks* as :func:`read_slice`'s."""
    by_kernel, paths = server_slices(kernel_manager)
    gpus, gpu_message = host.host_gpus()
    return {
        "slices": [read_slice(p, set(by_kernel), fractions, notebooks) for p in paths],
        "kernels": {k: (slice_name(p) if p is not None else None) for k, p in by_kernel.items()},
        # Each kernel's notebook (its session's path); None for a kernel without a session.
        "notebooks": {k: (notebooks or {}).get(k) for k in by_kernel},
        "node": host.node_name(),
        "read_unix": time.time(),
        "host_gpus": gpus,
        "host_gpus_error": gpu_message,
        "kernel_activity": host.kernel_activity(kernel_manager),
    }


def _fill(gpu):
    """How full *gpu* is, for :func:`fullest_gpu`: ``(1, used / cap)`` with a cap
    (the cap no more than the GPU has, as its memory level counts it), ``(0,
    used)`` without one: any capped GPU comes before every uncapped one."""
    limit, total = gpu["memory_limit"], gpu.get("memory_total") or 0
    if not limit:
        return (0, gpu["memory_used"])
    cap = min(limit, total) if total else limit
    return (1, gpu["memory_used"] / cap)


def fullest_gpu(gpus):
    """The GPU of *gpus* nearest its cap (the first of equals); None for none.

    That GPU refuses an allocation first, so it is what a status bar shows:
    a sum over GPUs would hide a full one behind an empty one."""
    best = None
    for gpu in gpus:
        if best is None or _fill(gpu) > _fill(best):
            best = gpu
    return best


def _guard_summary(status, gpu):
    """``(memory_real, guard_state)`` of the slice: the guard's bytes on *gpu*
    (the fullest; None when it does not know them) and "over" when it sees any
    GPU over its cap, "ok" when none, None when no guard is running."""
    guard = status.get("guard") or {}
    if not guard.get("running"):
        return None, None
    over = any(g.get("guard_state") == "over" for g in status["gpus"])
    return (gpu or {}).get("memory_real"), "over" if over else "ok"


def summary(status, kernel_id):
    """The status bar's view of one kernel in its slice (the fields after ``path``):
    memory of the fullest GPU (:func:`fullest_gpu`), every GPU in ``gpus``."""
    gpus = status["gpus"]
    mine = next((k for k in status["kernels"] if k["kernel_id"] == kernel_id), None)
    fullest = fullest_gpu(gpus)
    memory_real, guard_state = _guard_summary(status, fullest)
    return {
        # The fullest GPU's figures; before any GPU, the default cap every GPU gets.
        "memory_used": fullest["memory_used"] if fullest else 0,
        "memory_limit": (fullest["memory_limit"] if fullest
                         else status["default_limit"]["memory_limit"]),
        "memory_gpu": fullest["index"] if fullest else None,
        # That GPU's guarantee in force (the limit when none is set).
        "memory_guarantee": (fullest["memory_guarantee"] if fullest
                             else effective_guarantee(status["default_limit"]["memory_limit"],
                                                      status["default_limit"].get("memory_guarantee", 0))),
        "memory_level": max((g["memory_level"] for g in gpus), key=_LEVELS.index, default="ok"),
        "sm_share": (max(g["sm_share"] for g in gpus) if gpus
                     else status["default_limit"]["sm_share"]),
        "sm_util": max((g["sm_util"] for g in gpus), default=0),
        "kernel": {
            "memory_used": mine["memory_used"] if mine else 0,
            "sm_util": mine["sm_util"] if mine else 0,
            "processes": mine["processes"] if mine else [],
            "memory_parked": mine["memory_parked"] if mine else 0,
            "park_state": mine["park_state"] if mine else "running",
            "park_wait": mine["park_wait"] if mine else None,
            "park_reason": mine["park_reason"] if mine else None,
            "room_wait": mine["room_wait"] if mine else None,
        },
        "gpus": gpus,
        "kernels": status["kernels"],
        "warning_fraction": status["warning_fraction"],
        "critical_fraction": status["critical_fraction"],
        "memory_real": memory_real,
        "guard_state": guard_state,
        "guard": status.get("guard"),
    }


def kernel_body(kernel_manager, kernel_id, fractions=(WARNING_FRACTION, CRITICAL_FRACTION),
                notebooks=None):
    """The body of ``GET hami/v1/kernels/<kernel_id>``; raises :class:`UnknownKernel`.
    *notebooks* as :func:`read_slice`'s; the kernel's own is ``notebook``."""
    provisioner = _provisioner(kernel_manager, kernel_id)
    path = provisioner.slice_path if isinstance(provisioner, HamiProvisioner) else None
    notebook = (notebooks or {}).get(kernel_id)
    if path is None:
        reason = NOT_LAUNCHED if isinstance(provisioner, HamiProvisioner) else NOT_HAMI
        return {"kernel_id": kernel_id, "notebook": notebook, "in_slice": False, "reason": reason}
    status = read_slice(path, set(kernel_manager.list_kernel_ids()), fractions, notebooks)
    body = {"kernel_id": kernel_id, "notebook": notebook, "in_slice": True,
            "slice": status["slice"], "path": status["path"]}
    if "error" in status:
        body["error"] = status["error"]
    else:
        body.update(summary(status, kernel_id))
        body["whole_gpus"], body["whole_gpus_error"] = whole_gpus(status)
    return body
