"""The package imports downward only: the slice at the bottom, the fronts above it.

Every import of every module of hami_jupyter is read (at module level and
inside functions alike: a late import is still a dependency). Each module
belongs to a *part* (a subpackage, or a top-level module) and each part to a
floor; a part may import its own modules and the parts of lower floors,
never a part on its own floor or above. No module may reach itself through
imports, however late. A new module must be given a floor here, so the
picture below stays the whole package.

Some parts run apart from others that sit below them, and must not import
them even where the floors would allow it (``APART``): the node agent runs
alone on a node, so it imports nothing of the admin tools (the audit log they
share is a part of its own, under both).

And the Jupyter server process, with the server extension and the
provisioner loaded, does not import IPython (only kernels need it).
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hami_jupyter"

# part -> floor, from the ground up
FLOORS = {
    "": 0,  # hami_jupyter/__init__.py: the version, the extension points
    "native": 0,  # where the built C code is
    "driver_memory": 0,  # framework-free CUDA allocations
    "slice": 1,  # the slice file and everything that reads or writes it
    "processes": 1,  # a process by its PID and start time; ending one safely
    "gpus": 2,  # the host's GPUs from NVML
    "advice": 2,  # what to do about a slice error
    "audit": 2,  # the audit log: admin tools, hub, hub service and guard write it
    "provisioning": 3,  # kernels started in slices (the Jupyter server process)
    "magic": 3,  # %hami (inside kernels)
    "admin": 4,  # administrators' changes, the panel
    "hub": 5,  # JupyterHub: policy, spawner, hub-made slices
    "agent": 5,  # hami-jupyter agent: the node's root daemon, the guard and the memory broker in one
    "server": 6,  # the Jupyter server extension
    "hubview": 6,  # hami-jupyter hub-service: the hub-wide view, a JupyterHub service
    "commands": 7,  # the hami-jupyter command
    "_server_help": 7,  # the extension's settings in `jupyter server --help-all`
    "__main__": 8,
}

# part -> parts it must never import, floors notwithstanding
APART = {
    "agent": {"admin"},  # runs alone on a node, without the admin tools
}


def modules():
    """``{dotted name: path}`` of every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name, path, known):
    """The package's modules that module *name* imports, each resolved to a module."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # "from pkg import mod" names a module; "from mod import name" names the module.
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        for target in targets:
            if target in known and (target != name):
                out.add(target)
    # "from .slice import file" gave both hami_jupyter.slice and hami_jupyter.slice.file:
    # keep the most precise module of each chain.
    return {t for t in out if not any(o.startswith(t + ".") for o in out)} or out


def part_of(module):
    rest = module.split(".")[1:]
    return rest[0] if rest else ""


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_part_has_a_floor():
    unplaced = sorted({part_of(m) for m in modules()} - set(FLOORS))
    assert not unplaced, f"give these parts of hami_jupyter a floor in FLOORS: {unplaced}"


def test_every_import_runs_downward():
    wrong = []
    for module, targets in graph().items():
        here = part_of(module)
        for target in sorted(targets):
            there = part_of(target)
            if there != here and FLOORS.get(there, 99) >= FLOORS.get(here, -1):
                wrong.append(f"{module} (floor {FLOORS.get(here)}) imports {target} "
                             f"(floor {FLOORS.get(there)})")
    assert not wrong, "imports that run sideways or up:\n  " + "\n  ".join(wrong)


def reached(edges, start):
    """Every module *start* imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_parts_that_run_apart_do_not_import_each_other():
    """The agent's modules never import hami_jupyter.admin, directly or through another module."""
    edges = graph()
    wrong = []
    for module in sorted(edges):
        banned = APART.get(part_of(module), set())
        wrong += [f"{module} reaches {target}" for target in sorted(reached(edges, module))
                  if part_of(target) in banned]
    assert not wrong, "imports of a part that runs apart:\n  " + "\n  ".join(wrong)


def test_no_module_reaches_itself():
    edges = graph()
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_late_imports():
    """The reader is not blind: a function-level import counts (magic -> watch)."""
    edges = graph()
    assert "hami_jupyter.magic.watch" in edges["hami_jupyter.magic.magics"]
    assert "hami_jupyter.slice.file" in edges["hami_jupyter.slice.change"]


# Other server extensions may import IPython (notebook_shim does): what counts is
# that no import of it comes from hami_jupyter, seen from inside the import.
SERVER_PROCESS = """
import builtins, sys, traceback
real_import = builtins.__import__
ours = []

def watched(name, *args, **kwargs):
    if name == "IPython" or name.startswith("IPython."):
        stack = traceback.extract_stack()
        ours.extend(f.filename for f in stack if "/hami_jupyter/" in f.filename)
    return real_import(name, *args, **kwargs)

builtins.__import__ = watched
from jupyter_server.serverapp import ServerApp
app = ServerApp()
app.initialize(argv=["--ServerApp.jpserver_extensions={'hami_jupyter': True}", "--no-browser",
                     "--ServerApp.port=0", "--ServerApp.token=unused"])
import hami_jupyter.provisioning.provisioner  # what a kernel start loads
import hami_jupyter.provisioning.kernelspec
assert "hami_jupyter.server" in sys.modules, "the extension did not load"
print(sorted(set(ours)))
"""


def test_the_server_process_does_not_import_ipython(tmp_path):
    env = {"HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", SERVER_PROCESS], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout
