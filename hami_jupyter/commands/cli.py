"""``hami-jupyter``: the command line.

``status`` shows the slices this user can read (its own slice root's and
the hub's), ``doctor`` checks the set-up,
``kernelspec install|list`` manages kernelspecs of set slice sizes,
``slice list|set|reset`` shows and resizes slices (administrators), ``audit
verify`` checks the audit log, ``admin-service`` applies administrators'
changes as root, ``agent`` is the node's root daemon: it holds memory caps
with the driver's figures (the guard) and makes GPU room for waiting
allocations by parking idle kernels (the memory broker); ``guard`` and
``broker`` are the agent with one of the two on. ``hub-service`` is the
hub-wide view (a JupyterHub service, configured with traitlets: its
arguments go to it untouched), and ``demo``
shows a slice at work. This module only parses arguments and prints;
the work is done by the modules it calls.

Exit status: 0 when all went well, 1 when something failed (a slice that
cannot be read, a failed check), 2 for a usage error (a bad argument), as
argparse does. An expected failure prints one line that says what to do,
never a traceback. Every command's ``--help`` works whatever is installed; a
command that needs an optional extra that is missing (``hub-service``
without JupyterHub) says which to install (``pip install
'hami-jupyter[hub]'``) and exits 1. A slice file another user owns or could change, met
while listing every slice, is skipped with a warning (see
:mod:`hami_jupyter.slice.paths`); the others still show.
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from .. import __version__
from ..admin.cli import add_audit_commands, add_slice_commands
from ..advice import advice
from ..provisioning import kernelspec
from ..slice.file import SliceFileError
from ..slice import paths
from ..slice.paths import (
    SliceNameError,
    default_root,
    list_slice_paths,
    skip_message,
    slice_path,
)
from ..slice.status import format_text, slice_status
from . import doctor

PROG = "hami-jupyter"


class UsageError(Exception):
    """Bad arguments (exit status 2); each argument is one problem, told on a line of its own."""


class Failure(Exception):
    """The command could not do its job (exit status 1)."""


# The top-level module of each optional extra's packages (pyproject.toml's
# optional-dependencies), and the extra that brings it.
EXTRAS = {"jupyterhub": "hub", "kubespawner": "kubernetes"}


def missing_extra(error):
    """``(module, extra)`` when *error* (a ModuleNotFoundError) is an optional
    extra's package that is not installed; None for anything else."""
    module = (error.name or "").split(".")[0]
    return (module, EXTRAS[module]) if module in EXTRAS else None


# ---- status -------------------------------------------------------------------


def status_roots(root=None):
    """The slice roots ``status`` lists: *root* alone when given; else this
    user's slice root and, when it is another folder that exists and may be
    listed, the hub's (``/run/hami-jupyter``), where a hub keeps every user's."""
    if root:
        return [Path(root)]
    roots = [default_root()]
    hub = paths.HUB_ROOT
    if (os.path.realpath(hub) != os.path.realpath(roots[0]) and hub.is_dir()
            and os.access(hub, os.R_OK | os.X_OK)):
        roots.append(hub)
    return roots


def _listed_slices(args, roots):
    """Every slice file under *roots* this user may read; the others are told on stderr."""
    paths, found_any = [], False
    for root in roots:
        skipped = []
        found = list_slice_paths(root, skipped=skipped)
        for skipped_path, error in skipped:  # another user's or unsafe: shown, never read
            print(f"{args.cli_prog}: warning: {skip_message(skipped_path, error)}", file=sys.stderr)
        # Other users' slices in a shared root (the hub's): theirs, not a fault.
        others = [p for p in found if doctor.not_yours(p)]
        if others:
            print(f"{args.cli_prog}: note: skipped {len(others)} slice(s) of other users under "
                  f"{root}, which you cannot read: {', '.join(p.stem for p in others)}",
                  file=sys.stderr)
        paths += [p for p in found if p not in others]
        found_any = found_any or bool(found or skipped)
    if not found_any and not args.json:
        print(f"no slices under {' or '.join(map(str, roots))}: a slice is created when its "
              "first kernel starts (HAMI_SLICE_ROOT or --root looks elsewhere)")
    return paths


def _status(args):
    root = Path(args.root) if args.root else default_root()
    if args.slices:
        try:
            paths = [slice_path(ref, root=root) for ref in args.slices]
        except SliceNameError as e:
            raise UsageError(str(e)) from None
    else:
        paths = _listed_slices(args, status_roots(args.root))
    shown, failed = [], 0
    for path in paths:
        try:
            shown.append(slice_status(path))
        except (SliceFileError, OSError) as e:
            print(f"{args.cli_prog}: error: {advice(e, path)}", file=sys.stderr)
            failed += 1
    if args.json:
        print(json.dumps(shown, indent=2))
    elif shown:
        print("\n\n".join(format_text(s) for s in shown))
    return 1 if failed else 0


# ---- doctor -------------------------------------------------------------------


def _doctor(args):
    path = None
    if args.slice:
        try:
            path = slice_path(args.slice)
        except SliceNameError as e:
            raise UsageError(str(e)) from None
    checks = doctor.run_checks(path)
    if args.json:
        print(json.dumps([dataclasses.asdict(c) for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.status}  {c.name:<{width}}  {c.detail}")
            if c.advice and c.status != doctor.PASS:
                print(f"      {'':<{width}}  -> {c.advice}")
        counts = {s: sum(c.status == s for c in checks) for s in (doctor.WARN, doctor.FAIL)}
        print(f"\n{counts[doctor.FAIL]} failed, {counts[doctor.WARN]} warning(s), "
              f"{len(checks) - sum(counts.values())} passed")
    return 1 if any(c.status == doctor.FAIL for c in checks) else 0


# ---- kernelspec ---------------------------------------------------------------


def _kernelspec_install(args):
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        dest = kernelspec.install(args.name, args.display_name, memory=args.memory, sm=args.sm,
                                  mode=args.mode, slice=args.slice, user=not prefix,
                                  prefix=prefix)
    except kernelspec.KernelspecError as e:
        raise UsageError(*e.problems) from None
    except OSError as e:
        raise Failure(f"cannot install into {e.filename or 'the kernelspec folder'}: "
                      f"{e.strerror or e}; use --user, --sys-prefix or --prefix DIR") from None
    spec = json.loads((dest / "kernel.json").read_text())
    config = spec["metadata"]["kernel_provisioner"]["config"]
    print(f"installed kernelspec {dest.name!r} ({spec['display_name']}) in {dest}")
    print(f"  its kernels get: {kernelspec.describe_config(config)}")
    if not kernelspec.searched(dest):
        print(f"  note: Jupyter does not look in {dest.parent}; add {dest.parent.parent} "
              "to JUPYTER_PATH so that it finds this kernelspec")
    return 0


def _kernelspec_list(args):
    found = kernelspec.hami_kernelspecs()
    if not found:
        print("no HAMi kernelspecs found; `hami-jupyter kernelspec install --name gpu-small "
              "--memory 4g --sm 25` writes one")
        return 0
    for k in found:
        print(f"{k['name']}  {k['display_name']}  ({k['resource_dir']})")
        print(f"  its kernels get: {k['limits']}" if "limits" in k else f"  INVALID: {k['error']}")
    return 1 if any("error" in k for k in found) else 0


# ---- park, resume -------------------------------------------------------------


def _park(args):
    from ..slice import parking
    from ..slice.size import format_size

    try:
        path = parking.find_kernel(args.kernel_id, args.root)
        result = parking.park_kernel(path, args.kernel_id)
    except parking.ParkError as e:
        raise Failure(str(e)) from None
    print(f"parked kernel {args.kernel_id}: {format_size(result.bytes)} moved to host memory in "
          f"{result.seconds:.1f} s (processes {', '.join(map(str, result.pids))}); its next CUDA "
          f"call, or `hami-jupyter resume {args.kernel_id}`, brings it back")
    return 0


def _resume(args):
    from ..slice import parking
    from ..slice.size import format_size

    def waiting(why):
        print(f"waiting for {why}...", flush=True)

    try:
        path = parking.find_kernel(args.kernel_id, args.root)
        restored, seconds = parking.resume_kernel(path, args.kernel_id, args.timeout, waiting)
    except parking.ParkError as e:
        raise Failure(str(e)) from None
    if not restored:
        print(f"kernel {args.kernel_id} was not parked: its GPU memory is on the GPU")
    else:
        print(f"resumed kernel {args.kernel_id}: {format_size(restored)} back on the GPU in "
              f"{seconds:.1f} s")
    return 0


# ---- the node agent (agent, guard, broker) -------------------------------------------


def _size_option(flag, value, problems):
    """*value* of option *flag* as bytes; None, with the reason added to
    *problems*, when it is no size."""
    from ..slice.size import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        problems.append(f"{flag}: {e}")
        return None


def _daemon_logging(level):
    """Log lines with their time, at *level*, for the node agent."""
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("hami_jupyter").setLevel(level.upper())


def _guard_act(args, root):
    """``--resume PID`` / ``--end PID``: what an administrator does with a process the agent parked."""
    from ..admin.actions import guard_act  # root here; an administrator through the admin service
    from ..admin import guard_parked as parked

    pid, what = (args.resume, parked.RESUME) if args.resume is not None else (args.end, parked.END)
    try:
        print(guard_act(root, pid, what, audit_path=args.audit_log))
    except parked.ParkedError as e:
        raise Failure(str(e)) from None
    except PermissionError:
        raise Failure(f"may not {what} process {pid}: run it as root (sudo)") from None
    return 0


def _agent(args):
    """``agent`` (both policies), ``guard`` (the guard's alone) and ``broker``
    (the room policy's alone): one program, the policies its options turn on."""
    from ..agent import service

    guard, room = args.command in ("agent", "guard"), args.command in ("agent", "broker")
    problems, options = [], {"guard": guard, "room": room}
    if guard:
        if not 0 < args.interval < 86400:
            problems.append(f"--interval {args.interval:g}: give a number of seconds above 0 (and below a day)")
        options.update(interval=args.interval, action=args.action, once=args.once)
        if args.tolerance is not None:
            options["tolerance"] = _size_option("--tolerance", args.tolerance, problems)
    if room:
        if not 0 <= args.min_idle_seconds < 86400 * 365:
            problems.append(f"--min-idle-seconds {args.min_idle_seconds:g}: give a number of seconds, 0 or more")
        options.update(min_idle=args.min_idle_seconds,
                       host_reserve=_size_option("--host-memory-reserve", args.host_memory_reserve, problems),
                       headroom=_size_option("--headroom", args.headroom, problems),
                       reserve=_size_option("--reserve", args.reserve, problems),
                       socket_path=Path(args.socket) if args.socket else None)
    if problems:
        raise UsageError(*problems)
    _daemon_logging(args.log_level)
    root = Path(args.root) if args.root else default_root()
    if guard and (args.resume is not None or args.end is not None):
        return _guard_act(args, root)
    try:
        return service.main(root, audit_path=args.audit_log, **options)
    except service.AgentStartError as e:
        raise Failure(str(e)) from None


# ---- hub-service ----------------------------------------------------------------


def _hub_service(options):
    from ..hubview.app import main as service_main

    return service_main(options)


# ---- demo ---------------------------------------------------------------------


def _demo(args):
    from . import demo

    return demo.run(args)


# ---- the parser ---------------------------------------------------------------


AGENT_COMMANDS = (
    ("agent", "the node's root agent: the guard and the memory broker in one (root)",
     "Run the node's agent, as root: every interval, read each GPU process's device memory from NVML, "
     "charge it to a slice and act on slices over their cap by memory no cap allowed (the guard); and "
     "listen on <root>/broker.sock (or $HAMI_BROKER_SOCKET) for processes whose allocation within their "
     "slice's limit found no room on the GPU, and park idle kernels of any user to make it (the memory "
     "broker). One program, one socket, one audit writer, one actor: no two decisions race on a process. "
     "Its decisions rest on facts a user cannot write (/proc, NVML, the root-owned limits files); what a "
     "user's slice file says is her claim. Writes <root>/guard.json and <root>/broker.json and appends to "
     "the audit log (docs/guard.md, docs/broker.md)."),
    ("guard", "the agent with the guard alone: park or end processes past their slice's memory cap (root)",
     "The node's agent with the guard's policy alone: every interval, read each GPU process's device "
     "memory from NVML, charge it to a slice (its HAMI_SLICE, its slot in a slice file, or its user's "
     "slice), and act on slices over their cap by memory no cap allowed: park the processes that put them "
     "over (park), end them (kill) or report them (warn). Memory a kernel got within the cap in force when "
     "it got it is never acted on. Writes <root>/guard.json and appends to the audit log. Run it as root, "
     "or run `hami-jupyter agent`, which is this and the broker in one (docs/guard.md)."),
    ("broker", "the agent with the memory broker alone: make GPU room by parking idle kernels (root)",
     "The node's agent with the room policy alone: listen on <root>/broker.sock (or $HAMI_BROKER_SOCKET) "
     "for processes whose allocation within their slice's limit found no room on the GPU, and make room: "
     "park idle kernels of any user on that GPU, the longest idle first, never one active within "
     "--min-idle-seconds or whose slice holds no more than its guarantee, never more than needed. Writes "
     "<root>/broker.json and appends every decision to the audit log. Run it as root, or run "
     "`hami-jupyter agent`, which is this and the guard in one (docs/broker.md)."),
)


def _agent_options(p, guard, room):
    """The options of the agent's commands: the guard's with *guard*, the broker's with *room*."""
    p.add_argument("--root", metavar="DIR",
                   help="slice root (default: HAMI_SLICE_ROOT, /run/hami-jupyter, "
                        "$XDG_RUNTIME_DIR/hami-jupyter, /tmp/hami-jupyter-<uid>)")
    if guard:
        p.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                       help="seconds between looks (default 0.5)")
        p.add_argument("--action", choices=("park", "kill", "warn"), default="park",
                       help="park: move the offending processes' GPU state to host memory, where it "
                            "waits for an administrator (default; kill where the driver cannot park); "
                            "kill: end them; warn: log, audit and report only")
        p.add_argument("--resume", type=int, metavar="PID",
                       help="bring back a process the agent parked (raise its slice's cap first), then exit")
        p.add_argument("--end", type=int, metavar="PID", help="end a process the agent parked, then exit")
        p.add_argument("--tolerance", metavar="SIZE",
                       help="how far past its cap a slice may be before the guard acts, when its "
                            "processes do not set HAMI_CONTEXT_OVERHEAD (default 64m)")
        p.add_argument("--once", action="store_true", help="one look, one report, then exit (no socket)")
    if room:
        p.add_argument("--socket", metavar="PATH",
                       help="where to listen (default: $HAMI_BROKER_SOCKET, else <root>/broker.sock)")
        p.add_argument("--min-idle-seconds", type=float, default=60.0, metavar="SECONDS",
                       help="park only kernels with no GPU activity for this long, as the driver and "
                            "the agent see it (default 60)")
        p.add_argument("--host-memory-reserve", default="2g", metavar="SIZE",
                       help="host memory that must stay available after a park (default 2g): a kernel "
                            "whose GPU state does not fit beside it is not parked")
        p.add_argument("--headroom", default="0", metavar="SIZE",
                       help="keep this much free on each GPU by parking idle kernels (by the same rules) "
                            "before anyone asks, so that a resume or an allocation finds the room at once; "
                            "about one working set, e.g. 8g (default 0: park only when asked)")
        p.add_argument("--reserve", default="256m", metavar="SIZE",
                       help="device memory kept free on each GPU that nothing through the preload library "
                            "takes, so that a park's checkpoint always has room (an H200 refused one at 4 MiB "
                            "free); kept by parking idle kernels when it is short (default 256m)")
    p.add_argument("--audit-log", metavar="FILE", help="audit log (default: <root>/audit.log)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="what the log shows (default info)")


def build_parser(with_demo_options=False):
    """The argument parser. The demo's options are only registered when
    *with_demo_options*: importing the demo is only worth it when it runs."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="GPU sharing for Jupyter: slices of NVIDIA GPUs for kernels.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "status", help="show the slices you can read: yours, and the hub's",
        description="Show the named slices, or every slice you can read under your slice root "
                    "(HAMI_SLICE_ROOT, else /run/hami-jupyter when it exists, else "
                    "$XDG_RUNTIME_DIR/hami-jupyter, else /tmp/hami-jupyter-<uid>) and under the "
                    "hub's, /run/hami-jupyter, when that is another folder you may list. Other "
                    "users' slices you cannot read are skipped with a note; --root shows one "
                    "folder only.")
    p.add_argument("slices", nargs="*", metavar="SLICE",
                   help="slice name (under your slice root) or path (default: all you can read)")
    p.add_argument("--root", metavar="DIR",
                   help="list this folder only (default: your slice root and the hub's)")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per slice")
    p.set_defaults(func=_status, cli_prog=p.prog)

    p = sub.add_parser("doctor", help="check that this host can run kernels in slices",
                       description="Check the driver, the preload library, the provisioner, "
                                   "the kernelspecs, the limit variables and the slices.")
    p.add_argument("--slice", metavar="SLICE", help="check only this slice (name or path)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.set_defaults(func=_doctor, cli_prog=p.prog)

    p = sub.add_parser("kernelspec", help="install or list HAMi kernelspecs")
    ks = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    i = ks.add_parser("install", help="install a kernelspec for one slice size",
                      description="Write a kernelspec whose kernels run in a slice of the "
                                  "given size; unset limits come from the server.")
    i.add_argument("--name", required=True, help="kernelspec name, e.g. gpu-small")
    i.add_argument("--display-name", metavar="TEXT",
                   help='name shown in Jupyter (default e.g. "Python 3 (HAMi vGPU, 4.0 GiB, SM 25 %%)")')
    i.add_argument("--memory", metavar="SIZE", help="GPU memory cap per GPU, e.g. 4g, 4096m")
    i.add_argument("--sm", metavar="PERCENT",
                   help="SM share: a whole percent of each GPU, 1-99; 0 or 100: no share")
    i.add_argument("--mode", metavar="MODE", help="how the SM share is held: hard or elastic")
    i.add_argument("--slice", metavar="SLICE",
                   help='slice name or absolute path (default: "<user>-<name>" when limits are set)')
    where = i.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true",
                       help="install for the current user (the default)")
    where.add_argument("--sys-prefix", action="store_true",
                       help=f"install into this Python environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="DIR", help="install into DIR/share/jupyter/kernels")
    i.set_defaults(func=_kernelspec_install, cli_prog=i.prog)
    li = ks.add_parser("list", help="list the HAMi kernelspecs Jupyter finds, with their limits")
    li.set_defaults(func=_kernelspec_list, cli_prog=li.prog)

    for name, func, text in (("park", _park, "move an idle kernel's GPU memory to host memory"),
                             ("resume", _resume, "bring a parked kernel's GPU memory back")):
        p = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]} "
                           "(docs/parking.md). The kernel is found in the slices under the slice "
                           "root; run this as its user (or root).")
        p.add_argument("kernel_id", metavar="KERNEL_ID", help="the Jupyter kernel's id")
        p.add_argument("--root", metavar="DIR", help="slice root (default: HAMI_SLICE_ROOT, "
                       "/run/hami-jupyter, $XDG_RUNTIME_DIR/hami-jupyter, /tmp/hami-jupyter-<uid>)")
        if name == "resume":
            p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                           help="how long to wait for room (default 300); then it stays parked")
        p.set_defaults(func=func, cli_prog=p.prog)

    for name, help_text, description in AGENT_COMMANDS:
        p = sub.add_parser(name, help=help_text, description=description)
        _agent_options(p, guard=name in ("agent", "guard"), room=name in ("agent", "broker"))
        p.set_defaults(func=_agent, cli_prog=p.prog)

    p = sub.add_parser(
        "hub-service", add_help=False,
        help="one view of every server's slices under JupyterHub (a JupyterHub service)",
        description="Run the hub-wide view as a JupyterHub service (docs/hub-view.md). Its "
                    "options are traitlets settings: `hami-jupyter hub-service --help-all`.")
    p.set_defaults(cli_prog=p.prog)

    p = sub.add_parser("demo", help="show a slice at work (on the simulated GPU without a driver)")
    if with_demo_options:
        from . import demo

        demo.add_arguments(p)
    p.set_defaults(func=_demo, cli_prog=p.prog)
    add_slice_commands(sub)
    add_audit_commands(sub)
    return parser


def main(argv=None):
    """Run the command line; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(argv)
    except ModuleNotFoundError as e:
        missing = missing_extra(e)
        if missing is None:
            raise
        module, extra = missing
        command = " ".join([PROG, *argv[:1]])
        print(f"{command}: error: this command needs {module}, which is not installed here: "
              f"pip install 'hami-jupyter[{extra}]'", file=sys.stderr)
        return 1


def _run(argv):
    if argv[:1] == ["hub-service"]:  # traitlets parses its own options, --help included
        return _hub_service(argv[1:])
    parser = build_parser(with_demo_options=argv[:1] == ["demo"])
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version or a usage error, already printed
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.func(args)
    except UsageError as e:
        for problem in e.args:
            print(f"{args.cli_prog}: error: {problem}", file=sys.stderr)
        return 2
    except Failure as e:
        print(f"{args.cli_prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
