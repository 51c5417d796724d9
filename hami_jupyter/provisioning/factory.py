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

This rests on jupyter_client's private API: the factory's
``_get_provisioner_config`` and its singleton. pyproject.toml pins the
jupyter_client versions tested; and because a change there would let
kernelspecs naming ``local-provisioner`` silently leave the hub's slice,
:func:`route_every_kernel` proves the rule holds (:func:`check_routing`: the
factory a ``KernelManager`` gets makes ``hami-provisioner`` for a kernelspec
naming ``local-provisioner`` and for one naming none) and raises
:class:`RoutingError` otherwise; the server then starts no kernel at all.
"""

import re
from importlib import metadata

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets import default

from .kernelspec import PROVISIONER

HOOK = "_get_provisioner_config"  # jupyter_client's private method this rests on


class RoutingError(RuntimeError):
    """The hub's rule (every kernel through ``hami-provisioner``) is not in force."""


class HubSliceProvisionerFactory(KernelProvisionerFactory):
    """jupyter_client's factory, with ``hami-provisioner`` for every kernelspec."""

    routes_every_kernel = True  # what the provisioner asks (it must not import this module)

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


def supported_jupyter_client():
    """The jupyter_client versions this hami-jupyter is tested with, as its
    package metadata pins them (``jupyter_client<9,>=8.10``)."""
    try:
        for requirement in metadata.requires("hami-jupyter") or []:
            if re.match(r"jupyter[-_]client\b", requirement, re.IGNORECASE):
                return requirement.split(";")[0].strip()
    except metadata.PackageNotFoundError:
        pass
    return "jupyter_client 8"


def _installed():
    try:
        return f"jupyter_client {metadata.version('jupyter_client')}"
    except metadata.PackageNotFoundError:
        return "this jupyter_client"


def check_routing():
    """RoutingError unless the provisioner factory a ``KernelManager`` gets
    starts a kernelspec naming ``local-provisioner``, and one naming no
    provisioner, through ``hami-provisioner``. Asks jupyter_client's public
    ``create_provisioner_instance``, as a ``KernelManager`` does; nothing starts."""
    from .provisioner import HamiProvisioner

    factory = KernelProvisionerFactory.instance()
    if not isinstance(factory, HubSliceProvisionerFactory):
        raise RoutingError(f"{_installed()} did not take hami-jupyter's provisioner factory (it "
                           f"uses {type(factory).__module__}.{type(factory).__name__})")
    for named in ("local-provisioner", None):
        stanza = {"kernel_provisioner": {"provisioner_name": named}} if named else {}
        spec = KernelSpec(argv=["python"], display_name="hami-jupyter routing check",
                          language="python", metadata=stanza)
        what = f"a kernelspec naming {named}" if named else "a kernelspec naming no provisioner"
        try:
            made = factory.create_provisioner_instance("hami-routing-check", spec, parent=None)
        except Exception as e:  # any failure: the rule cannot be shown to hold
            raise RoutingError(f"{_installed()} failed to make a provisioner for {what}: "
                               f"{type(e).__name__}: {e}") from None
        if not isinstance(made, HamiProvisioner):
            raise RoutingError(f"{_installed()} ignores hami-jupyter's provisioner factory: {what} "
                               f"would start through {type(made).__name__}, outside the slice")


def route_every_kernel(parent=None):
    """Make :class:`HubSliceProvisionerFactory` the factory every
    ``KernelManager`` gets (``KernelProvisionerFactory.instance()``), in place
    of one made already, and prove it works (:func:`check_routing`); return
    it. *parent*: the server app (its config). RoutingError, with
    jupyter_client's own factory back in place, when the rule cannot hold."""
    if not callable(getattr(KernelProvisionerFactory, HOOK, None)):
        raise RoutingError(f"{_installed()} has no KernelProvisionerFactory.{HOOK}, where "
                           f"hami-jupyter sends every kernelspec through {PROVISIONER}")
    current = KernelProvisionerFactory._instance
    if current is not None and not isinstance(current, HubSliceProvisionerFactory):
        KernelProvisionerFactory.clear_instance()
    factory = HubSliceProvisionerFactory.instance(parent=parent)
    if isinstance(factory, HubSliceProvisionerFactory):  # else check_routing says so
        factory.default_provisioner_name = PROVISIONER
    try:
        check_routing()
    except RoutingError:
        stop_routing()  # a factory that half works would break even the kernelspec list
        raise
    return factory


def routing_in_force():
    """Whether :func:`route_every_kernel` is in force in this process (the
    provisioner asks the factory in use the same, by its routes_every_kernel)."""
    return isinstance(KernelProvisionerFactory._instance, HubSliceProvisionerFactory)


def stop_routing():
    """Undo :func:`route_every_kernel` (jupyter_client's own factory comes back)."""
    if isinstance(KernelProvisionerFactory._instance, HubSliceProvisionerFactory):
        HubSliceProvisionerFactory.clear_instance()  # its own class's and jupyter_client's
