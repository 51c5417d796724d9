"""``hami-jupyter hub-service``: one view of every node, GPU, slice and kernel of a hub.

A JupyterHub service built on what the hub already knows, with no store of
its own: the Hub REST API lists the running servers (:mod:`.hub_api`), each
server's extension tells its node, GPUs and slices (``hami/v1/slices``, read
through the proxy: :mod:`.servers`), and :mod:`.document` puts them in order
by node and GPU. :mod:`.history` keeps the last minutes for charts,
:mod:`.actions` does what administrators ask (kernels, servers, slices),
:mod:`.handlers` answers HTTP, :mod:`.metrics` speaks Prometheus, and
:mod:`.app` holds the settings and the refresh loop. docs/hub-view.md has
the whole story; the admin panel (:mod:`hami_jupyter.admin`) is its front end.
"""
