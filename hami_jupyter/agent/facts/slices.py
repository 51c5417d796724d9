"""The slices under the agent's root, as they are at one look.

Each look needs each slice's limits in force (the cap the guard holds the
driver's figures to, the guarantee the broker keeps), its own charge per GPU
(the "reported" figure beside the real one) and its live slots (which
processes run under the preload library, by PID namespace and PID). All
three change while kernels run, so each slice is snapshotted at every look;
what is kept from one look to the next is only the open, mapped file,
because opening and checking a slice file costs several times more than
reading it.

Whose word each part is: the limits are the hub's when a limits file lies
beside the slice (root's, which the user's processes may only read), and
otherwise the word of whoever owns the slice file (:attr:`SliceSeen.limits_trusted`:
only when that is the agent's own user). Everything else of a slice file,
slots included, is written by its user's processes: her claims.
A file is opened again when it was replaced (another inode) or when a
limits file appeared or went beside it: the limits file is the authority
when it exists, and the slice file's own limits block is the user's to
write, so a mapping opened before a limits file existed must not be kept.

The folder and the files pass the trust rule of :mod:`hami_jupyter.slice.paths`
exactly as for every other reader (an agent running as root trusts the
hub's root-owned folder and the users' files in it, not a folder a user
made); what the rule refuses is reported, never read.

A slice file the agent cannot read or may not trust (its user made it
writable by everyone, or wrote junk into its header) still has a name, an
owner and an identity (its directory entry in the root and its ``stat``,
facts), and, under a hub, a limits file that is root's. Such a slice is
kept as *limits only* (:attr:`SliceSeen.hub_limits`): its user's processes
are charged to it as processes without the preload library (none of its
slots can be believed), held to the strictest cap of the limits file (which
GPU a per-GPU entry is for only the slice file says). Issue 39: refused
outright, it left her kernel and a bypass beside it unattributed, 10.6 GiB
against an 8 GiB cap for over 50 s, and another user's kernel was parked in
her place. Without a limits file there is nothing trusted to hold it to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ...slice.file import SliceFile, SliceFileError, read_limits_file
from ...slice.layout import HAMI_LIMITS_SUFFIX
from ...slice.paths import SUFFIX, UntrustedPath, check_file, check_folder, valid_name


@dataclass
class SliceSeen:
    """One slice file under the root. *identity* is ``(st_dev, st_ino)``: how a
    path a process names (seen through its own root) is matched to it. *snapshot*
    is None when the file could not be read this interval (*error* says why)."""

    name: str
    path: Path
    identity: tuple
    owner_uid: int
    snapshot: object = None
    error: str | None = None
    hub_limits: object = None  # without a snapshot: the limits file's strictest Limits (see the module)

    @property
    def enforced(self):
        """Whether its processes are held to a cap: it was read, or its limits file was."""
        return self.snapshot is not None or self.hub_limits is not None

    def device(self, uuid):
        """The snapshot's entry for GPU *uuid*, or None when the slice has not met it."""
        for d in self.snapshot.devices if self.snapshot else ():
            if d.uuid == uuid:
                return d
        return None

    def limits(self, uuid):
        """The :class:`~hami_jupyter.slice.limits.Limits` in force on GPU *uuid*:
        its own entry, else the default that a GPU the slice meets later gets;
        for a limits-only slice, the limits file's strictest."""
        if self.snapshot is None:
            return self.hub_limits
        d = self.device(uuid)
        return d.limit if d else self.snapshot.fallback_limit

    def limit_bytes(self, uuid):
        """The memory cap in force on GPU *uuid* (0: none)."""
        limits = self.limits(uuid)
        return limits.memory_limit if limits is not None else 0

    def reported_bytes(self, uuid):
        """What the slice charged itself on GPU *uuid* (its device ``memory_used``)."""
        d = self.device(uuid)
        return d.memory_used if d else 0

    @property
    def limits_trusted(self):
        """Whether its limits are not its user's word: a limits file is in force
        (the hub's), or the slice file is the agent's own user's."""
        if self.snapshot is None:
            return self.hub_limits is not None
        return self.snapshot.limits_file is not None or self.owner_uid == os.geteuid()


