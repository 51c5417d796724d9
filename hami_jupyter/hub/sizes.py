"""Slice sizes, as a policy names and writes them: ``{"memory": "4g", "sm": 25}``.

A size is the limits it gives every GPU (:class:`~hami_jupyter.slice.limits.Limits`),
optionally which GPUs (``gpus``) and limits of their own for some of them
(``per_gpu``), and how the spawn form shows it. Every value is checked with
the grammar every other reader shares, so a typo stops the hub at start-up
with a message naming the size.

``guarantee`` (a size, per GPU like ``memory``; also in ``per_gpu``) is what
the slice keeps on a GPU whatever others need; the memory cap may reach above
it, and what lies between is lent (the memory broker takes it back by
parking the slice's idle kernels). Unset: the cap is the guarantee, as before
guarantees existed. A guarantee above the size's memory is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..slice.layout import HAMI_SLICE_MAX_DEVICES
from ..slice.limits import (
    LimitError,
    Limits,
    check_guarantee,
    parse_memory_guarantee,
    parse_memory_limit,
    parse_mode,
    parse_sm_share,
)

_SPEC_KEYS = {"memory", "guarantee", "sm", "mode", "gpus", "per_gpu", "display_name", "description"}
_PER_GPU_KEYS = {"memory", "guarantee", "sm"}


class PolicyError(ValueError):
    """The policy in jupyterhub_config.py cannot be applied; the message says where."""


@dataclass(frozen=True)
class SliceSize:
    """One slice size: its limits on every GPU, and which GPUs.

    *gpus* are host GPU indices (NVML order) or UUIDs; None means every GPU.
    *per_gpu* (same keys as *gpus*) holds the whole limits of single GPUs
    that have some of their own. The guarantee is in the limits
    (``memory_guarantee``; 0: the cap).
    """

    name: str
    limits: Limits = Limits()
    gpus: tuple | None = None
    per_gpu: dict = field(default_factory=dict)
    display_name: str = ""
    description: str = ""

    def describe(self, guarantee=True):
        """``memory 4.0 GiB, SM 25 % (hard), GPU 0, 1``; ``memory 8.0 GiB (2.0
        GiB guaranteed), ...`` with a guarantee below the cap (unless
        *guarantee* is False: where none applies)."""
        limits = self.limits if guarantee else self.limits.replace(memory_guarantee=0)
        text = limits.describe()
        if self.gpus is not None:
            text += ", GPU " + ", ".join(str(g) for g in self.gpus)
        return text

    @property
    def lends(self):
        """Whether a cap of this size reaches above its guarantee on some GPU."""
        return self.limits.lends or any(own.lends for own in self.per_gpu.values())

    def limits_for(self, gpu_index, gpu_uuid=None):
        """The :class:`Limits` of one host GPU (its own entry, else the size's)."""
        own = self.per_gpu.get(gpu_index) or (self.per_gpu.get(gpu_uuid) if gpu_uuid else None)
        return own if own is not None else self.limits

    def environment(self):
        """What the single-user server's environment says of this size (the
        provisioner's third source; a hub-made limits file overrides it)."""
        limits = self.limits
        env = {"HAMI_SM_MODE": limits.mode, "HAMI_SLICE_SIZE": self.name}
        if limits.memory_limit:
            env["HAMI_MEMORY_LIMIT"] = str(limits.memory_limit)
        if limits.sm_share:
            env["HAMI_SM_LIMIT"] = str(limits.sm_share)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return env


def _gpu_key(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PolicyError(f"{where}: GPU {value!r} is neither an index nor a UUID")
    if isinstance(value, int) and not 0 <= value < HAMI_SLICE_MAX_DEVICES:
        raise PolicyError(f"{where}: GPU index {value} is out of range "
                          f"0..{HAMI_SLICE_MAX_DEVICES - 1}")
    if isinstance(value, str) and not value.startswith(("GPU-", "MIG-")):
        raise PolicyError(f"{where}: GPU {value!r} is not a UUID (GPU-...); use an index or a UUID")
    return value


def _check_guarantee(limits, where):
    """*limits*, unless its guarantee is above its memory cap: PolicyError naming *where*."""
    try:
        check_guarantee(limits.memory_limit, limits.memory_guarantee)
    except LimitError as e:
        raise PolicyError(f"{where}: {e}") from None
    return limits


def parse_size_spec(name, spec):
    """A :class:`SliceSize` from its dict form; PolicyError naming the problem."""
    where = f"slice size {name!r}"
    if not isinstance(spec, dict):
        raise PolicyError(f"{where}: expected a dict such as {{'memory': '4g', 'sm': 25}}, "
                          f"not {spec!r}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(_SPEC_KEYS))}")
    try:
        memory = parse_memory_limit(spec.get("memory"), f"{where} memory")
        guarantee = parse_memory_guarantee(spec.get("guarantee"), f"{where} guarantee")
        sm = parse_sm_share(spec.get("sm"), f"{where} sm")
        mode = parse_mode(spec.get("mode"), f"{where} mode") or "hard"
        limits = Limits(memory or 0, sm or 0, mode, memory_guarantee=guarantee or 0)
        _check_guarantee(limits, where)
        per_gpu = {}
        for key, own in (spec.get("per_gpu") or {}).items():
            gwhere = f"{where} per_gpu[{key!r}]"
            if not isinstance(own, dict) or set(own) - _PER_GPU_KEYS:
                raise PolicyError(f"{gwhere}: expected {{'memory': ..., 'guarantee': ..., "
                                  f"'sm': ...}}, not {own!r}")
            own_memory = parse_memory_limit(own.get("memory"), f"{gwhere} memory")
            own_guarantee = parse_memory_guarantee(own.get("guarantee"), f"{gwhere} guarantee")
            own_sm = parse_sm_share(own.get("sm"), f"{gwhere} sm")
            per_gpu[_gpu_key(key, gwhere)] = _check_guarantee(limits.replace(
                **({"memory_limit": own_memory} if own_memory is not None else {}),
                **({"memory_guarantee": own_guarantee} if own_guarantee is not None else {}),
                **({"sm_share": own_sm or 0} if own.get("sm") is not None else {})), gwhere)
    except LimitError as e:
        raise PolicyError(str(e)) from None
    gpus = spec.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, (list, tuple)) or not gpus:
            raise PolicyError(f"{where}: gpus must be a non-empty list of GPU indices or UUIDs")
        gpus = tuple(_gpu_key(g, f"{where} gpus") for g in gpus)
    return SliceSize(name=name, limits=limits, gpus=gpus, per_gpu=per_gpu,
                     display_name=str(spec.get("display_name") or ""),
                     description=str(spec.get("description") or ""))
