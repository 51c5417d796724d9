"""The hami-jupyter Jupyter Server extension: slice usage over REST and Prometheus.

Enabled by ``jupyter-config/jupyter_server_config.d/hami_jupyter.json``
(installed into ``etc/jupyter/jupyter_server_config.d/``). It adds

- ``{base_url}hami/v1/slices`` and ``{base_url}hami/v1/kernels/<kernel_id>``
  (:mod:`.handlers`), under the server's base URL so they work behind
  JupyterHub (``/user/<name>/``);
- the slices' gauges on the server's ``{base_url}metrics`` (:mod:`.metrics`);
- under JupyterHub (``HAMI_HUB_SLICE`` in the server's environment), the
  rule that every kernel runs in the hub's slice: every kernelspec starts
  through ``hami-provisioner``, whatever provisioner it names or none
  (:mod:`hami_jupyter.provisioning.factory`).

Its configuration is :class:`.config.SliceDisplay` (the memory levels' thresholds).
"""

import os

from jupyter_server.utils import url_path_join

from ..provisioning import factory
from ..provisioning.hub_slice import HubSliceError, hub_slice
from . import metrics
from .config import SliceDisplay
from .handlers import KernelHandler, SlicesHandler

# Any id reaches the handler, so an unknown one gets its JSON 404, not a page.
_KERNEL_ID = r"(?P<kernel_id>[^/]+)"


def _load_jupyter_server_extension(serverapp):
    web_app = serverapp.web_app
    display = SliceDisplay(parent=serverapp)
    try:
        fractions = display.fractions
    except ValueError as e:
        serverapp.log.error("hami-jupyter: %s; the default thresholds apply", e)
        fractions = SliceDisplay().fractions
    web_app.settings["hami_fractions"] = fractions
    api = url_path_join(web_app.settings["base_url"], "hami", "v1")
    web_app.add_handlers(".*$", [
        (url_path_join(api, "slices"), SlicesHandler),
        (url_path_join(api, "kernels", _KERNEL_ID), KernelHandler),
    ])
    metrics.attach(serverapp)
    serverapp.log.info("hami-jupyter: slice API at %s", api)
    _route_kernels_under_hub(serverapp)


def _route_kernels_under_hub(serverapp):
    try:
        hub = hub_slice(os.environ)
    except HubSliceError as e:  # the provisioner refuses every kernel with the same message
        hub = os.environ.get("HAMI_HUB_SLICE")
        serverapp.log.error("hami-jupyter: %s; no kernel can start until it names the hub's slice", e)
    if hub is None:
        return
    factory.route_every_kernel(parent=serverapp)
    serverapp.log.info("hami-jupyter: JupyterHub gave this server the slice %s: every kernel runs "
                       "in it, through %s, whatever its kernelspec names", hub,
                       factory.PROVISIONER)
