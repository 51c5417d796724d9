"""Which Jupyter kernels run in a slice: kernel id, user, kernelspec, process.

The slice file's slots carry each process's kernel id (the provisioner puts
it in the kernel's environment as ``HAMI_KERNEL_ID``); this registry adds what
a fixed-size slot has no room for. One small JSON file per kernel lives in
``<slice>.kernels/`` beside the slice file, written atomically (rename) by the
provisioner when the kernel starts and removed when it shuts down. A kernel
that died without a shutdown (its server stopped first, say) leaves its entry
behind; readers skip and delete entries whose process is gone. An entry
records its process's start time too, so a recycled PID cannot bring a dead
kernel back.

The registry belongs to the slice's user, and root's tools (``hami-jupyter
status``, ``slice list``, the admin panel) read it: so everything read is
checked. The folder and each entry must pass the trust rule of
:mod:`.paths` (an entry may also belong to the registry
folder's owner: the user the hub gave the slice to), an entry is a regular
file of at most :data:`MAX_ENTRY_BYTES`, and its fields must have the types
and ranges of :class:`KernelEntry` (see :func:`entry_from_json`). An entry
that fails is skipped with a warning in the log (``hami_jupyter`` logger),
never an exception: one bad file cannot stop a tool from showing the rest.
"""

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .paths import (
    UntrustedPath,
    check_file,
    check_folder,
    folder_of,
    open_trusted,
    refuse_dangling_link,
    replace_file,
)

log = logging.getLogger("hami_jupyter")

MAX_PID = 4194304  # PID_MAX_LIMIT on 64-bit Linux
MAX_ENTRY_BYTES = 64 * 1024
MAX_ID_LEN = 128  # kernel ids are UUIDs (36 characters)
MAX_NAME_LEN = 256  # user and kernelspec names
MAX_PATH_LEN = 4096


@dataclass
class KernelEntry:
    kernel_id: str
    user: str
    kernelspec: str
    pid: int
    started_unix: float
    slice: str
    pid_start: int = 0  # the process's start time (clock ticks since boot); 0: unknown
    # Written by the kernel's Jupyter server (hami_jupyter.server.activity) while
    # the kernel runs, for the memory broker, which parks only idle kernels:
    last_activity_unix: float = 0.0  # its last message or cell (0: not published)
    busy: bool = False  # a cell runs now
    # The notebook (or console) the kernel serves: its Jupyter session's path,
    # relative to the server's root where it lies under it; "" when unknown.
    # Written by the provisioner at launch (JPY_SESSION_NAME) and kept current
    # by the kernel's server (renames). A claim of the slice's user: shown to
    # people, never a reason for root to act.
    notebook: str = ""


class BadEntry(ValueError):
    """A registry entry whose content is not a :class:`KernelEntry`."""


