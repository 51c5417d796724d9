"""Which slice a GPU process is charged to, and how that was decided.

NVML says "PID 1234 holds 3 GiB on GPU X"; the cap belongs to a slice. The
rules, in order:

1. **environ**: ``HAMI_SLICE`` (or HAMi's ``CUDA_DEVICE_MEMORY_SHARED_CACHE``)
   in the environment the process started with, resolved exactly as the
   preload library resolves it (a value with ``/`` is a path; a name lies
   under ``HAMI_SLICE_ROOT``, else ``/run/hami-jupyter`` when it exists, else
   ``$XDG_RUNTIME_DIR/hami-jupyter``, else ``/tmp/hami-jupyter-<uid>``), as the
   process sees its file system: the path is looked up through
   ``/proc/<pid>/root``, and the file found is matched to a slice under the
   agent's root by device and inode. So a kernel in a container whose slice
   root is the host's folder mounted elsewhere is still found.
2. **slot**: a live slot of a slice file that records the process. Slots hold
   the PID as the owner's PID namespace numbers it, with that namespace's
   inode; the agent maps a host PID to the same pair (``/proc/<pid>/ns/pid``
   and the last field of ``NSpid``). When a process holds a slot in another
   slice than its environment names, the slot wins: the environment is the
   one it started with, and a program may change ``HAMI_SLICE`` before CUDA
   starts; the slot is where the library really counts it.
3. **user**: a process of a user who has a slice named after them
   (``<root>/<user>.slice``) is charged to it, whatever it set or skipped.
   This is what catches a process started without ``LD_PRELOAD`` or with
   ``HAMI_SLICE`` naming a file of the user's own.

Otherwise the process is *unattributed*: listed in the report, never acted on.

A slice file the agent cannot read or trust (:mod:`.slices`) names no slot,
but rules 1 and 3 still find it: when a limits file holds it to a cap, the
process is charged to it as one without the preload library (its user broke
the file, so nothing in it is believed, and her processes are more
enforced, never less). Without a limits file it stays unattributed, and why
says so.

Every rule also needs the process to belong to the slice file's owner (its
real uid is the file's ``st_uid``). A slice file under the hub's root is its
user's, and only that user's processes can open it for writing, so this
costs a real slice nothing; without it, a user could claim a stranger's
process for their own slice (an environment variable, or a fake slot in a
file they own) and have the agent park or end it. A slot naming a process
whose owner does not own the file is no slot of that process, however many
such slots name it (the owner's own slot is found all the same).

A process has the preload library when it holds a slot in the slice it is
charged to; one charged by environ or by user without a slot runs without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...slice.layout import HAMI_HUB_SLICE_ROOT, HAMI_SLICE_ROOT_SUBDIR, HAMI_SLICE_ROOT_TMP_PREFIX
from ...slice.paths import SUFFIX, valid_name
from .procs import pid_namespace

ENVIRON, SLOT, USER = "environ", "slot", "user"


@dataclass(frozen=True)
class Attribution:
    """*seen*: the :class:`~.slices.SliceSeen` charged, or None (unattributed);
    *by*: :data:`ENVIRON`, :data:`SLOT` or :data:`USER`; *preload*: whether the
    process holds a slot there; *why*: for an unattributed process, why."""

    seen: object = None
    by: str | None = None
    preload: bool = False
    slot: object = None  # its slot (a slice file's Slot) when it has one there
    why: str = ""


def library_path(facts, proc="/proc"):
    """The slice file the preload library would open for this process, as the
    process names it, or None when its environment names none.

    The rules of ``native/src/config.c`` (``resolve_slice_path``), with the
    process's own variables, uid and file system.
    """
    value = facts.slice_ref
    if not value:
        return None
    if "/" in value:
        return value
    if not valid_name(value):
        return None  # the library refuses CUDA then
    env = facts.environ or {}
    root = env.get("HAMI_SLICE_ROOT")
    if not root and os.path.isdir(f"{proc}/{facts.pid}/root{HAMI_HUB_SLICE_ROOT}"):
        root = HAMI_HUB_SLICE_ROOT
    if not root:
        xdg = env.get("XDG_RUNTIME_DIR")
        if xdg:
            root = f"{xdg}/{HAMI_SLICE_ROOT_SUBDIR}"
        elif facts.uid is not None:
            root = f"{HAMI_SLICE_ROOT_TMP_PREFIX}{facts.uid}"
        else:
            return None
    return f"{root}/{value}{SUFFIX}"


def seen_from_here(facts, path, proc="/proc"):
    """*path* as the process sees it, made a path the agent can open: through
    the process's root (absolute) or working folder (relative)."""
    if path.startswith("/"):
        return f"{proc}/{facts.pid}/root{path}"
    return f"{proc}/{facts.pid}/cwd/{path}"


