"""The hub's slice: the one slice every kernel of a hub-started server runs in.

JupyterHub's spawner (:mod:`hami_jupyter.hub.spawner`) gives a user's
server a slice with a root-owned limits file, and marks the server's
environment with ``HAMI_HUB_SLICE=<path>``. That marker, and nothing a user
can set for one kernel, decides that the server is hub-managed. Then:

- every kernel of the server runs in that slice, whatever its kernelspec
  says: the server extension routes every kernelspec through
  ``hami-provisioner`` (:mod:`.factory`), and the
  provisioner refuses a kernel that names another slice;
- a kernel never gets more than the slice holds: the hub's limits file is the
  authority, and the preload library enforces it whatever the kernel's
  environment asks;
- a kernel may ask for a smaller memory cap (for every GPU): each of its
  processes is then held to it by the preload library
  (``HAMI_PROCESS_MEMORY_LIMIT``), nested inside the slice's cap, which still
  holds for all of them together. Anything else stricter (an SM share, a
  mode, decoders, one GPU's limit) cannot be nested yet: the slice file holds
  those once per slice. Such a kernel is refused rather than started with a
  limit it would not have.

This module holds what the provisioner, the server extension and
``hami-jupyter kernelspec install`` share: where the hub's slice is, whether
a reference names it, and how asked limits compare with the slice's.
"""

import os
from pathlib import Path

from ..slice.paths import SliceNameError, slice_path
from ..slice.size import format_size

VARIABLE = "HAMI_HUB_SLICE"

APPLIES = "the hub's slice applies to every kernel of this server"
NESTED = ("nested caps are not supported yet for this: a kernel may ask for a smaller memory cap "
          "for every GPU (each of its processes is held to it), but an SM share, a mode, decoders "
          "or one GPU's limit are held once per slice")
PROCESS_CAP = "HAMI_PROCESS_MEMORY_LIMIT"


class HubSliceError(ValueError):
    """``HAMI_HUB_SLICE`` is set but is not a slice path; the message says why."""


def hub_slice(environ=None):
    """The hub's slice (an absolute :class:`~pathlib.Path`) when the hub manages
    this server's slice, else None. *environ*: default ``os.environ``."""
    environ = os.environ if environ is None else environ
    value = environ.get(VARIABLE)
    if value is None:
        return None
    if not value.startswith("/"):
        raise HubSliceError(f"{VARIABLE}={value!r} is not an absolute path; the hub sets it to "
                            "the user's slice file, e.g. /run/hami-jupyter/alice.slice")
    try:
        return slice_path(value)
    except SliceNameError as e:
        raise HubSliceError(f"{VARIABLE}: {e}") from None


def same_slice(a, b):
    """Whether the paths *a* and *b* name one slice file."""
    a, b = Path(a).absolute(), Path(b).absolute()
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


def refers_elsewhere(ref, hub, root=None, env=None):
    """Whether the slice reference *ref* (a name or a path) names a slice other
    than *hub*; a reference that is not a slice name or path does."""
    try:
        return not same_slice(slice_path(ref, root=root, env=env), hub)
    except SliceNameError:
        return True


def held_by(snapshot):
    """What a slice file's *snapshot* holds its processes to: ``[(gpu, Limits)]``,
    its default first (gpu ""), then each GPU with limits of its own (its UUID)."""
    return [("", snapshot.fallback_limit)] + [
        (d.uuid, d.limit) for d in snapshot.devices if not d.limit_is_fallback]


def held_by_limits(asked):
    """What :class:`~hami_jupyter.slice.settings.AskedLimits` stand for as held
    limits (the hub's limits as the server's environment carries them)."""
    return [("", asked.limits)]


def describe_held(held):
    return "; ".join(f"GPU {gpu}: {limits.describe()}" if gpu else limits.describe()
                     for gpu, limits in held)


def _cap(value):
    return value if value else float("inf")


def compare(asked, held, fields=None):
    """How the limits *asked* (:class:`~hami_jupyter.slice.settings.AskedLimits`;
    only the fields its ``sources`` name, or *fields*, count as asked) stand
    against the entries *held* (:func:`held_by`): ``(stricter, looser)``, each
    a list of ``(field, asked text, source)``. A value is stricter when it is
    below what the slice holds on some GPU, looser when above it on some GPU
    and stricter on none."""
    fields = set(asked.sources if fields is None else fields)
    limits = asked.limits
    entries = [h for _, h in held]
    stricter, looser = [], []

    def weigh(field, value, held_values, text, source):
        if any(value < _cap(h) for h in held_values):
            stricter.append((field, text, source))
        elif any(value > _cap(h) for h in held_values):
            looser.append((field, text, source))

    source = asked.sources.get
    if "memory_limit" in fields and limits.memory_limit:
        weigh("memory_limit", limits.memory_limit, [h.memory_limit for h in entries],
              f"memory {format_size(limits.memory_limit)}", source("memory_limit", "memory"))
    if "sm_share" in fields:  # 0: no share, which is more than any share
        share = limits.sm_share
        weigh("sm_share", share or float("inf"), [h.sm_share for h in entries],
              f"SM {share} %" if share else "SM unlimited", source("sm_share", "SM share"))
    if "mode" in fields:
        want_elastic = limits.mode == "elastic"
        if not want_elastic and any(h.elastic for h in entries):
            stricter.append(("mode", "SM mode hard", source("mode", "SM mode")))
        elif want_elastic and any(h.sm_share and not h.elastic for h in entries):
            looser.append(("mode", "SM mode elastic", source("mode", "SM mode")))
    if "max_decoders" in fields:  # 0: no cap
        weigh("max_decoders", limits.max_decoders or float("inf"),
              [h.max_decoders for h in entries],
              f"{limits.max_decoders} decoders" if limits.max_decoders else "decoders unlimited",
              source("max_decoders", "decoders"))
    for n, v in sorted(asked.memory_per_gpu.items()):
        weigh("memory_per_gpu", v, [h.memory_limit for h in entries],
              f"GPU {n}: memory {format_size(v)}",
              source(f"CUDA_DEVICE_MEMORY_LIMIT_{n}", f"CUDA_DEVICE_MEMORY_LIMIT_{n}"))
    for n, v in sorted(asked.sm_per_gpu.items()):
        weigh("sm_per_gpu", v % 100 or float("inf"), [h.sm_share for h in entries],
              f"GPU {n}: SM {v} %", source(f"CUDA_DEVICE_SM_LIMIT_{n}", f"CUDA_DEVICE_SM_LIMIT_{n}"))
    return stricter, looser


def nested_memory_cap(stricter, asked):
    """The cap that nests *asked* inside the slice, when the only stricter
    limit it asks for (*stricter*, from :func:`compare`) is a memory cap for
    every GPU: each process of the kernel is held to it. None otherwise."""
    if stricter and all(field == "memory_limit" for field, _, _ in stricter):
        return asked.limits.memory_limit
    return None
