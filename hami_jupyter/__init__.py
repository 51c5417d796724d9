"""hami-jupyter: GPU sharing for Jupyter.

Kernels of one user (or group) share a *slice* of each NVIDIA GPU: a memory
cap and a compute share, enforced by a preload library inside every kernel
process and coordinated through one slice file per slice.
"""

__version__ = "0.1.0.dev0"


def _jupyter_server_extension_points():
    """Jupyter Server finds the extension (:mod:`hami_jupyter.server`) here."""
    return [{"module": "hami_jupyter.server"}]
