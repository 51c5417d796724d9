"""``%hami``: the slice of this kernel, from inside the kernel.

Loaded by the ``hami-python3`` kernelspec (``--ext=hami_jupyter.magic``), or
by hand in any IPython with ``%load_ext hami_jupyter.magic`` (the package
:mod:`hami_jupyter.magic` hands this module's extension hooks on). Loading
costs next to nothing: ipywidgets is imported only by ``%hami watch``.

Problems a user can fix (no slice, a missing or damaged slice file, a typo)
are one line of advice, never a traceback: the magic is what people run when
something already went wrong.
"""

import argparse
import json
import os
import shlex
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from ..advice import advice as slice_advice
from ..slice.file import SliceFileError
from ..slice.paths import SliceNameError, slice_path
from ..slice.status import format_text, slice_status
from ..slice.status_html import format_html

USAGE = """\
Usage: %hami status [--json] [--slice NAME_OR_PATH]
       %hami watch [--interval SECONDS] [--slice NAME_OR_PATH]
       %hami watch stop
       %hami release
`%hami?` explains each."""

NOT_IN_SLICE_REASON = (
    "this kernel is not in a GPU slice ($HAMI_SLICE is not set): it was started with "
    "a kernelspec that does not use the HAMi provisioner, so no GPU limit applies to it. "
    "Pick the \"Python 3 (HAMi vGPU)\" kernel, or look at a slice with --slice NAME_OR_PATH."
)
NOT_IN_SLICE = f"hami: {NOT_IN_SLICE_REASON}"

MIN_INTERVAL = 0.1  # seconds; faster only floods the frontend with widget updates
MAX_INTERVAL = 3600.0


def advice(error, path):
    """One line saying what is wrong with the slice at *path* and what to do."""
    return f"hami: {slice_advice(error, path)}"


class _Parser(argparse.ArgumentParser):
    """argparse that reports mistakes as IPython usage errors instead of exiting."""

    def error(self, message):
        raise UsageError(f"{message}\n{USAGE}")


SUBCOMMANDS = ("status", "watch", "release")


def _parser():
    parser = _Parser(prog="%hami", add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    status = sub.add_parser("status", add_help=False)
    status.add_argument("--json", action="store_true")
    status.add_argument("--slice")
    watch = sub.add_parser("watch", add_help=False)
    watch.add_argument("action", nargs="?", choices=["stop"])
    watch.add_argument("--interval", type=float, default=1.0)
    watch.add_argument("--slice")
    sub.add_parser("release", add_help=False)
    return parser


_PARSER = _parser()


def _show_json(data):
    """*data* as JSON: rich (application/json) and as text ``json.loads`` reads back."""
    display({"application/json": data, "text/plain": json.dumps(data, indent=2)}, raw=True)


def _slice_file(ref, as_json=False):
    """Path of the slice named by *ref* or ``$HAMI_SLICE``; None (after advice) if none.

    Outside a slice, *as_json* shows ``{"in_slice": false, "reason": ...}``
    instead of the prose: a program reading the JSON gets JSON either way."""
    ref = ref or os.environ.get("HAMI_SLICE")
    if not ref:
        if as_json:
            _show_json({"in_slice": False, "reason": NOT_IN_SLICE_REASON})
        else:
            print(NOT_IN_SLICE)
        return None
    try:
        return slice_path(ref)
    except SliceNameError as e:
        print(advice(e, ref), file=sys.stderr)
        return None


def _read(path):
    """The slice's status, or None after printing advice."""
    try:
        return slice_status(path)
    except (OSError, SliceFileError) as e:
        print(advice(e, path), file=sys.stderr)
        return None


@magics_class
class HamiMagics(Magics):
    """The ``%hami`` line magic; see :meth:`hami`."""

    @line_magic
    def hami(self, line):
        """Show this kernel's GPU slice, watch it live, or give cached memory back.

        A slice is a GPU memory cap and a compute (SM) share per GPU, shared by
        every kernel started in it (by default, all of one user's kernels).

        %hami status [--json] [--slice NAME_OR_PATH]
            For each GPU the slice uses: memory used / cap with a bar, the SM
            share and the SM utilization right now; then the slice's kernels
            and their processes with what each uses. From 80 % of the memory
            cap a warning, from 95 % critical (what is left, and that a larger
            allocation is refused; over the cap, that every new one is).
            Shown as a table in JupyterLab and as text in a terminal.
            --json displays the same data as JSON (application/json); its
            text/plain form is exactly ``json.dumps(status, indent=2)``, so
            ``json.loads`` reads it back. Nothing is printed to stdout. Its
            "in_slice" is true; in a kernel outside any slice (and without
            --slice) the JSON is {"in_slice": false, "reason": "..."}.
            --slice looks at another slice: a name under the slice root, or
            a path to a slice file.

        %hami watch [--interval SECONDS] [--slice NAME_OR_PATH]
            The status as a live widget, refreshed every SECONDS (default 1,
            0.1 to 3600) while the kernel keeps working, also while a cell
            runs. Press its Stop button, or:

        %hami watch stop
            Stops every watch of this kernel.

        %hami release
            Returns the memory that PyTorch and CuPy keep cached for reuse to
            the slice (only frameworks already imported; nothing is imported),
            after a garbage collection, and shows what each step freed.

        The slice is the one in $HAMI_SLICE, which the HAMi kernelspec sets.
        In a kernel started otherwise, %hami says so (load it there with
        ``%load_ext hami_jupyter.magic``). A missing or damaged slice file is
        reported in one line with what to do. Reading a slice never waits for
        its kernels: about 0.2 ms, a few ms with hundreds of processes.
        """
        try:
            words = shlex.split(line)
        except ValueError as e:  # an unclosed quote
            raise UsageError(f"{e}\n{USAGE}") from None
        if words and words[0] not in SUBCOMMANDS:
            raise UsageError(f"unknown subcommand {words[0]!r}\n{USAGE}")
        args = _PARSER.parse_args(words)
        if args.command is None:
            print(USAGE)
        elif args.command == "status":
            self._status(args)
        elif args.command == "watch":
            self._watch(args)
        else:
            self._release()

    @staticmethod
    def _status(args):
        path = _slice_file(args.slice, as_json=args.json)
        status = None if path is None else _read(path)
        if status is None:
            return
        if args.json:
            _show_json({"in_slice": True, **status})
        else:
            display({"text/plain": format_text(status),
                     "text/html": format_html(status, os.environ.get("HAMI_KERNEL_ID"))},
                    raw=True)

    @staticmethod
    def _watch(args):
        from . import watch  # imports ipywidgets: only when asked for

        if args.action == "stop":
            print(f"hami: stopped {watch.stop_all()} watch(es)")
            return
        if not MIN_INTERVAL <= args.interval <= MAX_INTERVAL:  # also refuses nan
            raise UsageError(f"--interval must be {MIN_INTERVAL} to {MAX_INTERVAL:g} seconds\n{USAGE}")
        path = _slice_file(args.slice)
        if path is not None:
            view = watch.start(path, args.interval, os.environ.get("HAMI_KERNEL_ID"))
            display(view.widget)

    @staticmethod
    def _release():
        from .release import release

        print(release().text())


def load_ipython_extension(ipython):
    ipython.register_magics(HamiMagics)


def unload_ipython_extension(ipython):
    watch_module = sys.modules.get(f"{__package__}.watch")
    if watch_module is not None:
        watch_module.stop_all()
