"""Kernelspecs that start their kernels in a slice of a set size.

The package ships one kernelspec, ``hami-python3``, whose kernels take their
limits from the server. ``hami-jupyter kernelspec install`` writes more, one
per slice size (``gpu-small``: 4 GiB, SM 25 %), so that a user picks a size by
picking a kernel. The limits go into the provisioner's ``config`` in
``kernel.json`` (see :mod:`.provisioner`).

Every value is checked here, with the rules of :mod:`hami_jupyter.slice.limits`,
before anything is written: a bad value in a kernelspec would otherwise only
show when a kernel fails to start, far from the mistake. Errors name the
values by the ``hami-jupyter kernelspec install`` options that carry them.

Under JupyterHub (``HAMI_HUB_SLICE`` in the environment, see
:mod:`.hub_slice`) every kernel of the server runs in the hub's
slice, under its limits: ``install`` refuses ``--slice`` naming another slice
and limits other than the slice's (more would not be applied; less, a
nested cap, is not supported yet), saying why.
"""

import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

from ..slice.file import SliceFileError, read_snapshot
from ..slice.limits import LimitError, Limits, parse_memory_limit, parse_mode, parse_sm_share
from ..slice.paths import SliceNameError, check_name, slice_path
from ..slice.settings import resolve_limits
from ..slice.size import format_size
from . import hub_slice

PROVISIONER = "hami-provisioner"
SHIPPED = "hami-python3"

# jupyter_client's rule for kernel names, less names such as "." and "..",
# which it accepts and which would replace the wrong folder.
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*", re.IGNORECASE)

# We say where a kernelspec went ourselves; keep jupyter_client's own
# "not in the search path" warning off the terminal.
_log = logging.getLogger(__name__)
_log.addHandler(logging.NullHandler())
_log.propagate = False


