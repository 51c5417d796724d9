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
"""

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class KernelEntry:
    kernel_id: str
    user: str
    kernelspec: str
    pid: int
    started_unix: float
    slice: str
    pid_start: int = 0  # the process's start time (clock ticks since boot); 0: unknown


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


def _entry_path(slice_path, kernel_id):
    if not kernel_id or "/" in kernel_id or kernel_id.startswith("."):
        raise ValueError(f"not a kernel id: {kernel_id!r}")
    return registry_dir(slice_path) / f"{kernel_id}.json"


def register(slice_path, entry: KernelEntry):
    """Record *entry* (replacing an older record of the same kernel)."""
    d = registry_dir(slice_path)
    d.mkdir(mode=0o700, exist_ok=True)
    target = _entry_path(slice_path, entry.kernel_id)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(entry)))
    os.replace(tmp, target)


def unregister(slice_path, kernel_id):
    """Forget a kernel; nothing happens if it was never recorded."""
    try:
        _entry_path(slice_path, kernel_id).unlink()
    except FileNotFoundError:
        pass


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
    process may). Unreadable entries are skipped: a
    half-written file cannot exist (rename), but a hand-edited one might.
    """
    out = []
    d = registry_dir(slice_path)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            data = json.loads((d / name).read_text())
            entry = KernelEntry(**{k: data[k] for k in KernelEntry.__dataclass_fields__ if k in data})
        except (OSError, ValueError, KeyError, TypeError):
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


def new_entry(slice_path, kernel_id, user, kernelspec, pid):
    return KernelEntry(kernel_id=kernel_id, user=user, kernelspec=kernelspec, pid=pid,
                       started_unix=time.time(), slice=str(slice_path), pid_start=process_start(pid))
