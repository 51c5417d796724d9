"""The whole GPU beside a kernel's slice: what a user sharing it wants to know.

A slice's own figures say nothing of whether the GPU is busy: someone else's
training run can hold it at 100 % and 70 GiB while this slice is idle. So
each kernel answer carries, for every GPU of its slice, the GPU as NVML sees
it (what nvdashboard shows): its utilization, its memory in use by every
process, its power draw against its limit and its temperature
(:func:`hami_jupyter.gpus.read_gpus` through :mod:`.host`: physical figures,
cached a few seconds), and who holds that memory:

- ``slice_used``: this slice's bytes there (what it counts);
- ``slices``: each *other* slice of the same slice folder that this server's
  user may read, by name and bytes. Other users' slice files are theirs
  (0600, or 0640 to the administrators' group under the hub), so a user sees
  only their own, an administrator everyone's;
- ``others_used``: the rest NVML sees, one total: other users' slices this
  user may not read, processes outside any slice, the driver's own.

Nothing here decides anything: the figures are for people to read.
"""

import os

from ..slice.file import SliceFileError
from ..slice.paths import list_slice_paths, slice_name
from ..slice.status import gpu_use
from . import host


def _other_slices(path):
    """``{uuid: [{"slice", "memory_used"}, ...]}`` of the slices beside *path*
    (the same folder) that this process may read, *path*'s own left out."""
    own = os.path.abspath(path)
    found = {}
    for other in list_slice_paths(os.path.dirname(own), skipped=[]):
        if os.path.abspath(other) == own:
            continue
        try:
            use = gpu_use(other)
        except (OSError, SliceFileError):
            continue  # another user's: counted in others_used
        for uuid, used in use.items():
            found.setdefault(uuid, []).append({"slice": slice_name(other), "memory_used": used})
    return found


def whole_gpus(status, gpus=None):
    """``(entries, message)`` for the GPUs of *status* (a ``read_slice`` answer
    with ``gpus``): one entry per GPU of the slice that NVML knows, in the
    slice's order, and why there are none (NVML cannot say) or None. *gpus*:
    ``host.host_gpus()``'s answer (read now by default)."""
    if "error" in status or not status.get("gpus"):
        return [], None
    facts, message = host.host_gpus() if gpus is None else gpus
    by_uuid = {g["uuid"]: g for g in facts}
    others = _other_slices(status["path"]) if by_uuid else {}
    entries = []
    for g in status["gpus"]:
        fact = by_uuid.get(g["uuid"])
        if fact is None:
            continue
        listed = sorted(others.get(g["uuid"], []), key=lambda s: (-s["memory_used"], s["slice"]))
        total_used = fact.get("memory_used")
        known = g["memory_used"] + sum(s["memory_used"] for s in listed)
        entries.append({
            "index": g["index"], "uuid": g["uuid"], "name": fact.get("name") or "",
            "memory_total": fact.get("memory_total") or g.get("memory_total") or 0,
            "memory_used": total_used,
            "utilization": fact.get("utilization"),
            "power_w": fact.get("power_w"),
            "power_limit_w": fact.get("power_limit_w"),
            "temperature_c": fact.get("temperature_c"),
            "slice_used": g["memory_used"],
            "slices": listed,
            "others_used": None if total_used is None else max(0, total_used - known),
        })
    if not entries and message is None and facts:
        message = "NVML does not list this slice's GPUs"
    return entries, message if not entries else None