def _owns(seen, facts):
    return facts.uid is not None and facts.uid == seen.owner_uid


def _limits_only(seen, by):
    """The attribution to *seen*, a slice file that cannot be read or trusted:
    to it without the preload library when its limits file holds it to a cap
    (see the module), else none."""
    if seen.hub_limits is not None:
        return Attribution(seen, by, False, why=f"its slice {seen.name} cannot be read: held to its limits file")
    return Attribution(why=f"its slice {seen.name} cannot be read")


class Attributor:
    """Applies the rules; remembers per ``(pid, start time)`` which file a
    process's environment names, so that each interval costs no ``stat``
    for a process already placed."""

    def __init__(self, proc="/proc"):
        self.proc = proc
        self.own_ns = pid_namespace("self", proc)
        self._named = {}  # (pid, start ticks) -> (dev, ino), or None when it names none

    def _environ_identity(self, facts):
        key = (facts.pid, facts.start_ticks)
        if key in self._named:
            return self._named[key]
        path = library_path(facts, self.proc)
        identity = None
        if path is not None:
            try:
                st = os.stat(seen_from_here(facts, path, self.proc))
            except OSError:
                return None  # not made yet, or not ours to see: looked for again next time
            identity = (st.st_dev, st.st_ino)
        self._named[key] = identity
        return identity

    def _slot(self, facts, slices):
        ns, ns_pid = facts.pid_ns, facts.ns_pid
        if ns is None:  # its namespace link is not ours to read: only a PID of our own namespace can match
            if ns_pid not in (None, facts.pid):
                return None
            ns, ns_pid = self.own_ns, facts.pid
        hits = slices.slots.get((ns, ns_pid if ns_pid is not None else facts.pid)) or ()
        owned = sorted((h for h in hits if _owns(h[0], facts)), key=lambda h: h[0].name)
        return owned[0] if owned else None  # another user's slot naming it is no slot of it

    def attribute(self, facts, slices):
        """The :class:`Attribution` of the process *facts* among *slices*
        (a :class:`~.slices.SliceSet`)."""
        slot = self._slot(facts, slices)
        named = None
        identity = self._environ_identity(facts)
        if identity is not None:
            named = slices.by_identity.get(identity)
            if named is not None and not _owns(named, facts):
                named = None
        if slot is not None and (named is None or slot[0] is not named):
            return Attribution(slot[0], SLOT, True, slot[1])
        if named is not None:
            if named.snapshot is None:
                return _limits_only(named, ENVIRON)
            return Attribution(named, ENVIRON, slot is not None, slot[1] if slot is not None else None)
        user = facts.user
        if user and valid_name(user):
            seen = slices.by_name.get(user)
            if seen is not None and _owns(seen, facts):
                if seen.snapshot is None:
                    return _limits_only(seen, USER)
                return Attribution(seen, USER, False)
        return Attribution(why="no slice names it, and its user has none")

    def keep(self, keys):
        """Forget the processes not in *keys* (``(pid, start ticks)`` pairs)."""
        keys = set(keys)
        for key in [k for k in self._named if k not in keys]:
            del self._named[key]
