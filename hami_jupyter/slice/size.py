"""Memory sizes as people write them, by the same rules as the C library.

``native/src/size.c`` (``hami_parse_size``) is the reference; tests/test_size.py
runs both on the same inputs. A size is a plain number of bytes
(``1073741824``, also ``1073741824B``) or a decimal number followed by a unit
``k``, ``m``, ``g`` or ``t`` in either case, optionally followed by ``i`` and
then ``B``: ``4g``, ``4096m``, ``4Gi``, ``1.5g``, ``1536MiB``, ``4GB``. Every
unit is binary (1 k = 1024 bytes) whichever spelling is used, because that is
what HAMi-core's users already write and how GPU memory is counted. A fraction
is rounded down to whole bytes, and only its first nine digits count.

Anything else is an error rather than "no limit": empty, negative, a fraction
of a byte, trailing text, or more than 2**64 - 1 bytes. Zero is a size; a
memory *limit* of zero is refused where limits are read.
"""

import re

MAX_SIZE = 2**64 - 1

ACCEPTED_FORMS = (
    "a number of bytes (1073741824) or a decimal number with a binary unit "
    "k, m, g or t, optionally followed by i and B (4g, 4096m, 4Gi, 1.5g, 1536MiB)"
)

_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
_FRACTION_DIGITS = 9  # as in size.c: nanobyte precision is plenty

_SIZE_RE = re.compile(
    r"(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]+))?"
    r"(?:(?P<unit>[kmgtKMGT])[iI]?)?[bB]?"
)


def _invalid(text, reason=""):
    return ValueError(f"invalid size {text!r}{': ' + reason if reason else ''}; expected {ACCEPTED_FORMS}")


def parse_size(text):
    """Return the number of bytes *text* stands for; ValueError if it is not a size."""
    if not isinstance(text, str):
        raise TypeError(f"size must be a string, not {type(text).__name__}")
    match = _SIZE_RE.fullmatch(text)
    if match is None or not (match["whole"] or match["frac"]):
        raise _invalid(text)
    shift = _SHIFT[(match["unit"] or "").lower()]
    digits = (match["frac"] or "")[:_FRACTION_DIGITS]
    frac = int(digits or "0")
    if shift == 0 and frac:
        raise _invalid(text, "a fraction of a byte")
    whole = int(match["whole"] or "0")
    size = (whole << shift) + ((frac << shift) // 10 ** len(digits))
    if size > MAX_SIZE:
        raise _invalid(text, "more than 2**64 - 1 bytes")
    return size


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_size(n):
    """``4294967296`` -> ``"4.0 GiB"``; below 1 KiB, whole bytes (``"512 B"``)."""
    if n < 0:
        raise ValueError(f"size cannot be negative: {n}")
    if n < 1024:
        return f"{n} B"
    power = 0
    while power + 1 < len(_UNITS) and n >= 1024 ** (power + 1):
        power += 1
    shown = round(n / 1024**power, 1)
    if shown >= 1024 and power + 1 < len(_UNITS):
        # 1023.96 MiB would print as "1024.0 MiB"; say "1.0 GiB" instead.
        power += 1
        shown = round(n / 1024**power, 1)
    return f"{shown:.1f} {_UNITS[power]}"
