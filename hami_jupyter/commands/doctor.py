"""``hami-jupyter doctor``: is this host set up to run kernels in slices?

Each check is a small function returning a :class:`Check`: PASS, WARN
(works, but not as one may expect) or FAIL (kernels will not start or not be
held to their limits), with advice that says what to do. A missing NVIDIA
driver is a WARN, not a FAIL: everything but real GPU work runs on the
simulated GPU, which is what ``hami-jupyter demo`` then uses.

The checks look at what a kernel started from this environment would meet:
the driver libraries the loader finds, the preload library in a real child
process, the provisioner and kernelspecs Jupyter finds, the limit variables,
the guard that watches the slices' real memory (its report in the slice
root), and the slice files.
"""

import ctypes
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from .. import gpus, native
from ..advice import explain
from ..provisioning import kernelspec
from ..slice import guard_report
from ..slice.file import SliceFile, SliceFileError
from ..slice.layout import HAMI_SLICE_MAX_DEVICES
from ..slice.limits import MODE_NUMBERS, LimitError
from ..slice.settings import resolve_limits
from ..slice.size import format_size
from ..slice.paths import (
    SliceNameError,
    UntrustedPath,
    check_folder,
    check_name,
    default_root,
    list_slice_paths,
    skip_message,
    slice_name,
    user_slice_name,
)

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
PROBE_LIMIT = 1 << 30  # the cap the preload probe asks for
PROBE_TIMEOUT_S = 120  # cuInit on a real GPU can take seconds; never hang the doctor

# What would steer the probe away from a private slice with the probe's cap.
_SLICE_VARS = re.compile(
    r"HAMI_(SLICE|SLICE_NAME|KERNEL_ID|SM_MODE)|CUDA_DEVICE_MEMORY_SHARED_CACHE"
    r"|CUDA_DEVICE_(MEMORY|SM)_LIMIT(_[0-9]+)?|LD_PRELOAD"
)
_PROBE = ("from hami_jupyter import driver_memory as d\n"
          "d.init()\n"
          "print(d.mem_get_info()[1])\n")
_NO_DRIVER_ADVICE = ("fine for trying things out: `hami-jupyter demo` runs on the simulated GPU; "
                     "install the NVIDIA driver to use real GPUs")
_COMES_WITH_DRIVER = "comes with the NVIDIA driver (see the driver check)"


@dataclass
class Check:
    name: str
    status: str  # PASS, WARN or FAIL
    detail: str
    advice: str = ""


def has_driver():
    return DRIVER_VERSION_FILE.is_file()


def _mapped_path(stem):
    """Where this process mapped the library whose file name starts with *stem*."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(stem):
                return fields[5].strip()
    return None


def _is_simulated(path):
    try:
        sim_dir = native.sim_library_dir().resolve()
    except FileNotFoundError:
        return False
    return path is not None and Path(path).resolve().parent == sim_dir


def _simulated_check(name, path):
    """The WARN for a driver library that the loader finds in the simulated GPU's folder."""
    if has_driver():
        advice = (f"LD_LIBRARY_PATH puts the simulated GPU before the real driver: remove "
                  f"{Path(path).parent} from it so kernels use the real GPUs")
    else:
        advice = "fine for the demo and tests; install the NVIDIA driver to use real GPUs"
    return Check(name, WARN, f"the simulated GPU's {Path(path).name} is loaded ({path})", advice)


# ---- the checks ---------------------------------------------------------------


def check_driver():
    """Is the NVIDIA kernel driver loaded?"""
    name = "NVIDIA driver"
    try:
        first = DRIVER_VERSION_FILE.read_text().splitlines()[0]
    except FileNotFoundError:
        return Check(name, WARN, f"no NVIDIA driver on this machine ({DRIVER_VERSION_FILE} is "
                     "absent)", _NO_DRIVER_ADVICE)
    except (OSError, IndexError) as e:
        return Check(name, FAIL, f"cannot read {DRIVER_VERSION_FILE}: {e}",
                     "the driver looks half-installed: reinstall it, or reboot after an upgrade")
    return Check(name, PASS, " ".join(first.split()))


