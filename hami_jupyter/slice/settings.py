"""The limits that settings ask of a slice: every source, and the strictest wins.

Limits reach a kernel from several places:

1. the kernelspec's provisioner ``config`` (``memory_limit``, ``sm_limit``,
   ``sm_mode``, ``max_decoders``) and the kernelspec's ``env``;
2. ``c.HamiProvisioner.*`` in the Jupyter server's configuration;
3. the single-user server's environment as JupyterHub sets it:
   ``HAMI_MEMORY_LIMIT``, ``HAMI_SM_LIMIT``, ``HAMI_SM_MODE``, ``HAMI_MAX_DECODERS``;
4. HAMi's device-plugin variables, when the server already runs under HAMi
   on Kubernetes: ``CUDA_DEVICE_MEMORY_LIMIT[_<n>]``, ``CUDA_DEVICE_SM_LIMIT[_<n>]``.

**The strictest wins**, field by field (memory, SM share, mode, decoders
independently): the smallest memory cap, the smallest SM share, the fewest
decoders, ``hard`` over ``elastic``. Each of these places is set by someone
with a reason to hold the kernel to it (the hub's policy, a device plugin's
share of the GPU, an administrator's server config, a kernelspec's size),
and a kernel cannot tell which of them is the authority; were the most
specific to win, a kernelspec (which a user may write) could undo the hub's
cap, and a limit in one place would silently vanish because another place
merely mentions the field. So a limit set anywhere never yields a less
limited kernel; a place that leaves a field unset loosens nothing. (Only the
slice file itself outranks them: a live slice keeps the limits an
administrator gave it, see :mod:`.create`.)

Every value of every place is checked here (with :mod:`.limits`' grammar),
before a kernel starts: a malformed limit is an error naming its source, never "no limit", even where
a stricter value elsewhere would have won. The preload library checks again
(it reads the same variables), so a process started by hand is held to the
same rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .limits import (
    PER_GPU_ORDINALS,
    LimitError,
    Limits,
    parse_decoders,
    parse_memory_limit,
    parse_mode,
    parse_ordinal,
    parse_sm_share,
)
from .size import format_size

# Per-GPU variables: <prefix><n>, n a CUDA ordinal 0..15 without leading zeros.
PER_GPU_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_", "HAMI_MAX_DECODERS_")


@dataclass(frozen=True)
class AskedLimits:
    """What the settings ask a slice to hold.

    *limits* hold on every GPU; *memory_per_gpu* and *sm_per_gpu* (CUDA
    ordinal -> value, from HAMi's ``_<n>`` variables) where one GPU is asked
    for less. *sources* says where each field came from: a :class:`Limits`
    field name, or a per-GPU variable's name, -> the source's label.
    """

    limits: Limits = Limits()
    memory_per_gpu: dict = field(default_factory=dict)
    sm_per_gpu: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)

    @property
    def per_gpu(self):
        """Whether some GPU is asked for limits of its own."""
        return bool(self.memory_per_gpu or self.sm_per_gpu)

    @property
    def unlimited(self):
        return self.limits.unlimited and not self.per_gpu

    def describe(self):
        """One line for logs and messages: ``memory 4.0 GiB, SM 25 % (hard)``."""
        parts = [self.limits.describe()]
        parts += [f"GPU {n}: memory {format_size(v)}" for n, v in sorted(self.memory_per_gpu.items())]
        parts += [f"GPU {n}: SM {v} %" for n, v in sorted(self.sm_per_gpu.items())]
        return "; ".join(parts)

    def environment(self):
        """The variables that give a process started outside a slice file the
        same limits (the preload library reads them when it creates the file)."""
        limits = self.limits
        env = {"HAMI_SM_MODE": limits.mode}
        if limits.memory_limit:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = str(limits.memory_limit)
        if limits.sm_share:
            env["CUDA_DEVICE_SM_LIMIT"] = str(limits.sm_share)
        for n, v in self.memory_per_gpu.items():
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{n}"] = str(v)
        for n, v in self.sm_per_gpu.items():
            env[f"CUDA_DEVICE_SM_LIMIT_{n}"] = str(v)
        if limits.max_decoders:
            env["HAMI_MAX_DECODERS"] = str(limits.max_decoders)
        return env


def check_per_gpu_names(env):
    """LimitError for a per-GPU variable (``CUDA_DEVICE_MEMORY_LIMIT_<n>``,
    ``CUDA_DEVICE_SM_LIMIT_<n>``, ``HAMI_MAX_DECODERS_<n>``) whose suffix is no
    GPU ordinal 0-15 (``_16``, ``_01``, ``_x``, ``_``): the preload library
    refuses CUDA for it rather than leave that GPU less limited than asked.
    ``HAMI_MAX_DECODERS_<n>`` values are checked here too (nothing else reads
    them on this side)."""
    for name, value in env.items():
        for prefix in PER_GPU_PREFIXES:
            if not name.startswith(prefix):
                continue
            if parse_ordinal(name[len(prefix):]) is None:
                raise LimitError(f"{name}: set for a GPU the preload library cannot name: the "
                                 f"suffix must be a GPU ordinal 0-{PER_GPU_ORDINALS - 1} written "
                                 "without leading zeros")
            if prefix == "HAMI_MAX_DECODERS_":
                parse_decoders(value, name)


def _per_gpu(env, prefix, parse):
    check_per_gpu_names(env)
    out = {}
    for name, value in env.items():
        if not name.startswith(f"{prefix}_"):
            continue
        n = parse_ordinal(name[len(prefix) + 1:])
        parsed = parse(value, name)
        if parsed is not None:
            out[n] = parsed
    return out


_TRAIT_VARIABLES = {  # trait -> the variables that set the same field
    "memory_limit": ("HAMI_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"),
    "sm_limit": ("HAMI_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT"),
    "sm_mode": ("HAMI_SM_MODE",),
    "max_decoders": ("HAMI_MAX_DECODERS",),
}


def resolve_limits(configured=None, env=None, *, layers=()):
    """Combine every source of limits into one :class:`AskedLimits`; the strictest wins.

    *configured* holds provisioner trait values (``memory_limit``,
    ``sm_limit``, ``sm_mode``, ``max_decoders``; None = unset) and *env* an
    environment (default ``os.environ``). *layers* are more sources, each
    ``(label, kind, mapping)``: *kind* ``"config"`` (trait names) or
    ``"env"`` (variable names); their messages and
    :attr:`AskedLimits.sources` carry *label* (``"kernelspec 'gpu' env"``).
    List the most specific first: it is named when two sources say the same.

    Field by field the strictest value any source sets wins: the smallest
    memory cap, the smallest SM share, the fewest decoders, ``hard`` over
    ``elastic``. A per-GPU value (``_<n>``) stands only where it is stricter
    than the value for every GPU. A source that leaves a field unset, or
    says "no limit" (SM share 0 or 100, decoders 0), loosens nothing. Every
    value of every source is checked, not only the winner's: a malformed one
    raises :class:`LimitError` naming its source.
    """
    configured = configured or {}
    env = os.environ if env is None else env
    every = [*layers, (None, "config", configured), (None, "env", env)]
    sources = {}

    def named(label, key):
        if label is not None:
            return f"{key} ({label})"
        return f"{key} (kernelspec or HamiProvisioner config)" if key in _TRAIT_VARIABLES else key

    def checked(label, parse, *args):
        """parse(*args), a LimitError's message led by the source's label."""
        try:
            return parse(*args)
        except LimitError as e:
            raise (LimitError(f"{label}: {e}") if label is not None else e) from None

    def settings(trait):
        """(parsed, source) for every source that sets *trait*'s field, most specific first."""
        parse = {"memory_limit": parse_memory_limit, "sm_limit": parse_sm_share,
                 "sm_mode": parse_mode, "max_decoders": parse_decoders}[trait]
        for label, kind, mapping in every:
            for key in (trait,) if kind == "config" else _TRAIT_VARIABLES[trait]:
                value = mapping.get(key)
                if value is not None:
                    yield checked(label, parse, value, named(None, key)), named(label, key)

    def strictest(field_name, trait):
        found = list(settings(trait))
        limits = [(v, s) for v, s in found if v is not None]
        if limits or found:  # a source that says "no limit" is named only when none limits
            sources[field_name] = min(limits, key=lambda vs: vs[0])[1] if limits else found[0][1]
        return min(v for v, _ in limits) if limits else None

    memory = strictest("memory_limit", "memory_limit")
    sm_share = strictest("sm_share", "sm_limit")
    max_decoders = strictest("max_decoders", "max_decoders")
    modes = list(settings("sm_mode"))
    mode = "elastic" if modes and all(m == "elastic" for m, _ in modes) else "hard"
    if modes:
        sources["mode"] = next(s for m, s in modes if m == mode)

    def per_gpu(prefix, parse, overall):
        out = {}
        for label, kind, mapping in every:
            if kind == "env":
                for n, v in checked(label, _per_gpu, mapping, prefix, parse).items():
                    if n not in out or v < out[n][0]:
                        out[n] = (v, named(label, f"{prefix}_{n}"))
        # A GPU's own value that is no stricter than every GPU's would loosen that GPU.
        out = {n: vs for n, vs in out.items() if overall is None or vs[0] < overall}
        sources.update({f"{prefix}_{n}": s for n, (_, s) in out.items()})
        return {n: v for n, (v, _) in out.items()}

    return AskedLimits(
        Limits(memory or 0, sm_share or 0, mode, max_decoders or 0),
        memory_per_gpu=per_gpu("CUDA_DEVICE_MEMORY_LIMIT", parse_memory_limit, memory),
        sm_per_gpu=per_gpu("CUDA_DEVICE_SM_LIMIT", parse_sm_share, sm_share),
        sources=sources,
    )
