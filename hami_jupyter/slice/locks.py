"""Open-file-description locks, as the slice file's contract uses them.

A process owns a slot while an open file description holds an OFD write lock
on the slot's first byte; writers of a limits block (and of the audit log)
take turns through one on the block's first byte. The kernel drops such a
lock when its holder dies, whatever PID namespace it ran in, so no lock here
can outlive a dead process (docs/slice-file.md, "Rules").
"""

import fcntl
import os
import struct
import time

# Linux fcntl commands for OFD locks (<asm-generic/fcntl.h>). Python exposes
# them when it was built against headers that have them; the numbers are
# fixed by the kernel ABI either way.
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)

# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (then 4 bytes of padding, which the kernel writes
# into the 1024-byte buffer fcntl() passes, so the short pack is safe).
# OFD commands require l_pid == 0.
_FLOCK = "hhqqi"


class LockTimeout(OSError):
    """Another holder kept the lock longer than the caller would wait."""


def flock_bytes(lock_type, start, length=1):
    """A ``struct flock`` for an OFD lock command on bytes [start, start+length)."""
    return struct.pack(_FLOCK, lock_type, os.SEEK_SET, start, length, 0)


def write_locked(fd, offset):
    """True when some open file description holds a write lock on byte *offset*.

    Asking about a read lock conflicts only with write locks, and works on a
    read-only descriptor; being a separate open file description, *fd* also
    sees locks other descriptors of this very process hold. Never blocks.
    """
    answer = fcntl.fcntl(fd, F_OFD_GETLK, flock_bytes(fcntl.F_RDLCK, offset))
    return struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK


def lock_byte(fd, offset, wait_s, poll_s=0.002):
    """Take an OFD write lock on byte *offset* of *fd*, trying for up to *wait_s*
    seconds; :class:`LockTimeout` after that. Closing *fd* drops it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, flock_bytes(fcntl.F_WRLCK, offset))
            return
        except OSError:
            if time.monotonic() > deadline:
                raise LockTimeout(f"the lock was held for over {wait_s:g} s") from None
            time.sleep(poll_s)
