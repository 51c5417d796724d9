"""The ``hami-jupyter`` command: :mod:`.cli` parses and dispatches; :mod:`.doctor`
checks a host's set-up; :mod:`.demo` runs the quick-start notebook in a slice.
The administrators' commands (``slice``, ``audit``, ``admin-service``) are
:mod:`hami_jupyter.admin.cli`'s."""
