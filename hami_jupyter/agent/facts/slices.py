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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ...slice.file import SliceFile, SliceFileError
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

    def device(self, uuid):
        """The snapshot's entry for GPU *uuid*, or None when the slice has not met it."""
        for d in self.snapshot.devices if self.snapshot else ():
            if d.uuid == uuid:
                return d
        return None

    def limit_bytes(self, uuid):
        """The memory cap in force on GPU *uuid* (0: none): its own entry, else the
        default that a GPU the slice meets later gets."""
        d = self.device(uuid)
        return (d.limit if d else self.snapshot.fallback_limit).memory_limit

    def reported_bytes(self, uuid):
        """What the slice charged itself on GPU *uuid* (its device ``memory_used``)."""
        d = self.device(uuid)
        return d.memory_used if d else 0

    @property
    def limits_trusted(self):
        """Whether its limits are not its user's word: a limits file is in force
        (the hub's), or the slice file is the agent's own user's."""
        if self.snapshot is None:
            return False
        return self.snapshot.limits_file is not None or self.owner_uid == os.geteuid()

    def limits(self, uuid):
        """The :class:`~hami_jupyter.slice.limits.Limits` in force on GPU *uuid*."""
        d = self.device(uuid)
        return d.limit if d else self.snapshot.fallback_limit


@dataclass
class SliceSet:
    """Every slice under the root this interval.

    *readable*: name -> :class:`SliceSeen` with a snapshot; *by_identity*:
    ``(dev, ino)`` -> SliceSeen, the unreadable ones too (a process that
    names an unreadable slice is not charged elsewhere by mistake);
    *slots*: ``(pid namespace inode, pid there)`` -> ``[(SliceSeen, Slot)]``
    of every live slot naming it: a list, since any user may write a slot
    naming any process into her own file (:mod:`.attribution` keeps the one
    whose file the process's owner owns).
    """

    readable: dict = field(default_factory=dict)
    by_name: dict = field(default_factory=dict)
    by_identity: dict = field(default_factory=dict)
    slots: dict = field(default_factory=dict)

    def add(self, seen):
        self.by_name[seen.name] = seen
        self.by_identity[seen.identity] = seen
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
                check_file(path, st, folder)
            except FileNotFoundError:
                continue  # removed while we looked
            except OSError as e:  # UntrustedPath included
                errors.append(f"slice {base}: skipped: {e.strerror if e.strerror else e}")
                continue
            identity = (st.st_dev, st.st_ino)
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
            errors.append(f"slice {name}: cannot be read: {seen.error}")
            stale = self._open.pop(path, None)
            if stale is not None:
                stale[2].close()
        return seen

    def close(self):
        for _, _, sf in self._open.values():
            sf.close()
        self._open.clear()