def check_cuda_library():
    """Does ``libcuda.so.1`` load, and which one?"""
    name = "CUDA driver library"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        if not has_driver():
            return Check(name, WARN, "libcuda.so.1 not found", _COMES_WITH_DRIVER)
        return Check(name, FAIL, f"the driver is loaded but libcuda.so.1 is not: {e}",
                     "install the driver's CUDA library (the libnvidia-compute package of "
                     "your driver version); in a container, run it with the NVIDIA "
                     "container toolkit and NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    path = _mapped_path("libcuda.so")
    if _is_simulated(path):
        return _simulated_check(name, path)
    version = ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(version))  # needs no cuInit
    v = version.value
    return Check(name, PASS, f"{path or 'libcuda.so.1'} loads (CUDA {v // 1000}.{v % 1000 // 10})")


def check_nvml():
    """Does NVML answer, and with which GPUs?"""
    name = "NVML"
    try:
        found, version = gpus.host_gpus(), gpus.driver_version()
    except gpus.GpuFactsError as e:
        if e.stage == "missing":
            return Check(name, FAIL, str(e), "reinstall hami-jupyter: it depends on nvidia-ml-py")
        if e.stage == "list":
            return Check(name, FAIL, str(e),
                         "run nvidia-smi: if it fails too, the driver needs fixing first")
        if not has_driver():
            return Check(name, WARN, f"NVML unavailable ({e})", _COMES_WITH_DRIVER)
        return Check(name, FAIL, f"the driver is loaded but NVML does not start: {e}",
                     "install libnvidia-ml.so.1 of your driver version; after a driver upgrade, "
                     "reboot so the kernel module and the library match")
    path = _mapped_path("libnvidia-ml.so")
    if _is_simulated(path):
        return _simulated_check(name, path)
    if not found:
        return Check(name, FAIL, f"driver {version} sees no GPU",
                     "check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and that the GPUs "
                     "are passed to this container")
    listed = ", ".join(f"{g.index}: {g.name}" for g in found)
    return Check(name, PASS, f"driver {version}, {len(found)} GPU(s): {listed}")


def _probe_env(tmp):
    """Environment for the probe: a private slice, on the real GPU or else the simulated one."""
    env = {k: v for k, v in os.environ.items() if not _SLICE_VARS.fullmatch(k)}
    if has_driver():
        gpu = "GPU 0"
    else:
        env = {k: v for k, v in env.items() if not k.startswith("HAMI_SIM_")}
        env = native.sim_env(Path(tmp) / "sim-state", base=env,
                             HAMI_SIM_DEVICES=1, HAMI_SIM_MEMORY="16g")
        gpu = "the simulated GPU"
    # Test this copy of the package, whether or not it is the one installed.
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["CUDA_DEVICE_MEMORY_LIMIT"] = str(PROBE_LIMIT)
    return env, gpu


def check_preload():
    """Does ``libvgpu.so`` load into a process and hold it to its cap?

    A child Python, with the library preloaded and a 1 GiB cap in its
    environment, initialises CUDA and asks for the memory total: inside the
    slice it must be the cap.
    """
    name = "preload library"
    rebuild = ("rebuild it with `make -C native all` in the source checkout, or reinstall "
               "the package")
    try:
        library = native.library_path()
    except FileNotFoundError as e:
        return Check(name, FAIL, str(e), "kernels cannot be held to a slice without it")
    with tempfile.TemporaryDirectory(prefix="hami-doctor-") as tmp:
        try:
            env, gpu = _probe_env(tmp)
        except FileNotFoundError as e:
            return Check(name, WARN, f"{library} is there but was not tried: no NVIDIA driver, and {e}",
                         "build the simulated GPU (`make -C native sim`) to test it here")
        env["LD_PRELOAD"] = str(library)
        try:
            proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                                  text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Check(name, FAIL, f"a process with {library.name} preloaded did not finish "
                         f"cuInit on {gpu} within {PROBE_TIMEOUT_S} s",
                         "check that the GPU is healthy (nvidia-smi) and not held by a hung process")
    if proc.returncode != 0:
        said = " | ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit status {proc.returncode}"
        return Check(name, FAIL, f"with {library} preloaded, CUDA on {gpu} fails: {said}",
                     f"set HAMI_LOG_LEVEL=3 for the library's log; {rebuild}")
    total = int(proc.stdout.split()[-1])
    if total != PROBE_LIMIT:
        return Check(name, FAIL, f"with {library} preloaded and a {format_size(PROBE_LIMIT)} cap, "
                     f"{gpu} still shows {format_size(total)}: the library did not take hold",
                     f"check that nothing else is preloaded or replaces libcuda; {rebuild}")
    return Check(name, PASS, f"{library} loads; under a {format_size(PROBE_LIMIT)} cap, {gpu} "
                 f"shows {format_size(total)}, as it should")


