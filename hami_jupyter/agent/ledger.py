"""The room ledger: what the agent has made room for, and keeps free, on each GPU.

NVML's free figure is everyone's. On an H200 a request waited 89 s while
the agent parked ten kernels for it: each park's room was taken by another
session's resume first. So room the agent makes is published as its
requester's, where every preload library (and ``hami-park restore``) looks
before it takes GPU memory on a tight GPU (native/src/room_ledger.c): a
*grant* per answered request, held while the requester's connection stays
open; a *reserve* nothing through the library takes, so that a checkpoint
always has room (an H200's failed at 4 MiB free); whether anyone *waits*
(takers beyond their guarantee then take their turn through the agent); and
whether a process's state *moves* (another process's calls refused as busy
meanwhile wait for it).

The file is ``<socket folder>/room.ledger`` (``/run/hami-jupyter/room.ledger``
under a hub), its layout :class:`~hami_jupyter.slice.layout.HamiRoomLedger`
(the C header is the source of truth), mode 0644, written only by the agent
in place: readers keep their mapping. Each GPU entry is a seqlock (``seq``
odd while written). ``written_unix_ns`` is the agent's heartbeat: a ledger
not written for ``HAMI_LEDGER_STALE_NS`` is not believed, so an agent that
dies stops nobody; one that stops clears it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import stat
import threading
import time

from ..slice.layout import (
    HAMI_LEDGER_MAGIC,
    HAMI_LEDGER_NAME,
    HAMI_LEDGER_VERSION_MAJOR,
    HAMI_LEDGER_VERSION_MINOR,
    LEDGER_SIZE,
    HamiLedgerGpu,
    HamiRoomLedger,
)


class LedgerError(OSError):
    """The ledger file cannot be made or used; the message says why."""


def ledger_path(socket_path):
    """Where the ledger of the broker listening at *socket_path* lies."""
    return os.path.join(os.path.dirname(os.fspath(socket_path)), HAMI_LEDGER_NAME)


class Ledger:
    """The ledger file at *path*, mapped for writing. Thread-safe."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._map = None
        self._view = None
        self._open()

    def _open(self):
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        umask = os.umask(0o022)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise LedgerError(f"cannot open the room ledger {self.path}: {e.strerror or e}") from None
        finally:
            os.umask(umask)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise LedgerError(f"{self.path} is not a file of this agent's own (uid {st.st_uid}): "
                                  "remove it; the agent makes it anew")
            if st.st_mode & 0o7777 != 0o644:
                os.fchmod(fd, 0o644)
            if st.st_size != LEDGER_SIZE:
                os.ftruncate(fd, LEDGER_SIZE)
            self._map = mmap.mmap(fd, LEDGER_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._view = HamiRoomLedger.from_buffer(self._map)
        v = self._view
        if (bytes(v.magic) != HAMI_LEDGER_MAGIC or v.version_major != HAMI_LEDGER_VERSION_MAJOR):
            ctypes.memset(ctypes.addressof(v), 0, LEDGER_SIZE)  # a ledger of another layout: made anew
            v.magic = HAMI_LEDGER_MAGIC
            v.version_major = HAMI_LEDGER_VERSION_MAJOR
            v.file_size = LEDGER_SIZE
        v.version_minor = HAMI_LEDGER_VERSION_MINOR
        v.agent_pid = os.getpid()
        for g in v.gpu:  # grants of an agent before this one were held by its connections: gone
            self._write(g, lambda e: ctypes.memset(ctypes.addressof(e.grant), 0, ctypes.sizeof(e.grant)))

    # ---- one entry, written as a seqlock -----------------------------------------------

    @staticmethod
    def _write(entry, change):
        entry.seq += 1  # odd: readers copy again
        try:
            change(entry)
        finally:
            entry.seq += 1

    def _entry(self, uuid, make=True):
        raw = uuid.encode()
        free = None
        for g in self._view.gpu:
            if g.uuid == raw:
                return g
            if free is None and not g.uuid:
                free = g
        if not make or free is None:
            return None

        def claim(e):
            ctypes.memset(ctypes.addressof(e) + HamiLedgerGpu.uuid.offset, 0,
                          ctypes.sizeof(HamiLedgerGpu) - HamiLedgerGpu.uuid.offset)
            e.uuid = raw
        self._write(free, claim)
        return free

    # ---- what the agent says ---------------------------------------------------------

    def publish(self, uuid, *, reserve, free, waiting, turns, moving_until_ns, now_ns=None):
        """GPU *uuid*'s figures, as of a look just taken (grants are kept)."""
        now_ns = now_ns or time.time_ns()
        with self._lock:
            e = self._entry(uuid)
            if e is None:
                return

            def change(e):
                e.reserve_bytes = reserve
                e.free_bytes = free if free is not None else 0
                e.looked_unix_ns = now_ns
                e.waiting = waiting
                e.turns = 1 if turns else 0
                e.moving_until_unix_ns = moving_until_ns
                self._prune(e, now_ns)
            self._write(e, change)
            self._view.written_unix_ns = now_ns

    def someone_waits(self, uuid, waiting):
        """Say at once that *waiting* requests wait for room on *uuid* (turns
        on): the next look's :meth:`publish` may come after the agent has
        begun to make room, and a resume reading the ledger in between would
        take that room first."""
        with self._lock:
            e = self._entry(uuid)
            if e is None:
                return

            def change(e):
                e.waiting = max(e.waiting, waiting)
                e.turns = 1
            self._write(e, change)

    def heartbeat(self, now_ns=None):
        with self._lock:
            self._view.written_unix_ns = now_ns or time.time_ns()

    def grant(self, uuid, pid, nbytes, lease_s):
        """Keep *nbytes* free on *uuid* for process *pid* for at most *lease_s*:
        its ticket, or None when the GPU has as many grants as it can hold."""
        ticket = secrets.randbits(63) | 1
        now = time.time_ns()
        with self._lock:
            e = self._entry(uuid)
            if e is None:
                return None
            self._prune(e, now)
            slot = next((g for g in e.grant if not g.ticket), None)
            if slot is None:
                return None

            def change(e):
                slot.ticket, slot.bytes, slot.pid = ticket, nbytes, pid
                slot.expires_unix_ns = now + int(lease_s * 1e9)
                e.granted_bytes = sum(g.bytes for g in e.grant if g.ticket)
                e.turns = 1  # a grant is only kept where takers look
            self._write(e, change)
            self._view.written_unix_ns = now
        return ticket

    def revoke(self, uuid, ticket):
        """The grant *ticket* on *uuid* is over (its requester is done)."""
        with self._lock:
            e = self._entry(uuid, make=False)
            if e is None:
                return

            def change(e):
                for g in e.grant:
                    if g.ticket == ticket:
                        ctypes.memset(ctypes.addressof(g), 0, ctypes.sizeof(g))
                e.granted_bytes = sum(g.bytes for g in e.grant if g.ticket)
            self._write(e, change)

    def granted(self, uuid, but=None):
        """Bytes granted on *uuid* now, less the grant *but*."""
        now = time.time_ns()
        with self._lock:
            e = self._entry(uuid, make=False)
            if e is None:
                return 0
            return sum(g.bytes for g in e.grant if g.ticket and g.ticket != but and g.expires_unix_ns > now)

    def grants(self, uuid):
        """``[(pid, bytes)]`` of the live grants on *uuid* (for the report)."""
        now = time.time_ns()
        with self._lock:
            e = self._entry(uuid, make=False)
            if e is None:
                return []
            return [(g.pid, g.bytes) for g in e.grant if g.ticket and g.expires_unix_ns > now]

    @staticmethod
    def _prune(e, now_ns):
        for g in e.grant:
            if g.ticket and g.expires_unix_ns <= now_ns:
                ctypes.memset(ctypes.addressof(g), 0, ctypes.sizeof(g))
        e.granted_bytes = sum(g.bytes for g in e.grant if g.ticket)

    def close(self):
        """The agent stops: nothing it said is believed any more."""
        with self._lock:
            if self._view is None:
                return
            for g in self._view.gpu:
                if g.uuid:
                    self._write(g, lambda e: (setattr(e, "turns", 0), setattr(e, "waiting", 0),
                                              ctypes.memset(ctypes.addressof(e.grant), 0,
                                                            ctypes.sizeof(e.grant)),
                                              setattr(e, "granted_bytes", 0)))
            self._view.written_unix_ns = 0
            self._view = None  # the mapping goes with the process: ctypes views of it may live on
