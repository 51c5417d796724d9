"""``hami-jupyter demo``: the quick-start notebook, executed in a slice.

Runs ``examples/quickstart.ipynb`` with nbclient in a ``hami-python3`` kernel
(so through the real provisioner and preload library), in a fresh slice of
its own under a temporary slice root, and prints what the notebook printed:
the ``%hami status`` before, at the cap, and after. The user's own slices
are never touched.

With an NVIDIA driver on the machine the kernel uses the GPU (and PyTorch,
when installed). Without one it uses the bundled simulated GPU and says so.
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .. import native

_PACKAGE = Path(__file__).resolve().parents[1]  # hami_jupyter/
_PACKAGE_NOTEBOOK = _PACKAGE / "_examples" / "quickstart.ipynb"
_CHECKOUT_NOTEBOOK = _PACKAGE.parent / "examples" / "quickstart.ipynb"


def add_arguments(parser):
    parser.add_argument("--notebook", type=Path, help="notebook to run (default: the quick start)")
    parser.add_argument("--memory", default=None,
                        help="the slice's memory cap (default: 2g on the simulated GPU, 4g on a GPU)")
    parser.add_argument("--sm", default=None, help="the slice's SM share in percent (default: none)")
    parser.add_argument("--simulate", action="store_true",
                        help="use the simulated GPU even when an NVIDIA driver is present")
    parser.add_argument("--output", type=Path, help="also save the executed notebook here")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")


def default_notebook():
    for candidate in (_PACKAGE_NOTEBOOK, _CHECKOUT_NOTEBOOK):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("the quick-start notebook is missing from this installation; "
                            "reinstall hami-jupyter or pass --notebook")


def nvidia_driver_present():
    """True when the kernel can reach a real NVIDIA GPU (driver loaded, libcuda found)."""
    if not os.path.exists("/proc/driver/nvidia/version"):
        return False
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _use_simulated_gpu(workdir):
    """Point this process (and so the kernel it starts) at the simulated GPU."""
    env = native.sim_env(workdir / "sim-gpu", base={}, HAMI_SIM_DEVICES="1",
                         HAMI_SIM_MEMORY="16g", HAMI_SIM_CONTEXT_BYTES="64m")
    os.environ.update(env)


def _cell_text(cell):
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def _show_log(path, lines=20):
    """The end of the kernel's own output, after a failure."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return
    if tail:
        print("hami-jupyter demo: the kernel's last words:", *tail, sep="\n  ", file=sys.stderr)


def run(args):
    """Execute the notebook; print its outputs. Returns the exit status."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        notebook = args.notebook or default_notebook()
        nb = nbformat.read(notebook, as_version=4)
    except (OSError, ValueError) as e:
        print(f"hami-jupyter demo: cannot read the notebook: {e}", file=sys.stderr)
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="hami-demo-"))
    simulated = args.simulate or not nvidia_driver_present()
    if simulated:
        _use_simulated_gpu(workdir)
        print("hami-jupyter demo: no NVIDIA driver found: using the bundled simulated GPU "
              "(16 GiB); the slice is enforced by the same preload library" if not args.simulate
              else "hami-jupyter demo: using the bundled simulated GPU (--simulate)")
    else:
        print("hami-jupyter demo: NVIDIA driver found: running on the real GPU")
    memory = args.memory or ("2g" if simulated else "4g")
    os.environ["HAMI_SLICE_ROOT"] = str(workdir / "slices")
    os.environ["HAMI_SLICE"] = "demo"
    os.environ["HAMI_MEMORY_LIMIT"] = memory
    if args.sm:
        os.environ["HAMI_SM_LIMIT"] = str(args.sm)
    print(f"hami-jupyter demo: slice 'demo' ({workdir / 'slices' / 'demo.slice'}), memory cap "
          f"{memory}{', SM share ' + str(args.sm) + ' %' if args.sm else ''}; running {notebook}\n")

    client = NotebookClient(nb, kernel_name="hami-python3", timeout=args.timeout,
                            resources={"metadata": {"path": str(workdir)}})
    started = time.monotonic()
    status = 0
    # The kernel's own stderr goes to a log: what it says reaches the cells'
    # outputs (ipykernel forwards it), and the terminal would show it twice and
    # out of order. The log is shown when the kernel fails.
    kernel_log = workdir / "kernel.log"
    try:
        with open(kernel_log, "wb") as log:
            client.execute(stdout=log, stderr=log)
    except CellExecutionError as e:
        print(f"hami-jupyter demo: a cell failed:\n{e}", file=sys.stderr)
        status = 1
    except Exception as e:  # kernel failed to start: the provisioner's message says why
        print(f"hami-jupyter demo: the kernel could not run: {e}", file=sys.stderr)
        _show_log(kernel_log)
        return 1
    finally:
        if args.output:
            nbformat.write(nb, args.output)
        shutil.rmtree(workdir, ignore_errors=True)  # the kernel is gone: so is its slice

    shown = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.get("outputs"):
            continue
        shown.append(_cell_text(cell))
        print(f"--- In: {cell.source.splitlines()[0]}")
        print(shown[-1])
    if status == 0 and args.notebook is None and not any("refused after" in t for t in shown):
        print("hami-jupyter demo: the allocation loop was never refused: the cap did not hold",
              file=sys.stderr)
        status = 1
    if status == 0:
        print(f"hami-jupyter demo: done in {time.monotonic() - started:.1f} s"
              f"{' (simulated GPU)' if simulated else ''}")
    return status
