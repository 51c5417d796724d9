"""The hami-jupyter Jupyter Server extension: slice usage over REST and Prometheus.

Enabled by ``jupyter-config/jupyter_server_config.d/hami_jupyter.json``
(installed into ``etc/jupyter/jupyter_server_config.d/``). It adds

- ``{base_url}hami/v1/slices`` and ``{base_url}hami/v1/kernels/<kernel_id>``
  (:mod:`.handlers`), under the server's base URL so they work behind
  JupyterHub (``/user/<name>/``), and ``.../kernels/<kernel_id>/history``: the
  last minutes of the kernel's slice, which the server records
  (:mod:`.history`) so that the panel's charts outlive a page load;
- ``POST {base_url}hami/v1/kernels/<kernel_id>/park`` and ``.../resume``,
  and parking of idle kernels with its configuration ``c.HamiParking``
  (:mod:`.parking`): a parked kernel's next cell brings its GPU memory back;
- the slices' gauges on the server's ``{base_url}metrics`` (:mod:`.metrics`);
- each kernel's last activity and whether a cell runs, in its kernel registry
  entry, for the node's memory broker (:mod:`.activity`);
- under JupyterHub (``HAMI_HUB_SLICE`` in the server's environment), the
  rule that every kernel runs in the hub's slice: every kernelspec starts
  through ``hami-provisioner``, whatever provisioner it names or none
  (:mod:`hami_jupyter.provisioning.factory`). When this jupyter_client does
  not let the rule hold, the server starts no kernel at all, and says why in
  its log and in the error of every kernel start, rather than let kernels
  run outside the slice.

Its configuration: :class:`.config.SliceDisplay` (the memory levels' thresholds)
and :class:`.parking.HamiParking`.
"""

import os

from jupyter_server.utils import url_path_join
from tornado import web

from ..provisioning import factory
from ..provisioning.hub_slice import HubSliceError, hub_slice
from . import metrics
from .activity import ActivityPublisher
from .config import SliceDisplay
from .handlers import (KernelHandler, KernelHistoryHandler, ParkHandler, ResumeHandler,
                       SlicesHandler)
from .history import HistoryRecorder
from .parking import HamiParking, ParkingManager, parking_connection_class

# Any id reaches the handler, so an unknown one gets its JSON 404, not a page.
_KERNEL_ID = r"(?P<kernel_id>[^/]+)"


def configurables():
    """The extension's settings a server admin sets in ``jupyter_server_config.py``:
    listed by ``jupyter server --help-all`` and ``--generate-config`` (see
    :mod:`hami_jupyter._server_help`)."""
    from ..provisioning.provisioner import HamiProvisioner

    return [HamiProvisioner, SliceDisplay, HamiParking]


def _load_jupyter_server_extension(serverapp):
    web_app = serverapp.web_app
    display = SliceDisplay(parent=serverapp)
    try:
        fractions = display.fractions
    except ValueError as e:
        serverapp.log.error("hami-jupyter: %s; the default thresholds apply", e)
        fractions = SliceDisplay().fractions
    web_app.settings["hami_fractions"] = fractions
    web_app.settings["hami_history"] = HistoryRecorder(
        serverapp, fractions, display.history_interval, display.history_minutes)
    _start_parking(serverapp)
    api = url_path_join(web_app.settings["base_url"], "hami", "v1")
    web_app.add_handlers(".*$", [
        (url_path_join(api, "slices"), SlicesHandler),
        (url_path_join(api, "kernels", _KERNEL_ID), KernelHandler),
        (url_path_join(api, "kernels", _KERNEL_ID, "history"), KernelHistoryHandler),
        (url_path_join(api, "kernels", _KERNEL_ID, "park"), ParkHandler),
        (url_path_join(api, "kernels", _KERNEL_ID, "resume"), ResumeHandler),
    ])
    metrics.attach(serverapp)
    serverapp.log.info("hami-jupyter: slice API at %s", api)
    _route_kernels_under_hub(serverapp)


def _start_parking(serverapp):
    """Parking's manager for this server; its kernels' websockets resume them for their cells."""
    settings = serverapp.web_app.settings
    manager = ParkingManager(serverapp, HamiParking(parent=serverapp))
    settings["hami_parking"] = manager
    base = settings.get("kernel_websocket_connection_class")
    if base is not None and not getattr(base, "parking", None):
        settings["kernel_websocket_connection_class"] = parking_connection_class(base, manager)


async def _start_jupyter_server_extension(serverapp):
    """jupyter_server calls this once its event loop runs: the idle-kernel watcher
    and the activity publisher start."""
    manager = serverapp.web_app.settings.get("hami_parking")
    if manager is not None:
        manager.start()
    serverapp.web_app.settings["hami_activity"] = ActivityPublisher(serverapp).start()
    serverapp.web_app.settings["hami_history"].start()


def _route_kernels_under_hub(serverapp):
    try:
        hub = hub_slice(os.environ)
    except HubSliceError as e:  # the provisioner refuses every kernel with the same message
        hub = os.environ.get("HAMI_HUB_SLICE")
        serverapp.log.error("hami-jupyter: %s; no kernel can start until it names the hub's slice", e)
    if hub is None:
        return
    try:
        factory.route_every_kernel(parent=serverapp)
    except factory.RoutingError as e:
        message = (f"hami-jupyter: JupyterHub gave this server the slice {hub}, but {e}; so that "
                   "no kernel runs outside that slice, this server starts no kernel. The "
                   f"administrator must install a jupyter_client hami-jupyter supports "
                   f"({factory.supported_jupyter_client()}) and restart the server")
        serverapp.log.error(message)
        _refuse_kernels(serverapp, message)
        return
    serverapp.log.info("hami-jupyter: JupyterHub gave this server the slice %s: every kernel runs "
                       "in it, through %s, whatever its kernelspec names", hub,
                       factory.PROVISIONER)


def _refuse_kernels(serverapp, message):
    """Every kernel start of this server fails with *message*: the REST answer
    of ``POST api/kernels`` (and of a new session) carries it as its
    ``message``, which is what JupyterLab shows when a kernel does not start."""
    manager = getattr(serverapp, "kernel_manager", None)
    if manager is None:
        return
    # tornado formats a log message with %: the text must hold none of its own.
    text = message.replace("%", " percent")

    async def start_kernel(*args, **kwargs):
        raise web.HTTPError(500, text)

    manager.start_kernel = start_kernel
