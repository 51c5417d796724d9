"""What to do about a slice that cannot be used: one table for every front.

``%hami``, its watch widget, the server's REST answers, ``hami-jupyter
status``, ``doctor``, ``slice list`` and the admin panel all meet the same
errors of :mod:`hami_jupyter.slice` (a missing, damaged or planted slice file;
a name that is no slice name). Each is explained here once, as what is wrong
and what to do, so every front says the same thing; the fronts only choose
how to show it.
"""

from .slice.file import LimitsBusy, SliceFileError, UnsupportedVersion
from .slice.paths import SliceNameError, UntrustedPath, slice_name


def explain(error, path):
    """``(detail, fix)`` for *error*, met using the slice at *path*."""
    if isinstance(error, SliceNameError):
        return str(error), "name a slice by a slice name or by the path of its file"
    if isinstance(error, FileNotFoundError):
        return (f"slice {slice_name(path)!r} does not exist ({path})",
                "a slice file is made when the slice's first kernel starts (restarting a "
                "kernel makes it again); check the name, and HAMI_SLICE_ROOT or --root for "
                "the folder")
    if isinstance(error, UntrustedPath):
        return error.detail, error.fix
    if isinstance(error, PermissionError):
        return (f"no permission to read slice file {path}",
                "slices of other users are readable only by their owner and the administrators")
    if isinstance(error, UnsupportedVersion):
        return str(error), "a newer hami-jupyter wrote it: upgrade hami-jupyter here"
    if isinstance(error, LimitsBusy):
        return str(error), "administrators are changing the limits right now: read it again"
    if isinstance(error, SliceFileError):
        return (str(error), "the slice file is damaged: when none of the slice's kernels runs, "
                "remove the file (the next kernel start makes it again with the configured "
                "limits), or ask your administrator")
    return (f"cannot read slice file {path}: {getattr(error, 'strerror', None) or error}",
            "the user running Jupyter must be able to read the slice file; check its permissions")


def advice(error, path):
    """:func:`explain` as one line: ``<detail>; <fix>``."""
    detail, fix = explain(error, path)
    return f"{detail}; {fix}"
