"""A slice's limits, where they come from, and how they are checked.

Limits reach a kernel from several places; the most specific wins, field by
field (memory, SM share, mode independently):

1. the kernelspec's provisioner ``config`` (``memory_limit``, ``sm_limit``,
   ``sm_mode``, ``max_decoders``);
2. ``c.HamiProvisioner.*`` in the Jupyter server's configuration;
3. the single-user server's environment as JupyterHub sets it:
   ``HAMI_MEMORY_LIMIT``, ``HAMI_SM_LIMIT``, ``HAMI_SM_MODE``, ``HAMI_MAX_DECODERS``;
4. HAMi's device-plugin variables, when the server already runs under HAMi
   on Kubernetes: ``CUDA_DEVICE_MEMORY_LIMIT[_<n>]``, ``CUDA_DEVICE_SM_LIMIT[_<n>]``.

(1) and (2) both arrive as the provisioner's traits; the provisioner passes
their values here as one layer. Every value is checked here, before a kernel
starts: a malformed limit is an error naming its source, never "no limit".
The preload library checks again (it reads the same variables), so a process
started by hand is held to the same rules.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .size import ACCEPTED_FORMS, format_size, parse_size

MODES = ("hard", "elastic")
MAX_ORDINALS = 16  # HAMI_SLICE_MAX_DEVICES

_ORDINAL_RE = re.compile(r"(CUDA_DEVICE_MEMORY_LIMIT|CUDA_DEVICE_SM_LIMIT)_([0-9]+)")


class LimitError(ValueError):
    """A limit that cannot be applied; the message names its source and the fix."""


@dataclass(frozen=True)
class SliceLimits:
    """What a slice is held to. ``None`` (or an empty mapping) means no limit.

    *memory* and *sm_share* apply to every GPU; *memory_per_gpu* and
    *sm_per_gpu* (CUDA ordinal -> value, from HAMi's ``_<n>`` variables)
    override them for one GPU. *sources* says where each field came from.
    """

    memory: int | None = None
    sm_share: int | None = None
    mode: str = "hard"
    memory_per_gpu: dict = field(default_factory=dict)
    sm_per_gpu: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    max_decoders: int | None = None  # concurrent NVDEC decoders per GPU

    @property
    def unlimited(self):
        return not (self.memory or self.sm_share or self.memory_per_gpu or self.sm_per_gpu)

    def describe(self):
        """One line for logs and messages: ``memory 4.0 GiB, SM 25 % (hard)``."""
        parts = [f"memory {format_size(self.memory)}" if self.memory else "memory unlimited"]
        parts += [f"GPU {n}: memory {format_size(v)}" for n, v in sorted(self.memory_per_gpu.items())]
        parts.append(f"SM {self.sm_share} % ({self.mode})" if self.sm_share else "SM unlimited")
        parts += [f"GPU {n}: SM {v} %" for n, v in sorted(self.sm_per_gpu.items())]
        return ", ".join(parts)

    def environment(self):
        """The variables that give a process started outside a slice file the
        same limits (the preload library reads them when it creates the file)."""
        env = {"HAMI_SM_MODE": self.mode}
        if self.memory:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = str(self.memory)
        if self.sm_share:
            env["CUDA_DEVICE_SM_LIMIT"] = str(self.sm_share)
        for n, v in self.memory_per_gpu.items():
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{n}"] = str(v)
        for n, v in self.sm_per_gpu.items():
            env[f"CUDA_DEVICE_SM_LIMIT_{n}"] = str(v)
        if self.max_decoders:
            env["HAMI_MAX_DECODERS"] = str(self.max_decoders)
        return env


def parse_memory_limit(value, source):
    """Bytes for a memory limit written as ``4g``, ``4096m``, ``4294967296``...

    ``None`` means "not set here". Zero is refused: it would refuse every
    allocation, so it is surely a mistake (leave the setting out for no limit).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise LimitError(f"{source}: memory limit {value!r} is not a size; expected {ACCEPTED_FORMS}")
    text = str(value).strip()
    try:
        size = parse_size(text)
    except ValueError:
        raise LimitError(f"{source}: memory limit {value!r} is not a size; expected {ACCEPTED_FORMS}") from None
    if size == 0:
        raise LimitError(f"{source}: a memory limit of 0 would refuse every allocation; "
                         "leave it unset for no limit")
    return size


def parse_sm_share(value, source):
    """A whole percent 1..100 (0 and 100 mean no limit, HAMi's meaning) or None."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) > 100:
        raise LimitError(f"{source}: SM share {value!r} is not a whole percent 0..100 "
                         "(0 or 100 = no limit), e.g. 25")
    n = int(text)
    return None if n in (0, 100) else n


def parse_decoders(value, source):
    """Concurrent NVDEC decoders per GPU, 1..255 (0: no cap), or None."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) > 255:
        raise LimitError(f"{source}: decoder count {value!r} is not a whole number 0..255 (0 = no cap)")
    return int(text) or None


def parse_mode(value, source):
    if value is None:
        return None
    if value not in MODES:
        raise LimitError(f"{source}: SM mode {value!r} is not one of {', '.join(MODES)}")
    return value


def _per_gpu(env, prefix, parse):
    out = {}
    for name, value in env.items():
        m = _ORDINAL_RE.fullmatch(name)
        if not m or m.group(1) != prefix:
            continue
        n = int(m.group(2))
        if n >= MAX_ORDINALS:
            raise LimitError(f"{name}: GPU ordinal {n} is beyond the {MAX_ORDINALS} GPUs a slice can hold")
        parsed = parse(value, name)
        if parsed is not None:
            out[n] = parsed
    return out


def resolve_limits(configured=None, env=None):
    """Combine the layers into one :class:`SliceLimits`.

    *configured* holds the provisioner's trait values (``memory_limit``,
    ``sm_limit``, ``sm_mode``; None = unset) and *env* the server's
    environment (default ``os.environ``). Raises :class:`LimitError`.
    """
    configured = configured or {}
    env = os.environ if env is None else env
    sources = {}

    def first(field_name, layers, parse):
        for source, value in layers:
            parsed = parse(value, source)
            if value is not None:
                sources[field_name] = source
                return parsed
        return None

    memory = first("memory", [
        ("memory_limit (kernelspec or HamiProvisioner config)", configured.get("memory_limit")),
        ("HAMI_MEMORY_LIMIT", env.get("HAMI_MEMORY_LIMIT")),
        ("CUDA_DEVICE_MEMORY_LIMIT", env.get("CUDA_DEVICE_MEMORY_LIMIT")),
    ], parse_memory_limit)
    sm_share = first("sm_share", [
        ("sm_limit (kernelspec or HamiProvisioner config)", configured.get("sm_limit")),
        ("HAMI_SM_LIMIT", env.get("HAMI_SM_LIMIT")),
        ("CUDA_DEVICE_SM_LIMIT", env.get("CUDA_DEVICE_SM_LIMIT")),
    ], parse_sm_share)
    mode = first("mode", [
        ("sm_mode (kernelspec or HamiProvisioner config)", configured.get("sm_mode")),
        ("HAMI_SM_MODE", env.get("HAMI_SM_MODE")),
    ], parse_mode) or "hard"
    max_decoders = first("max_decoders", [
        ("max_decoders (kernelspec or HamiProvisioner config)", configured.get("max_decoders")),
        ("HAMI_MAX_DECODERS", env.get("HAMI_MAX_DECODERS")),
    ], parse_decoders)
    return SliceLimits(
        max_decoders=max_decoders,
        memory=memory,
        sm_share=sm_share,
        mode=mode,
        memory_per_gpu=_per_gpu(env, "CUDA_DEVICE_MEMORY_LIMIT", parse_memory_limit),
        sm_per_gpu=_per_gpu(env, "CUDA_DEVICE_SM_LIMIT", parse_sm_share),
        sources=sources,
    )
