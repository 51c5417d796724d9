"""Where slices live: names, the slice root, and paths.

A slice is named (by default after the user) and lives at
``<slice root>/<name>.slice``. Every tool accepts a slice by name or by path,
and a value containing ``/`` is a path. The root is, in order:

1. ``$HAMI_SLICE_ROOT``;
2. ``/run/hami-jupyter`` when it exists (the hub manages slices there);
3. ``$XDG_RUNTIME_DIR/hami-jupyter``;
4. ``/tmp/hami-jupyter-<uid>``.

``native/src/config.c`` resolves a bare ``HAMI_SLICE`` name in the same
order, so a kernel and this module agree on the file whichever way it was
named.
"""

import getpass
import os
import re
from pathlib import Path

SUFFIX = ".slice"
HUB_ROOT = Path("/run/hami-jupyter")

# Slice names become file names: keep them plain and bounded (the header's
# name field holds 63 bytes).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,62}")


class SliceNameError(ValueError):
    """A slice name that cannot be a file name under the slice root."""


def default_root(env=None):
    """The slice root for this environment (see the module docstring)."""
    env = os.environ if env is None else env
    root = env.get("HAMI_SLICE_ROOT")
    if root:
        return Path(root)
    if HUB_ROOT.is_dir():
        return HUB_ROOT
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "hami-jupyter"
    return Path(f"/tmp/hami-jupyter-{os.getuid()}")


def check_name(name):
    """Return *name* if it is a valid slice name; SliceNameError otherwise."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.endswith(SUFFIX):
        raise SliceNameError(
            f"invalid slice name {name!r}: use 1-63 letters, digits and . _ @ + - "
            "(starting with a letter or digit), or give a path containing '/'"
        )
    return name


def user_slice_name(env=None):
    """The default slice name: the JupyterHub user, else the Unix user.

    Characters a file name cannot hold are replaced, so every hub user name
    maps to a usable slice name.
    """
    env = os.environ if env is None else env
    user = env.get("JUPYTERHUB_USER") or getpass.getuser()
    name = re.sub(r"[^A-Za-z0-9._@+-]", "-", user).lstrip("._@+-")[:63] or "user"
    return check_name(name)


def slice_path(slice_ref, root=None, env=None):
    """Path of the slice named or located by *slice_ref*."""
    if "/" in slice_ref:
        return Path(slice_ref)
    root = Path(root) if root else default_root(env)
    return root / f"{check_name(slice_ref)}{SUFFIX}"


def slice_name(path):
    """The name a slice file's path gives it (``/x/alice.slice`` -> ``alice``)."""
    base = Path(path).name
    return base[: -len(SUFFIX)] if base.endswith(SUFFIX) else base


def list_slice_paths(root=None, env=None):
    """Every ``*.slice`` file directly under the root, sorted by name."""
    root = Path(root) if root else default_root(env)
    try:
        return sorted(p for p in root.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    except FileNotFoundError:
        return []
