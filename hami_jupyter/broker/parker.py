"""Parking one kernel to make room: every process of it, through ``hami-park``.

The moves are :mod:`hami_jupyter.slice.parking`'s, as for the Jupyter
server's idle parking and an administrator's: each process of the kernel
that holds GPU memory is checkpointed by the driver into host memory; its
next call (its next cell, through the server) brings it back. A kernel whose
state would not fit in host memory beside ``--host-memory-reserve`` is not
parked (the broker then tries the next one), nor is one whose processes could
not bring themselves back (their parking thread does not answer). Each
parked process's slot says why: ``room`` (``park_reason``), which its user
reads in ``%hami status`` and the panel as "parked to make room for another
user's work".
"""

from __future__ import annotations

from ..slice import parking

ROOM = "room"  # the park reason its user sees: "to make room for another user's work"


class Parker:
    """Parks kernels (:class:`~.kernels.Kernel`) keeping *host_reserve* bytes of host memory free."""

    def __init__(self, host_reserve, park_kernel=parking.park_kernel, park_process=parking.park_process):
        self.host_reserve = host_reserve
        self._park_kernel = park_kernel
        self._park_process = park_process

    def park(self, kernel):
        """A :class:`~hami_jupyter.slice.parking.ParkResult`; ParkError saying why not
        (the kernel then runs on, unparked)."""
        if kernel.kernel_id:
            return self._park_kernel(kernel.path, kernel.kernel_id, host_reserve=self.host_reserve,
                                     reason=ROOM)
        return self._park_process(kernel.path, kernel.pids[0], host_reserve=self.host_reserve, reason=ROOM)

    @staticmethod
    def why_not_here():
        """None when this driver can park processes, else why not."""
        return parking.checkpoint_api()