def check_provisioner():
    """Is the ``hami-provisioner`` entry point registered, and does it import?"""
    name = "provisioner"
    reinstall = "reinstall the package (`pip install hami-jupyter`): its metadata registers it"
    eps = [ep for ep in entry_points(group="jupyter_client.kernel_provisioners")
           if ep.name == kernelspec.PROVISIONER]
    if not eps:
        return Check(name, FAIL, f"no {kernelspec.PROVISIONER!r} in the "
                     "jupyter_client.kernel_provisioners entry points", reinstall)
    try:
        eps[0].load()
    except Exception as e:  # any import error means kernels cannot start
        return Check(name, FAIL, f"{eps[0].value} does not import: {e}", reinstall)
    return Check(name, PASS, f"{kernelspec.PROVISIONER} -> {eps[0].value}")


def variable_origin(name, env=None):
    """``(who set the limit variable *name* here, how to fix it there)``, as far
    as this environment tells: the hub, HAMi's device plugin, or this shell."""
    env = os.environ if env is None else env
    if name.startswith("CUDA_DEVICE_") and env.get("KUBERNETES_SERVICE_HOST"):
        return ("HAMi's device plugin, from the pod's nvidia.com/gpumem and nvidia.com/gpucores",
                "fix those in the pod's resources (the KubeSpawner profile)")
    if env.get("JUPYTERHUB_API_TOKEN") or env.get("JUPYTERHUB_USER"):
        return ("JupyterHub, which gave it to this server",
                "fix it in the hub's configuration (the SlicePolicy sizes, or the spawner's "
                "environment) and restart the server")
    return ("this shell (or whatever started this process)",
            "correct or unset it there (an export in your shell or its start-up files)")


def _kernelspec_advice(entry):
    """What to do about a kernelspec whose limits are invalid: fix the place
    the bad value really comes from."""
    where, variable = entry.get("error_source") or ("kernelspec", None)
    if where == "environment":
        who, fix = variable_origin(variable)
        return (f"the bad value is not in the kernel.json: it is the environment variable "
                f"{variable}, set by {who}; {fix}. Until then every HAMi kernel started from "
                "here is refused")
    if where == "server config":
        files = ", ".join(entry.get("server_config_files") or []) or "jupyter_server_config"
        return (f"the bad value is not in the kernel.json: it comes from c.HamiProvisioner in the "
                f"Jupyter "
                f"server's configuration ({files}); fix it there. Until then every HAMi kernel "
                "of that server is refused")
    return (f"fix the value in {Path(entry['resource_dir']) / 'kernel.json'}, or rewrite it with "
            f"`hami-jupyter kernelspec install --name {entry['name']} ...`; kernels of it will "
            "not start")


def check_kernelspecs():
    """Does Jupyter find hami-python3, and are the limits of every HAMi kernelspec valid?"""
    name = "kernelspecs"
    found = kernelspec.hami_kernelspecs()
    bad = [k for k in found if "error" in k]
    if bad:
        advice = list(dict.fromkeys(_kernelspec_advice(k) for k in bad))  # one each, in order
        return Check(name, FAIL, "; ".join(f"{k['name']} ({k['resource_dir']}): {k['error']}"
                                           for k in bad), "; ".join(advice))
    names = [k["name"] for k in found]
    if kernelspec.SHIPPED not in names:
        status = WARN if names else FAIL
        have = f" (found: {', '.join(names)})" if names else ""
        return Check(name, status, f"Jupyter does not find the {kernelspec.SHIPPED} kernelspec{have}",
                     "reinstall the package, which ships it, or write it with `hami-jupyter "
                     f"kernelspec install --name {kernelspec.SHIPPED} --sys-prefix`")
    return Check(name, PASS, f"{len(found)} HAMi kernelspec(s): {', '.join(names)}")


def check_environment(env=None):
    """Are the limit variables of this environment valid?"""
    name = "limit variables"
    env = os.environ if env is None else env
    try:
        limits = resolve_limits({}, env)
        if env.get("HAMI_SLICE") and "/" not in env["HAMI_SLICE"]:
            check_name(env["HAMI_SLICE"])
    except (LimitError, SliceNameError) as e:
        bad = kernelspec.invalid_source({}, env) if isinstance(e, LimitError) else None
        variable = bad[1] if bad else "HAMI_SLICE" if isinstance(e, SliceNameError) else None
        fix = "fix or unset it"
        if variable:
            who, how = variable_origin(variable, env)
            fix = f"{variable} is set by {who}; {how}"
        return Check(name, FAIL, str(e), f"{fix}: kernels refuse to start while a limit is "
                     "invalid (no kernel runs unlimited in its place)")
    if limits.unlimited:
        return Check(name, PASS, "none set: kernels take their limits from their kernelspec "
                     "or the server's HamiProvisioner config")
    sources = ", ".join(sorted(set(limits.sources.values())))
    return Check(name, PASS, f"{limits.describe()} (from {sources})")


