"""hami-jupyter's settings in ``jupyter server --help-all`` and ``--generate-config``.

A Jupyter admin looks for a server's settings there, but jupyter_server
prints them from ``ServerApp.classes`` while it parses its command line,
before it even finds its extensions: an extension's configurables never show,
and jupyter_server has no hook that runs earlier. So the wheel installs
``hami_jupyter_server_help.pth``, whose one line imports this module in a
``jupyter-server`` process (and in no other). It only puts a finder in front of
the import system; when ``jupyter_server.serverapp`` has been imported, the
server extension's configurables (:func:`hami_jupyter.server.configurables`)
are appended to ``ServerApp.classes``. Nothing else changes: the extension
loads as before, and any failure here leaves jupyter_server as it was.
"""

import importlib.util
import sys

TARGET = "jupyter_server.serverapp"


def _add_configurables(module):
    try:
        from .server import configurables

        classes = module.ServerApp.classes
        for cls in configurables():
            if cls not in classes:
                classes.append(cls)
    except Exception:  # the help only: never stop the server over it
        pass


class _AfterServerApp:
    """A meta path finder that wraps the loading of ``jupyter_server.serverapp``
    once, to add :func:`_add_configurables` after it."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module):
            load(module)
            _add_configurables(module)

        loader.exec_module = exec_module
        return spec


def install():
    """Put the finder in place, once (a .pth file may be read twice)."""
    if TARGET in sys.modules:
        _add_configurables(sys.modules[TARGET])
    elif not any(isinstance(f, _AfterServerApp) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterServerApp())


install()
