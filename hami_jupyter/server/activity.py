"""Each kernel's activity, published in its registry entry for the node's memory broker.

The broker (``hami-jupyter broker``, a root service) parks idle kernels of
any user to make GPU room for another's work; it must never park one whose
user is at work. Its processes' driver calls say when a kernel last used the
GPU, but not when it last ran a cell or got a message: a cell computing on
the CPU, or waiting for input, calls no driver at all. This server knows:
jupyter_server keeps each kernel's ``last_activity`` (its latest message)
and ``execution_state`` (``busy`` while a cell runs). So once a second, for
each kernel of this server in a slice, it writes both into the kernel's
registry entry (:func:`hami_jupyter.slice.registry.record_activity`:
replaced whole, atomically) when they changed: at most one write a second
per kernel, none while nothing happens. The same write keeps the entry's
notebook current (its session's path, :mod:`.sessions`): a notebook renamed
after its kernel started is listed under its new name everywhere.
"""

from datetime import timezone

from ..provisioning.provisioner import HamiProvisioner
from ..slice import registry
from .periodic import Periodic
from .sessions import kernel_notebooks

INTERVAL_S = 1.0


class ActivityPublisher(Periodic):
    """Publishes the activity of *serverapp*'s kernels (see the module docstring)."""

    interval = INTERVAL_S
    what = "publishing kernel activity"

    def __init__(self, serverapp):
        super().__init__(serverapp)
        self._written = {}  # kernel id -> (last_activity_unix, busy, notebook) last written
        self._failed = set()  # kernels whose entry could not be written: said once

    def _activity(self, kernel):
        """``(last activity in Unix seconds, busy)`` of a kernel manager's kernel."""
        last = getattr(kernel, "last_activity", None)
        if last is None:
            stamp = 0.0
        else:
            if last.tzinfo is None:
                last = last.replace(tzinfo=timezone.utc)  # jupyter_server's times are UTC
            stamp = last.timestamp()
        return stamp, getattr(kernel, "execution_state", None) == "busy"

    def publish(self):
        """One look at every kernel; writes what changed."""
        manager = self.serverapp.kernel_manager
        ids = set(manager.list_kernel_ids())
        notebooks = kernel_notebooks(getattr(self.serverapp, "session_manager", None))
        for kernel_id in sorted(ids):
            try:
                kernel = manager.get_kernel(kernel_id)
            except KeyError:
                continue  # shut down meanwhile
            provisioner = getattr(kernel, "provisioner", None)
            path = provisioner.slice_path if isinstance(provisioner, HamiProvisioner) else None
            if path is None:
                continue  # not in a slice: nothing the broker parks
            now = (*self._activity(kernel), notebooks.get(kernel_id))
            if self._written.get(kernel_id) == now:
                continue
            try:
                if registry.record_activity(path, kernel_id, *now):
                    self._written[kernel_id] = now
            except OSError as e:
                if kernel_id not in self._failed:
                    self._failed.add(kernel_id)
                    self.log.warning("hami-jupyter: cannot record kernel %s's activity for the memory "
                                     "broker in %s: %s", kernel_id, registry.registry_dir(path), e)
        for gone in set(self._written) - ids:
            del self._written[gone]
        self._failed &= ids

    def tick(self):
        self.publish()
