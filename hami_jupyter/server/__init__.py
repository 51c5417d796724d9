"""The hami-jupyter Jupyter Server extension: slice usage over REST and Prometheus.

Enabled by ``jupyter-config/jupyter_server_config.d/hami_jupyter.json``
(installed into ``etc/jupyter/jupyter_server_config.d/``). It adds

- ``{base_url}hami/v1/slices`` and ``{base_url}hami/v1/kernels/<kernel_id>``
  (:mod:`.handlers`), under the server's base URL so they work behind
  JupyterHub (``/user/<name>/``);
- the slices' gauges on the server's ``{base_url}metrics`` (:mod:`.metrics`).
"""

from jupyter_server.utils import url_path_join

from . import metrics
from .handlers import KernelHandler, SlicesHandler

# Any id reaches the handler, so an unknown one gets its JSON 404, not a page.
_KERNEL_ID = r"(?P<kernel_id>[^/]+)"


def _load_jupyter_server_extension(serverapp):
    web_app = serverapp.web_app
    api = url_path_join(web_app.settings["base_url"], "hami", "v1")
    web_app.add_handlers(".*$", [
        (url_path_join(api, "slices"), SlicesHandler),
        (url_path_join(api, "kernels", _KERNEL_ID), KernelHandler),
    ])
    metrics.attach(serverapp)
    serverapp.log.info("hami-jupyter: slice API at %s", api)