@dataclass
class SliceSet:
    """Every slice under the root this interval.

    *readable*: name -> :class:`SliceSeen` with a snapshot; *enforced*: those
    and the limits-only ones (the guard measures these); *by_identity*:
    ``(dev, ino)`` -> SliceSeen, the unreadable ones too (a process that
    names an unreadable slice is not charged elsewhere by mistake);
    *slots*: ``(pid namespace inode, pid there)`` -> ``[(SliceSeen, Slot)]``
    of every live slot naming it: a list, since any user may write a slot
    naming any process into her own file (:mod:`.attribution` keeps the one
    whose file the process's owner owns).
    """

    readable: dict = field(default_factory=dict)
    enforced: dict = field(default_factory=dict)
    by_name: dict = field(default_factory=dict)
    by_identity: dict = field(default_factory=dict)
    slots: dict = field(default_factory=dict)

    def add(self, seen):
        self.by_name[seen.name] = seen
        self.by_identity[seen.identity] = seen
        if seen.enforced:
            self.enforced[seen.name] = seen
        if seen.snapshot is None:
            return
        self.readable[seen.name] = seen
        for slot in seen.snapshot.slots:
            self.slots.setdefault((slot.pid_ns, slot.pid), []).append((seen, slot))


class SliceFiles:
    """The slice files under *root*, kept open between intervals."""

    def __init__(self, root):
        self.root = Path(root)
        self._open = {}  # path -> (identity, limits file present, SliceFile)

    def read(self, errors):
        """A :class:`SliceSet` of now; what cannot be read is appended to *errors*."""
        found = SliceSet()
        try:
            folder = check_folder(self.root)
            entries = list(os.scandir(self.root))
        except UntrustedPath as e:
            errors.append(f"slice root {self.root}: {e}")
            self.close()
            return found
        except OSError as e:
            errors.append(f"slice root {self.root}: {e.strerror or e}")
            self.close()
            return found
        names = {e.name for e in entries}
        kept = set()
        for entry in entries:
            name = entry.name
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue  # not a slice (a hidden name: a creator's temporary file)
            base = name[: -len(SUFFIX)]
            if not valid_name(base):
                continue
            path = self.root / name
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # removed while we looked
            except OSError as e:
                errors.append(f"slice {base}: skipped: {e.strerror or e}")
                continue
            identity = (st.st_dev, st.st_ino)
            try:
                check_file(path, st, folder)
            except UntrustedPath as e:
                seen = SliceSeen(base, path, identity, st.st_uid, error=str(e))
                self._limits_only(seen, base + HAMI_LIMITS_SUFFIX in names, errors)
                found.add(seen)
                continue
            kept.add(path)
            found.add(self._snapshot(path, base, identity, st.st_uid,
                                     base + HAMI_LIMITS_SUFFIX in names, errors))
        for path in set(self._open) - kept:
            self._open.pop(path)[2].close()
        return found

    def _snapshot(self, path, name, identity, owner, limits_present, errors):
        seen = SliceSeen(name, path, identity, owner)
        cached = self._open.get(path)
        if cached is not None and cached[:2] != (identity, limits_present):
            self._open.pop(path)[2].close()
            cached = None
        try:
            if cached is None:
                cached = (identity, limits_present, SliceFile(path))
                self._open[path] = cached
            seen.snapshot = cached[2].snapshot()
        except (SliceFileError, OSError) as e:
            seen.error = str(e) if isinstance(e, SliceFileError) else f"{path}: {e.strerror or e}"
            stale = self._open.pop(path, None)
            if stale is not None:
                stale[2].close()
            self._limits_only(seen, limits_present, errors)
        return seen

    def _limits_only(self, seen, limits_present, errors):
        """*seen*, whose file cannot be read or trusted: held to its limits file's
        strictest cap when it has one (see the module), said in *errors*."""
        limits = None
        if limits_present:
            try:
                found = read_limits_file(seen.path)
                limits = found.strictest() if found is not None else None
            except (SliceFileError, OSError) as e:  # UntrustedPath included
                errors.append(f"slice {seen.name}: its limits file cannot be read either: {e}")
        seen.hub_limits = limits
        if limits is not None:
            errors.append(f"slice {seen.name}: cannot be read ({seen.error}): its user's processes are held "
                          "to the cap of its limits file, as processes without the preload library")
        else:
            errors.append(f"slice {seen.name}: cannot be read ({seen.error}), and no limits file says its cap: "
                          "its user's processes are not held to one")

    def close(self):
        for _, _, sf in self._open.values():
            sf.close()
        self._open.clear()
