"""The slice: one file per slice that every process of it and every tool meet at.

Everything else in hami_jupyter imports this package, and it imports nothing
of theirs. Its modules, from the contract up:

- :mod:`.layout`: the ctypes mirror of ``native/include/hami/slice_file.h``;
- :mod:`.size`, :mod:`.limits`: sizes as people write them; :class:`~.limits.Limits`,
  the one value type of a limit, and the grammar of every limit setting;
- :mod:`.settings`: the limits that settings ask for (every source; the strictest wins);
- :mod:`.paths`: slice names, the slice root, who may own what (the trust rule);
- :mod:`.locks`: the OFD locks the contract uses;
- :mod:`.file`: reading a slice (and its hub-owned limits file);
- :mod:`.change`, :mod:`.create`: changing limits live; creating slices and limits files;
- :mod:`.registry`: which Jupyter kernels run in a slice;
- :mod:`.status`, :mod:`.status_html`: a slice now, as data, text and HTML.
"""
