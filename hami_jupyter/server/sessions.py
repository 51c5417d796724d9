"""Which notebook each kernel of this server serves: its Jupyter session's path.

People tell kernels apart by their notebooks, as JupyterLab's Running panel
does, not by ids. jupyter_server's session manager knows each session's path
and kernel; this reads them, so the REST answers name this server's kernels by
the notebook, and the activity publisher keeps the name in the kernel's
registry entry current (a notebook renamed after its kernel started), where
other processes (``%hami status`` in another kernel, ``hami-jupyter status``,
the hub view) read it.

A kernel with several sessions (a notebook and a console on one kernel) is
named by its notebook; one without any (started over ``api/kernels``) has no
name here.
"""

import sqlite3

# Session types in the order a kernel is named by: JupyterLab's own kinds.
_PREFERRED = ("notebook", "console", "file")


def kernel_notebooks(session_manager):
    """``{kernel_id: session path}`` of the server's sessions now; {} when the
    session manager cannot say (none, or its table cannot be read)."""
    cursor = getattr(session_manager, "cursor", None)
    if cursor is None:
        return {}
    try:
        rows = cursor.execute("SELECT kernel_id, path, type FROM session").fetchall()
    except sqlite3.Error:
        return {}
    ranked = {}
    for kernel_id, path, kind in rows:
        if not kernel_id or not isinstance(path, str) or not path:
            continue
        rank = _PREFERRED.index(kind) if kind in _PREFERRED else len(_PREFERRED)
        if kernel_id not in ranked or rank < ranked[kernel_id][0]:
            ranked[kernel_id] = (rank, path)
    return {kernel_id: path for kernel_id, (_, path) in ranked.items()}