def _nearest_existing(path):
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_slice_root(root=None):
    """Does the slice root exist, or can it be created, and can we write there?"""
    name = "slice root"
    root = Path(root) if root else default_root()
    elsewhere = "set HAMI_SLICE_ROOT to a folder you can write"
    if root.is_dir():
        try:
            check_folder(root)
        except UntrustedPath as e:
            return Check(name, FAIL, e.detail, e.fix)
        if os.access(root, os.W_OK | os.X_OK):
            return Check(name, PASS, f"{root} (writable)")
        return _managed_root(name, root)
    if root.exists():
        return Check(name, FAIL, f"{root} exists but is not a folder", f"remove it, or {elsewhere}")
    parent = _nearest_existing(root)
    if os.access(parent, os.W_OK | os.X_OK):
        return Check(name, PASS, f"{root} does not exist yet; the first kernel creates it")
    return Check(name, FAIL, f"{root} does not exist and cannot be created ({parent} is not "
                 "writable)", elsewhere)


def _managed_root(name, root):
    """The check of a slice root this user cannot write: on a hub's set-up
    (root's folder) that is as it should be. Never advises leaving it: limits
    are the hub's to set, and a kernel outside its slice escapes them."""
    try:
        owner = root.stat().st_uid
    except OSError:
        owner = None
    own = root / f"{user_slice_name()}.slice"
    if owner != 0:
        return Check(name, WARN, f"{root} is not writable by this user: kernels can only join "
                     "slices that already exist there",
                     f"ask whoever manages it to create your slice ({own.name}) there")
    managed = f"{root} is managed by the hub (owned by root; you cannot write it)"
    if own.is_file():
        return Check(name, PASS, f"{managed}; your slice {own} is there")
    return Check(name, WARN, f"{managed}, and your slice {own} is not there yet: kernels can "
                 "only join slices that already exist there",
                 "the hub makes it when it starts your server: start (or restart) your server "
                 "from the hub, or ask an administrator to check the hub's log")


_START_GUARD = ("start it as root: `hami-jupyter agent`, the guard and the memory broker in one "
                "(examples/hami-agent.service runs it under systemd; docs/guard.md)")
_COOPERATIVE = ("memory caps are enforced only cooperatively, by the preload library in each "
                "process: a process without it, or one that gets around it, is not held")


def check_guard(root=None, now=None):
    """Does a guard watch the slices' real GPU memory (a fresh report in the slice root)?"""
    name = "guard"
    root = Path(root) if root else default_root()
    path = guard_report.report_path(root)
    try:
        report = guard_report.read_report(root, now=now)
    except guard_report.GuardReportError as e:
        return Check(name, WARN, f"{e}; until a guard writes one that can be read, {_COOPERATIVE}",
                     f"the guard replaces its report every interval: {_START_GUARD}")
    if report is None:
        return Check(name, WARN, f"no guard is running: no report {path}, so {_COOPERATIVE}",
                     _START_GUARD)
    now = time.time() if now is None else now
    age = now - (report.get("written_unix") or 0)
    interval = report.get("interval") or 0.5
    pid, host = report.get("guard_pid"), report.get("host")
    if report["stale"]:
        if host and host != socket.gethostname():
            where = f"it ran on host {host}"
        else:
            alive = guard_report.guard_pid_alive(report)
            where = f"its process {pid} " + ("still runs: stuck?" if alive else "is gone")
        return Check(name, WARN, f"the guard stopped writing {path}: the last report is {age:.0f} s "
                     f"old (it wrote every {interval:g} s); {where}. Until it writes again, "
                     f"{_COOPERATIVE}",
                     "restart it (systemctl restart hami-agent, under examples/hami-agent.service), "
                     f"or {_START_GUARD}")
    slices = report.get("slices") if isinstance(report.get("slices"), dict) else {}

    def is_over(entry):
        gpus = entry.get("gpus") if isinstance(entry, dict) else None
        return isinstance(gpus, dict) and any(isinstance(g, dict) and g.get("state") == "over"
                                              for g in gpus.values())

    over = sorted(n for n, entry in slices.items() if is_over(entry))
    detail = (f"running (pid {pid}{f' on {host}' if host else ''}): action {report.get('action')}, "
              f"a report every {interval:g} s ({path}, the last {age:.1f} s ago), "
              f"{len(slices)} slice(s) seen")
    if over:
        detail += f"; over their cap now: {', '.join(over)}"
    errors = [str(e) for e in report.get("errors") or []]
    if errors:
        return Check(name, WARN, f"{detail}; it cannot read: {'; '.join(errors)}",
                     "what it cannot read it cannot hold to the caps: check those GPUs with nvidia-smi")
    return Check(name, PASS, detail)


