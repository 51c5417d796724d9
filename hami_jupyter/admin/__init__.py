"""Administration of the slices on a host: a notebook panel and CLI commands.

``from hami_jupyter.admin import AdminPanel; AdminPanel()`` in a notebook
shows every GPU and slice and lets an administrator change limits live;
``hami-jupyter slice list|set`` does the same from a shell. Both go through
:mod:`.changes` (checks, applying) and :mod:`hami_jupyter.audit` (the log of
changes).
Under JupyterHub with the hub service, ``AdminPanel()`` shows the whole hub
instead (:mod:`.hub_client` reaches the service, :mod:`.hub_view` draws it,
:mod:`.sparkline` its charts).

:class:`AdminPanel` is imported on first use, so the CLI does not pay for
ipywidgets.
"""

__all__ = ["AdminPanel"]


def __getattr__(name):
    if name == "AdminPanel":
        from .panel import AdminPanel

        return AdminPanel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
