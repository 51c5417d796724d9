"""A slice's limits, where they come from, and how they are checked.

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
administrator gave it, see :mod:`hami_jupyter.slice_setup`.)

Every value of every place is checked here, before a kernel starts: a
malformed limit is an error naming its source, never "no limit", even where
a stricter value elsewhere would have won. The preload library checks again
(it reads the same variables), so a process started by hand is held to the
same rules.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .size import ACCEPTED_FORMS, format_size, parse_size

MODES = ("hard", "elastic")
MAX_ORDINALS = 16  # HAMI_SLICE_MAX_DEVICES

# Per-GPU variables: <prefix><n>, n a CUDA ordinal 0..15 without leading zeros.
PER_GPU_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_", "HAMI_MAX_DECODERS_")
_ORDINAL_RE = re.compile(r"0|[1-9][0-9]?", re.ASCII)


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


def _text(value, source, what, forms):
    """*value* as the text to parse: a str as it is (no stripping: the preload
    library reads the same variable byte for byte), an int as its digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise LimitError(f"{source}: {what} {value!r} is not {forms}")


def parse_memory_limit(value, source):
    """Bytes for a memory limit written as ``4g``, ``4096m``, ``4294967296``...

    ``None`` means "not set here". The grammar is :func:`hami_jupyter.size.parse_size`'s
    (``native/src/size.c``): no spaces, no sign. Zero is refused: it would
    refuse every allocation, so it is surely a mistake (leave the setting out
    for no limit).
    """
    if value is None:
        return None
    text = _text(value, source, "memory limit", f"a size; expected {ACCEPTED_FORMS}")
    try:
        size = parse_size(text)
    except ValueError:
        raise LimitError(f"{source}: memory limit {value!r} is not a size; expected {ACCEPTED_FORMS}") from None
    if size == 0:
        raise LimitError(f"{source}: a memory limit of 0 would refuse every allocation; "
                         "leave it unset for no limit")
    return size


# A small whole number as settings are written: 1-3 ASCII digits, nothing else
# (config.c's parse_small). re.ASCII keeps out other scripts' digits, which
# str.isdigit() accepts; fullmatch keeps out a trailing newline, which $ allows.
_SMALL_RE = re.compile(r"[0-9]{1,3}", re.ASCII)


def parse_small(value, maximum):
    """The number 0..*maximum* that *value* (1-3 ASCII digits, or an int) stands
    for, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= maximum else None
    if not isinstance(value, str) or not _SMALL_RE.fullmatch(value):
        return None
    n = int(value)
    return n if n <= maximum else None


def parse_sm_share(value, source):
    """A whole percent 0..100 (0 and 100 mean no limit, HAMi's meaning) or None:
    1-3 ASCII digits, no sign, no spaces."""
    if value is None:
        return None
    n = parse_small(value, 100)
    if n is None:
        raise LimitError(f"{source}: SM share {value!r} is not a whole percent of each GPU (1-99; 0 or 100: no share), digits "
                         "only (0 or 100 = no limit), e.g. 25")
    return None if n in (0, 100) else n


def parse_decoders(value, source):
    """Concurrent NVDEC decoders per GPU, 1..255 (0: no cap), or None: 1-3 ASCII digits."""
    if value is None:
        return None
    n = parse_small(value, 255)
    if n is None:
        raise LimitError(f"{source}: decoder count {value!r} is not a whole number 0..255, "
                         "digits only (0 = no cap)")
    return n or None


def parse_mode(value, source):
    """"hard" or "elastic", exactly (lower case, no spaces), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in MODES:
        raise LimitError(f"{source}: SM mode {value!r} is not one of {', '.join(MODES)}")
    return value


def parse_ordinal(text):
    """The CUDA ordinal 0..15 a per-GPU variable's suffix names, or None: written
    plainly, without leading zeros (config.c's check_ordinal_names)."""
    if not isinstance(text, str) or not _ORDINAL_RE.fullmatch(text):
        return None
    n = int(text)
    return n if n < MAX_ORDINALS else None


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
                                 f"suffix must be a GPU ordinal 0-{MAX_ORDINALS - 1} written "
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
    """Combine every source of limits into one :class:`SliceLimits`; the strictest wins.

    *configured* holds provisioner trait values (``memory_limit``,
    ``sm_limit``, ``sm_mode``, ``max_decoders``; None = unset) and *env* an
    environment (default ``os.environ``). *layers* are more sources, each
    ``(label, kind, mapping)``: *kind* ``"config"`` (trait names) or
    ``"env"`` (variable names); their messages and
    :attr:`SliceLimits.sources` carry *label* (``"kernelspec 'gpu' env"``).
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

    memory = strictest("memory", "memory_limit")
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

    return SliceLimits(
        max_decoders=max_decoders,
        memory=memory,
        sm_share=sm_share,
        mode=mode,
        memory_per_gpu=per_gpu("CUDA_DEVICE_MEMORY_LIMIT", parse_memory_limit, memory),
        sm_per_gpu=per_gpu("CUDA_DEVICE_SM_LIMIT", parse_sm_share, sm_share),
        sources=sources,
    )
