"""``hami-jupyter slice list|set|reset``, ``audit verify``, ``admin-service``: the admin
panel's operations from a shell.

``hami_jupyter.commands.cli`` registers them with :func:`add_slice_commands`;
:func:`main` runs them alone (tests, or ``python -m hami_jupyter.admin.cli``).
They share every check and message with the panel through :mod:`.changes`.

Each handler returns the exit status and prints its own messages, one line
each, never a traceback: 0 when all went well; 1 when the slice could not be
read or the change was refused (hard slices that would not fit a GPU, a slice
this user may only read); 2 for a usage error (a malformed or negative value,
a bad slice name or GPU, nothing to change), as argparse does. Every usage
error of a command is told, each on its line, before any slice is read. ``slice
list`` skips, with a warning, a slice file the trust rule refuses (see
:mod:`hami_jupyter.slice.paths`) and shows the others.
"""

import argparse
import json
import sys
from pathlib import Path

from ..gpus import read_gpus
from ..slice.paths import SliceNameError, default_root, not_yours, others_skipped, slice_path
from ..slice.limits import effective_guarantee
from ..slice.size import format_size
from ..slice.status import format_text
from . import actions, changes, marks

_ROOT_HELP = ("slice root (default: HAMI_SLICE_ROOT, /run/hami-jupyter, "
              "$XDG_RUNTIME_DIR/hami-jupyter, /tmp/hami-jupyter-<uid>)")


def _error(args, message, status):
    print(f"{args.cli_prog}: error: {message}", file=sys.stderr)
    return status


# ---- slice list ---------------------------------------------------------------------


def _gpu_line(g):
    name = f" {g['name']}" if g["name"] else ""
    total = g["memory_total"]
    of = f" of {format_size(total)}" if total else ""
    shares = ", ".join(f"{s} {format_size(b)}" for s, b in g["holders"].items())
    if g.get("lent"):  # a guarantee below a cap: the promises are guarantees, the caps lend
        return (f"  GPU {g['uuid']}{name}: {format_size(g['promised'])}{of} guaranteed to slices"
                f"{' (' + shares + ')' if shares else ''}; caps {format_size(g['capped'])}")
    return (f"  GPU {g['uuid']}{name}: {format_size(g['promised'])}{of} promised to hard "
            f"slices{' (' + shares + ')' if shares else ''}")