class KernelspecError(ValueError):
    """Kernelspec settings that cannot be used; *problems* holds one line for
    each (every setting is checked before any is reported), ``str()`` all."""

    def __init__(self, *problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def check_kernel_name(name):
    """The kernelspec name as Jupyter stores it (lower case); KernelspecError if unusable."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise KernelspecError(
            f"--name: {name!r} is not a kernelspec name; use letters, digits and . _ - "
            "starting with a letter or digit, e.g. gpu-small"
        )
    return name.lower()


def _check_slice(ref):
    if "/" in ref:
        if not os.path.isabs(ref):
            raise KernelspecError(f"--slice: {ref!r} is a relative path; give an absolute "
                                  "path or a slice name (kernels start in varying folders)")
        try:
            slice_path(ref)  # its file name must be a slice name, as the preload library says
        except SliceNameError as e:
            raise KernelspecError(f"--slice: {e}") from None
        return ref
    try:
        return check_name(ref)
    except SliceNameError as e:
        raise KernelspecError(f"--slice: {e}") from None


def provisioner_config(memory=None, sm=None, mode=None, slice=None, *, name=None,
                       display_name=None):
    """The provisioner ``config`` for these settings (None = not set), all checked.

    Every setting is checked before any problem is reported: KernelspecError
    carries one line for each. *name* and *display_name*, when given, are
    checked too (they are not part of the config). Values are kept as written
    ("4g" stays "4g") so the kernel.json reads as the command that wrote it.
    """
    config, problems = {}, []

    def check(parse, value):
        try:
            parse(value)
        except (LimitError, KernelspecError) as e:
            problems.append(str(e))
            return False
        return value is not None

    if name is not None:
        check(check_kernel_name, name)
    if check(lambda v: v is not None and parse_memory_limit(v, "--memory"), memory):
        config["memory_limit"] = str(memory)
    # 1-3 ASCII digits (or an int): int() reads them alike
    if check(lambda v: v is not None and parse_sm_share(v, "--sm"), sm):
        config["sm_limit"] = int(sm)
    if check(lambda v: v is not None and parse_mode(v, "--mode"), mode):
        config["sm_mode"] = mode
    if check(lambda v: v is not None and _check_slice(v), slice):
        config["slice"] = _check_slice(slice)
    if display_name is not None and not display_name.strip():
        problems.append("--display-name: empty; leave it out for the default")
    if problems:
        raise KernelspecError(*problems)
    return config


def _config_limits(config):
    """The :class:`~hami_jupyter.slice.settings.AskedLimits` a provisioner config
    sets; LimitError if one is invalid."""
    return resolve_limits(
        {k: config.get(k) for k in ("memory_limit", "sm_limit", "sm_mode")}, env={})


def default_display_name(config):
    """``Python 3 (HAMi vGPU, 4.0 GiB, SM 25 %)``: what the launcher shows."""
    limits = _config_limits(config).limits
    parts = []
    if limits.memory_limit:
        parts.append(format_size(limits.memory_limit))
    if limits.sm_share:
        parts.append(f"SM {limits.sm_share} %" + (" elastic" if limits.elastic else ""))
    return "Python 3 (HAMi vGPU" + "".join(f", {p}" for p in parts) + ")"


def server_provisioner_config(files=None):
    """``c.HamiProvisioner`` as the Jupyter server started from here would read it
    (its ``jupyter_server_config`` files on Jupyter's config path); ``({}, None)``
    or ``({...}, None)``, or ``({}, why)`` when the files cannot be read. The
    paths of the files read are appended to the list *files* when given."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.application import Application

    reader = Application(log=_log)
    try:
        reader.load_config_file("jupyter_server_config", path=jupyter_config_path())
    except Exception as e:  # a config file that does not load: the server would say so too
        return {}, f"the server's configuration could not be read ({e})"
    finally:
        if files is not None:
            files.extend(reader.loaded_config_files)
    mine = reader.config.get("HamiProvisioner", {})
    return {k: mine[k] for k in ("memory_limit", "sm_limit", "sm_mode", "max_decoders")
            if k in mine}, None


def applied_limits(config, environ=None, server_config=None):
    """What a kernel of a kernelspec with provisioner *config* is held to when a
    Jupyter server started here starts it: the strictest of the kernelspec's
    config, the server's ``c.HamiProvisioner`` (*server_config*, default: read
    from its files) and the environment (*environ*); see
    :func:`~hami_jupyter.slice.settings.resolve_limits`. LimitError for an
    invalid value."""
    environ = os.environ if environ is None else environ
    if server_config is None:
        server_config, _ = server_provisioner_config()
    return resolve_limits({}, {}, layers=[
        ("kernelspec", "config", {k: config.get(k) for k in
                                  ("memory_limit", "sm_limit", "sm_mode", "max_decoders")}),
        ("server config", "config", server_config),
        _in_force_layer(environ),
    ])


def _in_force_layer(environ):
    """The limits this place holds kernels to, as a layer of ``resolve_limits``:
    under the hub, those in force in the hub's slice file, which an
    administrator may have changed since the server started (its environment
    says nothing of them); elsewhere, the environment's limit variables."""
    try:
        hub = hub_slice.hub_slice(environ)
        held = read_snapshot(hub).fallback_limit if hub is not None else None
    except (hub_slice.HubSliceError, OSError, SliceFileError):
        held = None
    if held is None:
        return ("this environment", "env", environ)
    return (f"the hub's slice {hub}, in force", "config", {
        "memory_limit": held.memory_limit or None, "sm_limit": held.sm_share or None,
        "sm_mode": held.mode if held.sm_share else None, "max_decoders": held.max_decoders or None})


def describe_config(config, environ=None, server_config=None):
    """One line: what a kernel of a kernelspec with provisioner *config* is held
    to here, each limit with where it comes from, and "unlimited" where no
    place sets one; LimitError if a value is invalid."""
    asked = applied_limits(config, environ, server_config)
    limits, source = asked.limits, asked.sources.get
    memory = (f"memory {format_size(limits.memory_limit)} (from {source('memory_limit')})"
              if limits.memory_limit else "memory unlimited")
    sm = (f"SM {limits.sm_share} % ({limits.mode}; from {source('sm_share')})"
          if limits.sm_share else "SM unlimited")
    parts = [memory, sm]
    if limits.max_decoders:
        parts.append(f"{limits.max_decoders} decoders (from {source('max_decoders')})")
    if config.get("slice"):
        parts.append(f"slice {config['slice']}")
    return ", ".join(parts)


def invalid_source(config, environ=None, server_config=None):
    """Where the invalid limit that :func:`applied_limits` refuses comes from:
    ``("kernelspec", None)``, ``("server config", None)`` or ``("environment",
    VARIABLE)``; None when every place is valid. The kernelspec is looked at
    first: a kernel.json is fixed by whoever wrote it, a variable elsewhere."""
    environ = os.environ if environ is None else environ

    def invalid(**layers):
        try:
            applied_limits(layers.get("config", {}), layers.get("environ", {}),
                           layers.get("server_config", {}))
        except LimitError:
            return True
        return False

    if invalid(config=config):
        return "kernelspec", None
    if server_config and invalid(server_config=server_config):
        return "server config", None
    for name, value in sorted(environ.items()):  # variables that are no limit are never read
        if invalid(environ={name: value}):
            return "environment", name
    return None


def kernel_json(display_name, config):
    """The kernel.json content: the shipped hami-python3's shape with *config*."""
    return {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--ext=hami_jupyter.magic"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER, "config": config},
            "debugger": True,
        },
    }


def write_kernelspec(dest_dir, name, display_name=None, memory=None, sm=None, mode=None,
                     slice=None):
    """Check every setting, then write ``kernel.json`` into the folder *dest_dir*.

    *name* is checked too, so that a caller that installs the folder under
    that name has nothing left to fail on. Returns the file's path.
    """
    config = provisioner_config(memory=memory, sm=sm, mode=mode, slice=slice, name=name,
                                display_name=display_name)
    spec = kernel_json(display_name or default_display_name(config), config)
    path = Path(dest_dir) / "kernel.json"
    path.write_text(json.dumps(spec, indent=2) + "\n")
    for logo in shipped_logos():  # the launcher shows the chip, not a generic icon
        shutil.copyfile(logo, Path(dest_dir) / logo.name)
    return path


LOGOS = ("logo-svg.svg", "logo-32x32.png", "logo-64x64.png")


def shipped_logos():
    """The logos of the shipped ``hami-python3`` kernelspec: installed under this
    environment's ``share/jupyter/kernels``, else in a checkout's ``share/``."""
    for base in (Path(sys.prefix), Path(__file__).resolve().parents[2]):
        folder = base / "share" / "jupyter" / "kernels" / "hami-python3"
        found = [folder / name for name in LOGOS if (folder / name).is_file()]
        if found:
            return found
    return []


_OPTION = {"memory_limit": "--memory", "sm_share": "--sm", "mode": "--mode"}


def check_under_hub(config, environ=None):
    """Under JupyterHub (``HAMI_HUB_SLICE`` in *environ*, default ``os.environ``):
    KernelspecError when the provisioner *config* names another slice than the
    hub's or limits other than the slice's; else nothing."""
    environ = os.environ if environ is None else environ
    try:
        hub = hub_slice.hub_slice(environ)
    except hub_slice.HubSliceError as e:
        raise KernelspecError(str(e)) from None
    if hub is None:
        return
    why = f"JupyterHub gave this server the slice {hub}, and {hub_slice.APPLIES}"
    ref = config.get("slice")
    if ref and hub_slice.refers_elsewhere(ref, hub, env=environ):
        raise KernelspecError(f"--slice: {why}, so a kernelspec cannot name another slice; "
                              "leave --slice out")
    asked = _config_limits(config)
    try:
        held = hub_slice.held_by(read_snapshot(hub))
    except (OSError, SliceFileError):  # the limits the hub put into the server's environment
        try:
            held = hub_slice.held_by_limits(resolve_limits({}, environ))
        except LimitError:
            held = [("", Limits())]
    stricter, looser = hub_slice.compare(asked, held)
    holds = hub_slice.describe_held(held)
    if looser:
        field, text, _ = looser[0]
        raise KernelspecError(
            f"{_OPTION[field]}: {text} is more than the hub's slice holds ({holds}): {why}, so "
            f"its kernels would not get it; leave {_OPTION[field]} out")
    if stricter and not hub_slice.nested_memory_cap(stricter, asked):
        field, text, _ = next(s for s in stricter if s[0] != "memory_limit")
        raise KernelspecError(
            f"{_OPTION[field]}: {text} is stricter than the hub's slice holds ({holds}), and "
            f"{why}: {hub_slice.NESTED}; leave {_OPTION[field]} out")


def install(name, display_name=None, memory=None, sm=None, mode=None, slice=None,
            user=False, prefix=None):
    """Write and install a kernelspec; return the folder it was installed in.

    Where, as jupyter_client decides: *user* for the user's Jupyter data
    folder, *prefix* for ``<prefix>/share/jupyter/kernels``, neither for the
    system-wide folder. An existing kernelspec of that name there is replaced.
    Raises KernelspecError for a bad setting, or one that the hub's slice
    rules out (:func:`check_under_hub`; nothing is written), OSError when the
    folder cannot be written.
    """
    check_under_hub(provisioner_config(memory=memory, sm=sm, mode=mode, slice=slice, name=name,
                                       display_name=display_name))
    name = check_kernel_name(name)
    with tempfile.TemporaryDirectory(prefix="hami-kernelspec-") as tmp:
        write_kernelspec(tmp, name, display_name, memory=memory, sm=sm, mode=mode, slice=slice)
        manager = KernelSpecManager(log=_log)
        return Path(manager.install_kernel_spec(tmp, kernel_name=name, user=user, prefix=prefix))


def searched(kernel_dir):
    """True when Jupyter looks for kernelspecs in the folder holding *kernel_dir*."""
    parent = os.path.realpath(Path(kernel_dir).parent)
    return any(os.path.realpath(d) == parent for d in KernelSpecManager().kernel_dirs)


def hami_kernelspecs():
    """Every kernelspec Jupyter finds that starts its kernels through HAMi.

    A list of dicts: name, resource_dir, display_name, config, and either
    ``limits`` (:func:`describe_config`'s line: what applies here) or ``error``
    (why its config, or the limits around it, are invalid) with
    ``error_source``: :func:`invalid_source`'s ``[place, variable]``, and
    ``server_config_files``, the server's configuration files read.
    """
    found = []
    files = []
    server_config, _ = server_provisioner_config(files)
    for name, info in sorted(KernelSpecManager(log=_log).get_all_specs().items()):
        spec = info.get("spec") or {}
        provisioner = (spec.get("metadata") or {}).get("kernel_provisioner") or {}
        if provisioner.get("provisioner_name") != PROVISIONER:
            continue
        config = provisioner.get("config") or {}
        entry = {"name": name, "resource_dir": info.get("resource_dir"),
                 "display_name": spec.get("display_name"), "config": config}
        try:
            entry["limits"] = describe_config(config, server_config=server_config)
        except LimitError as e:
            entry["error"] = str(e)
            entry["error_source"] = list(invalid_source(config, server_config=server_config)
                                         or ("kernelspec", None))
            entry["server_config_files"] = files
        found.append(entry)
    return found
