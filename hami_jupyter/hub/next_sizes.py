"""Sizes an administrator picked for users' next server starts (Kubernetes).

On Kubernetes a slice is as large as the pod HAMi placed: its limits cannot
grow under a running server, so an administrator who resizes a user there
picks the size of the user's *next* start instead. The hub service
(``hami-jupyter hub-service``) writes that pick here, and
:class:`~hami_jupyter.hub.policy.SlicePolicy` reads it at every spawn: the
picked size becomes the user's own size (first among the profiles offered,
and what a start without a choice gets) until an administrator picks again
or clears it.

It is one small JSON file, ``{user: {"size", "by", "when"}}``, named by
``SlicePolicy.next_sizes_file`` (unset: the feature is off). The hub and its
managed services run in one pod (z2jh) or on one host, so both reach it; put
it on the hub's persistent volume so that picks outlive a hub restart. It is
written whole into a temporary file and renamed over the old one, so a reader
never sees half of it; a file that cannot be read counts as no picks (and is
logged), never as a reason to refuse a spawn.
"""

import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)


class NextSizesError(ValueError):
    """A pick that cannot be stored (no such size, a malformed name)."""


def read(path):
    """``{user: {"size", "by", "when"}}`` from *path*; {} when missing or unreadable."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("hami-jupyter: cannot read the next sizes in %s (%s): none counts", path, e)
        return {}
    if not isinstance(data, dict):
        log.warning("hami-jupyter: %s is not a JSON object: no next size counts", path)
        return {}
    return {u: v for u, v in data.items()
            if isinstance(u, str) and isinstance(v, dict) and isinstance(v.get("size"), str)}


def size_for(path, user):
    """The size name an administrator picked for *user*'s next start, or None."""
    entry = read(path).get(user)
    return entry["size"] if entry else None


def _write(path, data):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def pick(path, user, size, by, sizes=None):
    """Store *size* (a size name; None clears the pick) for *user*'s next start,
    picked by *by*. *sizes*, when given, are the names that exist."""
    if not path:
        raise NextSizesError("no file for next sizes is configured (SlicePolicy.next_sizes_file)")
    if not isinstance(user, str) or not user:
        raise NextSizesError(f"not a user name: {user!r}")
    if size is not None and sizes is not None and size not in sizes:
        raise NextSizesError(f"no slice size named {size!r}; sizes: {', '.join(sizes) or 'none'}")
    data = read(path)
    if size is None:
        data.pop(user, None)
    else:
        data[user] = {"size": size, "by": by, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                  time.gmtime())}
    _write(path, data)
    return data.get(user)