def process_start(pid):
    """Start time of process *pid* in clock ticks since boot (``/proc/<pid>/stat``
    field 22), or 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and ')': split after the last ')'.
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def registry_dir(slice_path):
    p = Path(slice_path)
    return p.with_name(p.name + ".kernels")


def valid_kernel_id(kernel_id):
    """A kernel id that can name an entry file: 1-128 printable characters, no
    '/', not starting with '.'."""
    return (isinstance(kernel_id, str) and 0 < len(kernel_id) <= MAX_ID_LEN
            and kernel_id.isprintable() and "/" not in kernel_id and not kernel_id.startswith("."))


def _entry_path(slice_path, kernel_id):
    if not valid_kernel_id(kernel_id):
        raise ValueError(f"not a kernel id: {kernel_id!r}")
    return registry_dir(slice_path) / f"{kernel_id}.json"


# ---- what an entry may hold ---------------------------------------------------------


def _text(data, key, limit):
    value = data[key]
    if not isinstance(value, str):
        raise BadEntry(f"{key} is {type(value).__name__}, not a string")
    if len(value) > limit:
        raise BadEntry(f"{key} is {len(value)} characters long, more than {limit}")
    if not value.isprintable():
        raise BadEntry(f"{key} holds control characters")
    return value


def _whole(data, key, low, high):
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadEntry(f"{key} is {type(value).__name__}, not a whole number")
    if not low <= value <= high:
        raise BadEntry(f"{key} {value} is out of range {low}..{high}")
    return value


def _seconds(data, key):
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise BadEntry(f"{key} {value!r} is not a time in seconds")
    return float(value)


def entry_from_json(data, kernel_id=None):
    """A :class:`KernelEntry` from an entry's decoded JSON; BadEntry saying what is wrong.

    kernel_id: 1-128 printable characters (and the entry's file name when
    *kernel_id* is given); user, kernelspec: strings of at most 256 printable
    characters; slice: a string of at most 4096; pid: a whole number
    1..4194304; started_unix: a number of seconds, finite, not negative;
    pid_start: a whole number 0..2**63-1 (0: unknown), 0 when missing;
    last_activity_unix: a number of seconds, finite, not negative (0 when
    missing); busy: true or false (false when missing); notebook: a string
    of at most 4096 printable characters ("" when missing). Keys beyond these
    are ignored.
    """
    if not isinstance(data, dict):
        raise BadEntry(f"a JSON {type(data).__name__}, not an object")
    missing = [k for k in ("kernel_id", "user", "kernelspec", "pid", "started_unix", "slice")
               if k not in data]
    if missing:
        raise BadEntry(f"missing {', '.join(missing)}")
    kid = _text(data, "kernel_id", MAX_ID_LEN)
    if not valid_kernel_id(kid):
        raise BadEntry(f"kernel_id {kid!r} is not a kernel id")
    if kernel_id is not None and kid != kernel_id:
        raise BadEntry(f"kernel_id {kid!r} differs from its file name")
    started = _seconds(data, "started_unix")
    busy = data.get("busy", False)
    if not isinstance(busy, bool):
        raise BadEntry(f"busy is {type(busy).__name__}, not true or false")
    return KernelEntry(
        kernel_id=kid,
        user=_text(data, "user", MAX_NAME_LEN),
        kernelspec=_text(data, "kernelspec", MAX_NAME_LEN),
        pid=_whole(data, "pid", 1, MAX_PID),
        started_unix=started,
        slice=_text(data, "slice", MAX_PATH_LEN),
        pid_start=_whole(data, "pid_start", 0, 2**63 - 1) if "pid_start" in data else 0,
        last_activity_unix=_seconds(data, "last_activity_unix") if "last_activity_unix" in data else 0.0,
        busy=busy,
        notebook=_text(data, "notebook", MAX_PATH_LEN) if "notebook" in data else "",
    )


# ---- the folder --------------------------------------------------------------------


def _checked_dir(slice_path):
    """``(registry folder, its stat)`` once the slice folder and the registry
    folder passed the trust rule; FileNotFoundError when either is missing."""
    d = registry_dir(slice_path)
    folder = check_folder(folder_of(d))
    try:
        st = os.stat(d)
    except FileNotFoundError:
        refuse_dangling_link(d, "kernel registry")
        raise
    check_file(d, st, folder, what="kernel registry", directory=True)
    return d, st


def _read_entry(d, dst, name):
    """The KernelEntry in file *name* of registry folder *d* (stat *dst*)."""
    fd, st, _ = open_trusted(d / name, os.O_RDONLY, "kernel registry entry", folder=dst,
                             also_owner=dst.st_uid, follow=False)
    try:
        if st.st_size > MAX_ENTRY_BYTES:
            raise BadEntry(f"{st.st_size} bytes, more than {MAX_ENTRY_BYTES}")
        raw = os.read(fd, MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_ENTRY_BYTES:
        raise BadEntry(f"more than {MAX_ENTRY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadEntry(f"not JSON ({e.__class__.__name__})") from None
    return entry_from_json(data, name[: -len(".json")])


# ---- writing ------------------------------------------------------------------------


def _entry_bytes(entry):
    # UTF-8 as it is (no \uXXXX escapes): the preload library reads the notebook's
    # name out of an entry for its out-of-memory line, with no JSON decoder.
    return json.dumps(asdict(entry), ensure_ascii=False).encode()


def register(slice_path, entry: KernelEntry):
    """Record *entry* (replacing an older record of the same kernel).

    The registry folder is made (0700) beside the slice file when missing;
    OSError (UntrustedPath included) when the slice folder or the registry
    fails the trust rule. An entry readers would refuse is not written (a
    warning in the log says why): the kernel runs in its slice either way.
    """
    try:
        entry_from_json(asdict(entry))
    except BadEntry as e:
        log.warning("hami-jupyter: kernel %r not registered: %s", entry.kernel_id, e)
        return
    target = _entry_path(slice_path, entry.kernel_id)
    d = target.parent
    check_folder(folder_of(d))
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    _checked_dir(slice_path)
    # 0644 whatever the umask: readable by administrators the registry folder
    # lets in, never writable by other users (readers would refuse it).
    replace_file(target, _entry_bytes(entry), 0o644)


def record_activity(slice_path, kernel_id, last_activity_unix, busy, notebook=None):
    """Write the kernel's last activity and whether a cell runs into its entry
    (replaced whole, atomically), and its notebook's path when *notebook* is
    given (the session's path now: a notebook renamed since the launch). False
    when the kernel has no entry (never registered, or unregistered
    meanwhile): an entry is only ever made by :func:`register`. OSError
    (UntrustedPath included) as :func:`register`."""
    d, dst = _checked_dir(slice_path)
    try:
        entry = _read_entry(d, dst, _entry_path(slice_path, kernel_id).name)
    except FileNotFoundError:
        return False
    except BadEntry as e:
        log.warning("hami-jupyter: the activity of kernel %s is not recorded: its entry %s", kernel_id, e)
        return False
    entry.last_activity_unix = float(last_activity_unix)
    entry.busy = bool(busy)
    if notebook is not None:
        entry.notebook = notebook_text(notebook)
    replace_file(_entry_path(slice_path, kernel_id), _entry_bytes(entry), 0o644)
    return True


def unregister(slice_path, kernel_id):
    """Forget a kernel; nothing happens if it was never recorded. A registry
    that fails the trust rule is left alone, with a warning."""
    path = _entry_path(slice_path, kernel_id)
    try:
        _checked_dir(slice_path)
        path.unlink()
    except FileNotFoundError:
        pass
    except UntrustedPath as e:
        log.warning("hami-jupyter: kernel %s not unregistered: %s", kernel_id, e)


# ---- reading ------------------------------------------------------------------------


def _alive(entry):
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    return not entry.pid_start or process_start(entry.pid) in (0, entry.pid_start)


def kernels(slice_path, include_dead=False):
    """The slice's registered kernels, oldest first.

    Entries whose process no longer exists are left out (and *include_dead*
    brings them back, for diagnosis; otherwise they are deleted when this
    process may). A registry folder or entry that fails the trust rule, and
    an entry that is not a valid :class:`KernelEntry` (see
    :func:`entry_from_json`), are skipped with a warning in the log.
    """
    out = []
    try:
        d, dst = _checked_dir(slice_path)
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return out
    except OSError as e:  # UntrustedPath included
        log.warning("hami-jupyter: kernel registry of %s skipped: %s", slice_path, e)
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            entry = _read_entry(d, dst, name)
        except FileNotFoundError:
            continue  # unregistered while we looked
        except (OSError, BadEntry) as e:
            log.warning("hami-jupyter: kernel registry entry %s skipped: %s", d / name, e)
            continue
        if _alive(entry):
            out.append(entry)
        elif include_dead:
            out.append(entry)
        else:
            try:
                (d / name).unlink()  # a kernel that died without a shutdown
            except OSError:
                pass  # someone else's registry: leave it to them
    out.sort(key=lambda e: e.started_unix)
    return out


def notebook_text(path):
    """*path* as an entry's ``notebook``: "" for None, and for a path readers
    would refuse (too long, control characters), so the rest of the entry is
    still written."""
    if not isinstance(path, str) or len(path) > MAX_PATH_LEN or not path.isprintable():
        return ""
    return path


def notebook_of(session_name, root=None):
    """The notebook a kernel starts for, from ``JPY_SESSION_NAME`` (jupyter_server
    puts the session's file path there: the server's folder for it joined with
    its name): relative to the server's *root* folder when it lies under it, as
    JupyterLab names it; "" without one."""
    if not session_name:
        return ""
    if root:
        try:
            relative = os.path.relpath(session_name, root)
        except ValueError:
            relative = None
        if relative and not relative.startswith(".."):
            return notebook_text(relative)
    return notebook_text(session_name)


def new_entry(slice_path, kernel_id, user, kernelspec, pid, notebook=""):
    return KernelEntry(kernel_id=kernel_id, user=user, kernelspec=kernelspec, pid=pid,
                       started_unix=time.time(), slice=str(slice_path), pid_start=process_start(pid),
                       notebook=notebook_text(notebook))
