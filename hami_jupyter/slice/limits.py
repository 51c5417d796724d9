"""A slice's limits: the one value type, the SM modes, and how limits are written.

:class:`Limits` is what one entry of a slice holds its processes to (a GPU's
own entry, or the default every other GPU follows): the fields of the C
header's ``struct hami_device_limit``, with the mode by name. Everywhere in
this package, 0 means "no limit" (as in the file), and an SM share of 100 is
no share.

The parse functions are the grammar every reader shares, the preload
library's included (``native/src/config.c``; ``tests/native/test_grammar.py``
runs both on one table): a malformed value is a :class:`LimitError` naming
where it came from, never "no limit".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from .layout import HAMI_MODE_ELASTIC, HAMI_MODE_HARD, HAMI_SLICE_MAX_DEVICES
from .size import ACCEPTED_FORMS, format_size, parse_size

# The SM modes by name, and their numbers in the file: the one map.
MODE_NUMBERS = {"hard": HAMI_MODE_HARD, "elastic": HAMI_MODE_ELASTIC}
MODES = tuple(MODE_NUMBERS)

# Per-GPU settings (<prefix><n>) name a CUDA ordinal 0..15: a slice holds 16 GPUs.
PER_GPU_ORDINALS = HAMI_SLICE_MAX_DEVICES
_ORDINAL_RE = re.compile(r"0|[1-9][0-9]?", re.ASCII)


class LimitError(ValueError):
    """A limit that cannot be applied; the message names its source and the fix."""


def mode_name(number):
    """"elastic" for the file's elastic mode; "hard" for anything else, as the
    preload library reads it."""
    return "elastic" if number == HAMI_MODE_ELASTIC else "hard"


@dataclass(frozen=True)
class Limits:
    """What one entry of a slice holds its processes to; 0: no limit.

    *memory_limit* in bytes per GPU, *sm_share* a whole percent 1-99 of each
    GPU, *mode* "hard" or "elastic" (how the share is held), *max_decoders*
    video decoders at once per GPU. *memory_guarantee* (slice file 1.7) is
    the bytes per GPU the slice keeps whatever others need (the memory broker
    parks none of its processes while it holds no more); 0: the guarantee is
    the limit. It is carried here so that every writer of limits keeps it.
    """

    memory_limit: int = 0
    sm_share: int = 0
    mode: str = "hard"
    max_decoders: int = 0
    memory_guarantee: int = 0

    def __post_init__(self):
        if self.sm_share == 100:  # HAMi's "no share"
            object.__setattr__(self, "sm_share", 0)

    @property
    def unlimited(self):
        return not (self.memory_limit or self.sm_share or self.max_decoders)

    @property
    def guarantee(self):
        """The guarantee in force: *memory_guarantee*, or the limit when none is
        set (0). 0 only for a slice with neither (no cap: nothing promised)."""
        return effective_guarantee(self.memory_limit, self.memory_guarantee)

    @property
    def lends(self):
        """Whether the limit reaches above the guarantee: bytes up there are
        lent, and the memory broker may take them back by parking idle kernels."""
        return self.guarantee != self.memory_limit

    @property
    def elastic(self):
        """Whether a share is held elastically (a mode means nothing without a share)."""
        return bool(self.sm_share) and self.mode == "elastic"

    def in_effect(self):
        """These limits as they take effect: a mode means nothing without a share."""
        return self if self.sm_share or self.mode == "hard" else replace(self, mode="hard")

    @classmethod
    def of_entry(cls, entry):
        """From a ``struct hami_device_limit`` (:class:`~.layout.HamiDeviceLimit`)."""
        return cls(entry.memory_limit, entry.sm_share % 100, mode_name(entry.mode), entry.max_decoders,
                   entry.memory_guarantee)

    def fill_entry(self, entry, flags):
        """Write these limits into a :class:`~.layout.HamiDeviceLimit` with *flags*."""
        entry.memory_limit = self.memory_limit
        entry.sm_share = self.sm_share
        entry.mode = MODE_NUMBERS[self.mode]
        entry.max_decoders = self.max_decoders
        entry.memory_guarantee = self.memory_guarantee
        entry.flags = flags
        check_guarantee(entry.memory_limit, entry.memory_guarantee)
        return entry

    def keeping_guarantee(self, existing):
        """These limits, with the guarantee of *existing* (a :class:`Limits`)
        when they give none: a writer that did not ask to change the
        guarantee must not drop it. A kept guarantee above a lower new limit
        comes down to the limit (never above it)."""
        if self.memory_guarantee or not existing.memory_guarantee:
            return self
        kept = existing.memory_guarantee
        if self.memory_limit:
            kept = min(kept, self.memory_limit)
        return replace(self, memory_guarantee=kept)

    @classmethod
    def from_dict(cls, data):
        """From :meth:`as_dict`'s form (JSON: the admin marks, the admin service)."""
        return cls(int(data.get("memory_limit") or 0), int(data.get("sm_share") or 0),
                   data.get("mode") or "hard", int(data.get("max_decoders") or 0),
                   int(data.get("memory_guarantee") or 0))

    def as_dict(self):
        return asdict(self)

    def replace(self, **fields):
        return replace(self, **fields)

    def describe(self):
        """``memory 4.0 GiB, SM 25 % (hard)``; ``memory unlimited, SM unlimited``;
        with a guarantee below the cap ``memory 8.0 GiB (2.0 GiB guaranteed), ...``."""
        memory = f"memory {format_size(self.memory_limit)}" if self.memory_limit else "memory unlimited"
        if self.lends:
            memory += f" ({format_size(self.guarantee)} guaranteed)"
        sm = f"SM {self.sm_share} % ({self.mode})" if self.sm_share else (
            "SM unlimited" + (" (elastic)" if self.mode == "elastic" else ""))
        decoders = f", {self.max_decoders} decoders" if self.max_decoders else ""
        return f"{memory}, {sm}{decoders}"


