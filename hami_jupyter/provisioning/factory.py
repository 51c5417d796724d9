"""Under JupyterHub, every kernel of the server starts through ``hami-provisioner``.

A kernelspec picks its provisioner (``metadata.kernel_provisioner``); most
name none and get jupyter_client's default, ``local-provisioner``, which
starts the kernel with no preload library at all: the default ``python3``
kernel of a hub-started server would run outside the user's slice. When the
hub manages the server's slice (``HAMI_HUB_SLICE``, see
:mod:`.hub_slice`), the server extension installs
:class:`HubSliceProvisionerFactory` as jupyter_client's provisioner factory
(a singleton every ``KernelManager`` asks): it gives every kernelspec,
whatever provisioner it names or none, ``hami-provisioner``, which starts
the kernel in the hub's slice.
"""

from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets import default

from .kernelspec import PROVISIONER


class HubSliceProvisionerFactory(KernelProvisionerFactory):
    """jupyter_client's factory, with ``hami-provisioner`` for every kernelspec."""

    @default("default_provisioner_name")
    def _default_provisioner_name_default(self):
        return PROVISIONER

    def _get_provisioner_config(self, kernel_spec):
        found = super()._get_provisioner_config(kernel_spec)
        if found.get("provisioner_name") == PROVISIONER:
            return found
        named = (kernel_spec.metadata.get("kernel_provisioner") or {}).get("provisioner_name")
        if named:
            self.log.info("hami-jupyter: kernelspec %r names provisioner %r; under JupyterHub "
                          "it starts through %s, in the hub's slice",
                          getattr(kernel_spec, "display_name", "?"), named, PROVISIONER)
        # Another provisioner's config is not ours: the kernel gets the server's settings.
        return {"provisioner_name": PROVISIONER, "config": {}}


def route_every_kernel(parent=None):
    """Make :class:`HubSliceProvisionerFactory` the factory every
    ``KernelManager`` gets (``KernelProvisionerFactory.instance()``), in place
    of one made already; return it. *parent*: the server app (its config)."""
    current = KernelProvisionerFactory._instance
    if current is not None and not isinstance(current, HubSliceProvisionerFactory):
        KernelProvisionerFactory.clear_instance()
    factory = HubSliceProvisionerFactory.instance(parent=parent)
    factory.default_provisioner_name = PROVISIONER
    return factory


def stop_routing():
    """Undo :func:`route_every_kernel` (jupyter_client's own factory comes back)."""
    if isinstance(KernelProvisionerFactory._instance, HubSliceProvisionerFactory):
        HubSliceProvisionerFactory.clear_instance()  # its own class's and jupyter_client's