def _limit_problems(snap, raw):
    """(status, text) for each limit in the file that is invalid or has no effect.
    *raw* is the limit set in force as the file holds it: the snapshot's limits
    already read an unknown mode as the library does (hard), a share over 100
    as none."""
    problems = []
    entries = [("default", raw.fallback, 0)] + [
        (f"GPU {d.index}", raw.device[d.index] if not d.limit_is_fallback else raw.fallback,
         d.memory_total) for d in snap.devices if d.index < HAMI_SLICE_MAX_DEVICES]
    for label, limit, total in entries:
        if limit.sm_share > 100:
            problems.append((FAIL, f"{label}: SM share {limit.sm_share} % is over 100"))
        if limit.mode not in MODE_NUMBERS.values():
            problems.append((FAIL, f"{label}: unknown SM mode {limit.mode}"))
        if limit.memory_limit and total and limit.memory_limit > total:
            problems.append((WARN, f"{label}: memory cap {format_size(limit.memory_limit)} is "
                             f"more than the GPU's {format_size(total)}, so it has no effect"))
    return problems


def _slice_label(path):
    """``slice "alice"``: quoted, so that a slice named "root" (root's own) is
    never taken for the slice root check."""
    return f'slice "{slice_name(path)}"'


def check_slice(path):
    """Is the slice file readable, and are its limits valid?"""
    name = _slice_label(path)
    try:
        with SliceFile(path) as sf:
            snap = sf.snapshot()
            _, _, raw = sf.read_limits()
    except (SliceFileError, OSError) as e:
        detail, fix = explain(e, path)
        return Check(name, FAIL, detail, fix)
    problems = _limit_problems(snap, raw)
    detail = (f"{path}: layout {snap.version[0]}.{snap.version[1]}, "
              f"{snap.fallback_limit.describe()}, {len(snap.devices)} GPU(s) seen, "
              f"{len(snap.slots)} live process(es)")
    if not problems:
        return Check(name, PASS, detail)
    status = FAIL if any(s == FAIL for s, _ in problems) else WARN
    return Check(name, status, detail + "; " + "; ".join(t for _, t in problems),
                 "set valid limits (the admin panel, or restart its kernels from a kernelspec "
                 "with valid ones once none runs)")


def check_slices(root=None):
    """One check per slice file under the root."""
    root = Path(root) if root else default_root()
    skipped = []
    paths = list_slice_paths(root, skipped=skipped)
    # The root itself refused: no kernel can use a slice there (the library refuses too).
    refused = [Check("slices" if p == root else _slice_label(p), FAIL if p == root else WARN,
                     skip_message(p, e), "the slice tools leave it out until it is fixed")
               for p, e in skipped]
    if not paths and not refused:
        return [Check("slices", PASS, f"none under {root} yet (created when kernels start)")]
    others = [p for p in paths if not_yours(p)]
    checks = refused + [check_slice(p) for p in paths if p not in others]
    if others:
        # Other users' slices in a shared root (the hub's): theirs, not a fault.
        checks.append(Check("other slices", PASS, f"{len(others)} slice(s) of other users, which "
                            f"you cannot read: not yours, skipped "
                            f"({', '.join(slice_name(p) for p in others)})"))
    return checks


def not_yours(path):
    """True for a slice file another user owns that this user may not read: in a
    shared root (the hub's) that is as it should be, never a failure."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid != os.geteuid() and not os.access(path, os.R_OK)


def run_checks(slice_path=None):
    """Every check, in the order a set-up is built; only *slice_path* if given, else every slice."""
    checks = [check_driver(), check_cuda_library(), check_nvml(), check_preload(),
              check_provisioner(), check_kernelspecs(), check_environment(), check_slice_root(),
              check_guard(Path(slice_path).parent if slice_path else None)]
    checks += [check_slice(slice_path)] if slice_path else check_slices()
    return checks