def _table(rows):
    """*rows* (lists of strings, the first the heading) as aligned columns, indented."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _memory_rows(shown):
    """One row per slice and GPU: what the slice counts, its cap, and what the guard reads;
    with a GUARANTEED column where some slice has a guarantee below its cap."""
    entries = []  # (slice, GPU, used, cap, guarantee in force, real)
    for v in shown:
        s = v.status
        if not s["gpus"]:
            d = s["default_limit"]
            entries.append((v.name, "-", 0, d["memory_limit"],
                            effective_guarantee(d["memory_limit"], d.get("memory_guarantee", 0)),
                            "-"))
        for g in s["gpus"]:
            real = g.get("memory_real")
            entries.append((v.name, str(g["index"]), g["memory_used"], g["memory_limit"],
                            g.get("memory_guarantee", g["memory_limit"]),
                            ("-" if real is None else format_size(real))
                            + ("  OVER CAP" if g.get("guard_state") == "over" else "")))
    lent = any(cap != guarantee for _, _, _, cap, guarantee, _ in entries)
    rows = [["SLICE", "GPU", "USED", "CAP"] + (["GUARANTEED"] if lent else []) + ["REAL"]]
    for name, gpu, used, cap, guarantee, real in entries:
        guaranteed = [format_size(guarantee) if guarantee else "none"] if lent else []
        rows.append([name, gpu, format_size(used), format_size(cap) if cap else "none",
                     *guaranteed, real])
    return rows


def list_command(args):
    """Show every slice with its usage, kernels, limits and whether this user may change them;
    then a table of each slice's memory per GPU with the guard's real figure (REAL), and a
    note when no guard is running."""
    root = Path(args.root) if args.root else default_root()
    skipped = []
    views = actions.read_slices(root, skipped=skipped)
    gpus, message = read_gpus()
    for line in skipped:  # another user's or unsafe: never read, the others still show
        print(f"{args.cli_prog}: warning: {line}", file=sys.stderr)
    others = [v.path for v in views if v.error and not_yours(v.path)]
    if others:  # theirs in a shared root (the hub's): not a fault, as doctor says
        print(f"{args.cli_prog}: {others_skipped(others)}", file=sys.stderr)
        views = [v for v in views if v.path not in others]
    for v in views:
        if v.error:
            _error(args, v.error, 1)
    shown = [v for v in views if not v.error]
    promised = actions.commitments(views, gpus)
    if args.json:
        print(json.dumps({"gpus": promised,
                          "slices": [dict(v.status, writable=v.writable) for v in shown]}, indent=2))
    elif not views and not skipped:
        print(f"no slices under {root}: a slice is created when its first kernel starts "
              "(HAMI_SLICE_ROOT or --root looks elsewhere)")
    else:
        blocks = [format_text(v.status) + "\n  " + ("limits: you may change them" if v.writable
                                                    else changes.READ_ONLY) for v in shown]
        memory = ["memory per slice and GPU (REAL: as the guard reads it from NVML):"]
        memory += _table(_memory_rows(shown)) if shown else ["  none readable"]
        note = actions.guard_note(root)
        if note:
            memory.append(f"note: {note}")
        gpu_lines = ["GPUs:" if promised else "GPUs: none known"] + [_gpu_line(g) for g in promised]
        if message:
            gpu_lines.append(f"  ({message}; sizes come from the slice files)")
        print("\n\n".join(blocks + ["\n".join(memory), "\n".join(gpu_lines)]))
    return 1 if len(shown) < len(views) else 0


# ---- slice set ----------------------------------------------------------------------


def set_command(args):
    """Check and apply one change; print what changed, or why not."""
    problems = changes.check_values(args.device, args.memory, args.sm, args.mode, args.guarantee)
    if args.memory is None and args.sm is None and args.mode is None and args.guarantee is None:
        problems.insert(0, "nothing to change: give --memory, --guarantee, --sm or --mode")
    try:
        path = slice_path(args.slice, root=args.root)
    except SliceNameError as e:
        problems.append(str(e))
    if problems:  # every malformed argument, before any slice is looked at
        for line in problems:
            _error(args, line, 2)
        return 2
    try:
        change = actions.apply(path, args.device, args.memory, args.sm, args.mode,
                               overcommit=args.overcommit, gpus=read_gpus()[0],
                               audit_path=args.audit_log, guarantee=args.guarantee)
    except changes.ChangeError as e:
        checked = e.change
        for line in checked.errors if checked is not None and checked.errors else [str(e)]:
            _error(args, line, 1)
        for line in checked.warnings if checked is not None else []:
            print(f"{args.cli_prog}: warning: {line}", file=sys.stderr)
        return 1
    print(f"applied: {change.summary()}")
    for line in change.warnings:
        print(f"warning: {line}")
    if not marks.hub_managed(path):  # what `slice reset` then says too
        print(f"note: slice {change.slice!r} is not a hub's, so `slice reset` has no policy to "
              f"go back to. {changes.OWN_SLICE_LIMITS}")
    return 0


# ---- slice reset ----------------------------------------------------------------------


def reset_command(args):
    """Drop an administrator's limits: back to the policy's."""
    try:
        path = slice_path(args.slice, root=args.root)
    except SliceNameError as e:
        return _error(args, str(e), 2)
    try:
        message = actions.reset(path, audit_path=args.audit_log)
    except changes.ChangeError as e:
        return _error(args, str(e), 1)
    print(message)
    return 0


# ---- audit verify -------------------------------------------------------------------


def verify_command(args):
    from .. import audit

    log = Path(args.log) if args.log else audit.default_path(Path(args.root) if args.root
                                                              else default_root())
    if not log.exists():  # where it looked and what to check
        return _error(args, f"no audit log at {log}: it is written at the first limit change "
                            "(slice set or reset); check --log, or --root and HAMI_SLICE_ROOT "
                            "for the folder", 1)
    problems, notes = audit.verify(log)
    for line in notes:
        print(f"note: {line}")
    for line in problems:
        _error(args, line, 1)
    if problems:
        return 1
    print(f"{log}: intact ({len(audit.read_records(log))} records, hash chain unbroken)")
    return 0


# ---- admin-service ------------------------------------------------------------------


def service_command(args):
    import os

    from .service import AdminService

    if os.geteuid() != 0:
        return _error(args, "the admin service writes root's files: run it as root "
                            "(a JupyterHub managed service, or systemd)", 1)
    root = Path(args.root) if args.root else default_root()
    try:
        service = AdminService(root, args.admin_group, args.socket).bind()
    except KeyError:
        return _error(args, f"no group {args.admin_group!r}", 2)
    except OSError as e:
        return _error(args, f"cannot listen on {args.socket or root}: {e.strerror or e}", 1)
    service.stop_on_signals().serve_forever()
    return 0


# ---- registration -------------------------------------------------------------------


def _slice_arguments(parser):
    """What every change names: the slice, where it is, and the log it goes to."""
    parser.add_argument("slice", metavar="SLICE", help="slice name or path")
    parser.add_argument("--audit-log", metavar="FILE",
                        help="audit log to append to (default: audit.log beside the slice file)")
    parser.add_argument("--root", metavar="DIR", help=_ROOT_HELP)


def add_slice_commands(subparsers):
    """Register ``slice list`` and ``slice set`` on *subparsers* (of the ``hami-jupyter`` parser)."""
    p = subparsers.add_parser(
        "slice", help="list slices and change their limits live (administrators)",
        description="List the slices of this host, or change a slice's limits while its "
                    "kernels run. Every change is checked first and logged.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    lp = actions.add_parser("list", help="show every slice, its usage, kernels and limits",
                            description="Show every slice under the slice root with its usage, "
                                        "kernels, users and limits, and the memory each GPU has "
                                        "promised to hard slices.")
    lp.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    lp.add_argument("--json", action="store_true",
                    help='print {"gpus": [...], "slices": [...]} as JSON')
    lp.set_defaults(func=list_command, cli_prog=lp.prog)

    sp = actions.add_parser(
        "set", help="change a slice's memory cap, guarantee, SM share or mode, live",
        description="Change one entry of a slice's limits; running kernels follow at their next "
                    "allocation. Without --device the slice's default entry changes: the limits "
                    "of every GPU without limits of its own.")
    _slice_arguments(sp)
    sp.add_argument("--device", metavar="N|UUID",
                    help="one GPU the slice has used: its index in `slice list`, or its UUID")
    sp.add_argument("--memory", metavar="SIZE", help="memory cap, e.g. 4g or 4096m; none for no cap")
    sp.add_argument("--guarantee", metavar="SIZE",
                    help="memory the slice keeps whatever others need, e.g. 2g; at most the cap. "
                         "Above it, up to the cap, memory is lent: the memory broker may park the "
                         "slice's idle kernels to make room. 0 or default: none (the cap is the "
                         "guarantee)")
    sp.add_argument("--sm", metavar="PERCENT",
                    help="SM share: a whole percent of each GPU, 1-99; 0 or 100: no share (or none)")
    sp.add_argument("--mode", metavar="MODE", help="how the SM share is held: hard or elastic")
    sp.add_argument("--overcommit", action="store_true",
                    help="allow slices to be promised (hard caps, guarantees) more memory than a "
                         "GPU has")
    sp.set_defaults(func=set_command, cli_prog=sp.prog)

    rp = actions.add_parser(
        "reset", help="drop an administrator's limits: back to the policy's",
        description="An administrator's change is kept when the user's server restarts; this "
                    "puts the limits the hub's policy gives back at once, and lets the hub "
                    "apply the policy at later server starts. Logged like every change.")
    _slice_arguments(rp)
    rp.set_defaults(func=reset_command, cli_prog=rp.prog)
    return p


def add_audit_commands(subparsers):
    """Register ``audit verify`` and ``admin-service``."""
    p = subparsers.add_parser("audit", help="check the administrators' audit log",
                              description="Check the audit log of limit changes.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    vp = actions.add_parser("verify", help="check the log's hash chain: edits, removals, truncation",
                            description="Walk the hash chain of the audit log (each record carries "
                                        "the SHA-256 of the line before) and compare its end with "
                                        "audit.log.head. Exit status 1 names each break.")
    vp.add_argument("--log", metavar="FILE", help="the log (default: audit.log in the slice root)")
    vp.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    vp.set_defaults(func=verify_command, cli_prog=vp.prog)

    sp = subparsers.add_parser(
        "admin-service", help="apply and log administrators' changes as root (a service)",
        description="Listen on a Unix socket (default <root>/admin.sock, root:ADMIN_GROUP 0660); "
                    "apply `slice set` / `slice reset` for callers the kernel says are root or "
                    "in the admin group, and write the audit log, which only root may write.")
    sp.add_argument("--root", metavar="DIR", help=_ROOT_HELP)
    sp.add_argument("--admin-group", metavar="GROUP", default="hami-admin",
                    help="who may use the service (default: hami-admin)")
    sp.add_argument("--socket", metavar="PATH", help="socket path (default: <root>/admin.sock)")
    sp.set_defaults(func=service_command, cli_prog=sp.prog)
    return p


def main(argv=None):
    """Run ``slice ...`` alone: ``main(["slice", "list"])``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hami-jupyter")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_slice_commands(sub)
    add_audit_commands(sub)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as e:  # --help or a usage error, already printed
        return e.code if isinstance(e.code, int) else 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
