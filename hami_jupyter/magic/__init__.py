"""``%hami``: a kernel's slice, from inside the kernel.

- :mod:`.magics`: the ``%hami`` line magic (status, watch, release);
- :mod:`.watch`: ``%hami watch``, a widget that refreshes itself;
- :mod:`.release`: ``%hami release``, framework caches back to the slice.

``%load_ext hami_jupyter.magic`` (what the ``hami-python3`` kernelspec does)
loads it. Only kernels import this package: it needs IPython.
"""

from .magics import load_ipython_extension, unload_ipython_extension

__all__ = ["load_ipython_extension", "unload_ipython_extension"]