def effective_guarantee(memory_limit, memory_guarantee):
    """The bytes a slice is guaranteed on a GPU: its guarantee, or its limit
    when it has none (0: the file's "the limit is the guarantee")."""
    return memory_guarantee or memory_limit


def check_guarantee(memory_limit, memory_guarantee):
    """Refuse a guarantee above a (nonzero) limit: the slice could never use it."""
    if memory_limit and memory_guarantee > memory_limit:
        raise LimitError(f"a memory guarantee of {format_size(memory_guarantee)} is above the "
                         f"memory limit of {format_size(memory_limit)}; lower the guarantee "
                         "or raise the limit")


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

    ``None`` means "not set here". The grammar is :func:`.size.parse_size`'s
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


def parse_memory_guarantee(value, source):
    """Bytes for a memory guarantee written like a memory limit (``2g``,
    ``2048m``, bytes), or None when not set here. 0 is allowed and means
    none: the limit is the guarantee (the file's meaning of 0)."""
    if value is None:
        return None
    text = _text(value, source, "memory guarantee", f"a size; expected {ACCEPTED_FORMS}")
    try:
        return parse_size(text)
    except ValueError:
        raise LimitError(f"{source}: memory guarantee {value!r} is not a size; expected "
                         f"{ACCEPTED_FORMS}") from None


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
        raise LimitError(f"{source}: SM share {value!r} is not a whole percent of each GPU "
                         "(1-99; 0 or 100: no share), digits only, e.g. 25")
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
    """The CUDA ordinal 0..15 a per-GPU setting's suffix names, or None: written
    plainly, without leading zeros (config.c's check_ordinal_names)."""
    if not isinstance(text, str) or not _ORDINAL_RE.fullmatch(text):
        return None
    n = int(text)
    return n if n < PER_GPU_ORDINALS else None
