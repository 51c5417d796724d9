"""``HamiProvisioner``: start each notebook kernel inside its vGPU slice.

A :class:`~jupyter_client.provisioning.LocalProvisioner` that, before the
kernel process starts,

- works out the kernel's limits from every place one can be set: the
  kernelspec's provisioner ``config`` and ``env``, ``c.HamiProvisioner.*``,
  the server's environment (``HAMI_*``, HAMi's ``CUDA_DEVICE_*``). The
  strictest value of each field wins (see :mod:`hami_jupyter.slice.settings`
  for why); this happens after jupyter_client has merged the kernelspec's
  ``env`` into the kernel's environment, so no source is missed;
- works out the slice (by default the user's: every kernel of one user shares
  one slice; a kernelspec that sets limits of its own gets its own). Under
  JupyterHub (``HAMI_HUB_SLICE`` in the server's environment, see
  :mod:`.hub_slice`) it is always the hub's slice: a kernel that
  names another one is refused; one asking for a smaller memory cap gets it
  for each of its processes (``HAMI_PROCESS_MEMORY_LIMIT``), nested in the
  slice's; one asking for another stricter limit is refused (it cannot be
  nested yet); one that asks for more is started under the hub's limits,
  with a warning;
- makes sure the slice file exists and, while no process of it runs, carries
  those limits (:mod:`hami_jupyter.slice.create`). A slice that keeps other
  limits (it is in use and an administrator may have resized it, or the hub
  owns its limits file) is the authority: the kernel's environment is given
  the limits in force, and one warning names what was asked and what holds;
- appends the packaged ``libvgpu.so`` to the kernel's ``LD_PRELOAD`` and
  passes the slice's path and the kernel id in its environment, so every
  process the kernel starts is held to the slice and attributable to it;
- records the kernel in the slice's registry (:mod:`hami_jupyter.slice.registry`).

A bad limit raises :class:`SliceSetupError` before anything starts; Jupyter
shows its message to the user, and no unlimited kernel is ever started in
its place. Restart keeps the slice (the same kernel id comes back into the
same slice; after the kernel exited on its own, on new ports); shutdown
removes the kernel from the registry, and the kernel's slots in the slice
file free themselves when its processes exit (a killed process's are
reclaimed by the slice's next sweep).

Kernelspec example (``kernel.json``)::

    "metadata": {"kernel_provisioner": {
        "provisioner_name": "hami-provisioner",
        "config": {"memory_limit": "4g", "sm_limit": 25}}}

(``"env": {"CUDA_DEVICE_MEMORY_LIMIT": "4g"}`` in the same file counts too.)
"""

import getpass
import os
import re
from pathlib import Path

from jupyter_client.provisioning import KernelProvisionerFactory, LocalProvisioner
from traitlets import Int, Unicode, Union

from .. import native
from ..slice import registry
from ..slice.create import ensure_slice
from ..slice.file import SliceFileError, read_snapshot
from ..slice.limits import LimitError, parse_decoders
from ..slice.paths import SliceNameError, check_name, own_root, slice_name, slice_path, user_slice_name
from ..slice.settings import AskedLimits, resolve_limits
from . import hub_slice

# Limit traits that, set by a kernelspec, give that kernelspec a slice of its own.
_LIMIT_TRAITS = ("memory_limit", "sm_limit", "sm_mode", "max_decoders")
# The limit variables (a kernelspec's env setting one also gets its own slice).
# The kernel's environment is given the limits in force instead of these.
_LIMIT_VARIABLE = re.compile(
    r"HAMI_(MEMORY_LIMIT|SM_LIMIT|SM_MODE|MAX_DECODERS)|CUDA_DEVICE_(MEMORY|SM)_LIMIT(_[0-9]+)?")
_DECODERS_PER_GPU = re.compile(r"HAMI_MAX_DECODERS_([0-9]+)")


class SliceSetupError(RuntimeError):
    """The kernel cannot start in its slice; the message says why and what to fix."""


def _routing_in_force():
    """Whether this server sends every kernel through hami-provisioner: the
    provisioner factory in use says so (factory.HubSliceProvisionerFactory,
    made by factory.route_every_kernel once it proved the rule). Asked of
    jupyter_client's factory, not the factory module, which imports this one."""
    if not KernelProvisionerFactory.initialized():
        return False
    return getattr(KernelProvisionerFactory.instance(), "routes_every_kernel", False)


class HamiProvisioner(LocalProvisioner):
    """Launch local kernels with the vGPU preload library, inside a slice."""

    _exited_unasked = False  # the process exited without a shutdown asked (see cleanup)

    memory_limit = Union(
        [Unicode(), Int()], default_value=None, allow_none=True, config=True,
        help="""GPU memory cap of the slice, per GPU: bytes or a size such as
        "4g" or "4096m". HAMI_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_LIMIT (server
        or kernelspec env) and a kernelspec's memory_limit count too: the
        smallest of them holds. None of them set: no memory cap.""",
    )
    sm_limit = Union(
        [Int(), Unicode()], default_value=None, allow_none=True, config=True,
        help="""Compute (SM) share of the slice: a whole percent of each GPU,
        1-99; 0 or 100: no share. HAMI_SM_LIMIT, CUDA_DEVICE_SM_LIMIT and a kernelspec's
        sm_limit count too: the smallest share holds.""",
    )
    sm_mode = Unicode(
        None, allow_none=True, config=True,
        help="""How the SM share is held: "hard" (never above it) or "elastic"
        (idle GPU time may be used; under contention each slice gets its share).
        Elastic only when every place that sets a mode (this, a kernelspec's
        sm_mode, HAMI_SM_MODE) says elastic; else hard.""",
    )
    max_decoders = Union(
        [Int(), Unicode()], default_value=None, allow_none=True, config=True,
        help="""Video decoders (NVDEC) the slice may run at once on each GPU
        (0: no cap). HAMI_MAX_DECODERS and a kernelspec's max_decoders count
        too: the smallest cap holds.""",
    )
    slice = Unicode(
        None, allow_none=True, config=True,
        help="""The slice kernels start in: a name (a file under the slice root)
        or a path. Unset: HAMI_SLICE, then CUDA_DEVICE_MEMORY_SHARED_CACHE, then
        the user's name; a kernelspec that sets its own limits gets its own
        slice, "<user>-<kernelspec name>". Under JupyterHub (HAMI_HUB_SLICE set
        in the server's environment) every kernel runs in the hub's slice: a
        setting naming another slice refuses the kernel.""",
    )
    slice_root = Unicode(
        None, allow_none=True, config=True,
        help="""Folder of named slices. Unset: HAMI_SLICE_ROOT, else
        $XDG_RUNTIME_DIR/hami-jupyter, else /tmp/hami-jupyter-<uid>; never the
        hub's /run/hami-jupyter, where only servers the hub started (HAMI_HUB_SLICE)
        run kernels.""",
    )

    # ---- where limits come from ---------------------------------------------------

    def _kernelspec_config(self):
        """The kernelspec's provisioner ``config``, when it names this provisioner (under
        the hub, a kernelspec naming another is run by this one: its config is not ours)."""
        spec = getattr(self, "kernel_spec", None)
        meta = getattr(spec, "metadata", None) or {}
        stanza = meta.get("kernel_provisioner") or {}
        if stanza.get("provisioner_name", "hami-provisioner") != "hami-provisioner":
            return {}
        return stanza.get("config", {}) or {}

    def _kernelspec_env(self, env):
        """The kernelspec's ``env`` entries as the kernel gets them: their values in
        *env*, the kernel's environment after jupyter_client substituted and merged them."""
        spec_env = getattr(getattr(self, "kernel_spec", None), "env", None) or {}
        return {k: env[k] for k in spec_env if k in env}

    def _kernelspec_name(self):
        spec = getattr(self, "kernel_spec", None)
        resource_dir = getattr(spec, "resource_dir", "") or ""
        return os.path.basename(resource_dir.rstrip("/")) or "unknown"

    def _server_config(self):
        """``c.HamiProvisioner.*`` as the server's configuration sets it. The traits
        themselves cannot tell: a kernelspec's ``config`` replaces them."""
        try:
            mine = self._find_my_config(self.config)
        except Exception:  # traitlets without it: the traits are the best we have
            mine = {}
        return {t: mine[t] for t in _LIMIT_TRAITS if t in mine}

    def _limit_sources(self, env, server_env):
        """Every place a limit may come from, most specific first, for
        :func:`~hami_jupyter.slice.settings.resolve_limits`."""
        spec = f"kernelspec '{self._kernelspec_name()}'"
        return [
            (f"{spec} provisioner config", "config", self._kernelspec_config()),
            (f"{spec} env", "env", self._kernelspec_env(env)),
            ("server config c.HamiProvisioner", "config", self._server_config()),
            ("HamiProvisioner", "config", {t: getattr(self, t) for t in _LIMIT_TRAITS}),
            ("server environment", "env", server_env),
            ("Jupyter server process environment", "env", os.environ),
        ]

    def resolve_limits(self, env, server_env=None):
        """The limits asked for this kernel: the strictest over every source.

        *env* is the kernel's environment after jupyter_client merged the
        kernelspec's ``env`` into it; *server_env* the environment before
        (default: *env*)."""
        try:
            return resolve_limits({}, {}, layers=self._limit_sources(
                env, env if server_env is None else server_env))
        except LimitError as e:
            raise SliceSetupError(
                f"hami-jupyter: the kernel was not started because a GPU limit is invalid. {e}"
            ) from None

    def _kernelspec_sets_limits(self, env):
        return (any(self._kernelspec_config().get(t) is not None for t in _LIMIT_TRAITS)
                or any(_LIMIT_VARIABLE.fullmatch(k) or _DECODERS_PER_GPU.fullmatch(k)
                       for k in self._kernelspec_env(env)))

    # ---- working out the slice ------------------------------------------------

    def resolve_slice(self, env, hub=None):
        """Path of this kernel's slice, by the order the ``slice`` help gives; under
        the hub (*hub*: the hub's slice), that slice, after checking that nothing
        names another (SliceSetupError)."""
        if hub is not None:
            return self._hub_slice(env, hub)
        ref = self.slice or env.get("HAMI_SLICE") or env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        try:
            if not ref:
                ref = user_slice_name(env)
                if self._kernelspec_sets_limits(env):
                    ref = check_name(f"{ref}-{self._kernelspec_name()}"[:63])
            # Not the hub's folder: this server is no server of the hub's (paths.own_root).
            path = slice_path(ref, root=self.slice_root or own_root(env), env=env)
        except SliceNameError as e:
            raise SliceSetupError(f"hami-jupyter: {e}") from None
        return path.absolute()

    # ---- under the hub ----------------------------------------------------------

    def _hub_slice(self, env, hub):
        """*hub*, once no setting of this kernel names another slice."""
        spec = f"kernelspec '{self._kernelspec_name()}'"
        spec_env = self._kernelspec_env(env)
        refs = [(self.slice, f"{spec} provisioner config 'slice'"
                 if self._kernelspec_config().get("slice") else "c.HamiProvisioner.slice")]
        for name in ("HAMI_SLICE", "CUDA_DEVICE_MEMORY_SHARED_CACHE"):
            refs.append((env.get(name), f"{spec} env {name}" if name in spec_env
                         else f"{name} in the server's environment"))
        for ref, where in refs:
            if ref and hub_slice.refers_elsewhere(ref, hub, root=self.slice_root or None, env=env):
                raise SliceSetupError(
                    f"hami-jupyter: the kernel was not started: {where} names slice {ref}, but "
                    f"JupyterHub gave this server the slice {hub}, and {hub_slice.APPLIES}. "
                    f"Remove the slice setting ({where}); the kernel then runs in the hub's slice.")
        return hub

    def _kernel_asks(self, env):
        """The limits this kernel's own settings ask for (its kernelspec, the server's
        c.HamiProvisioner): not the server's environment, which is the hub's."""
        try:
            return resolve_limits({}, {}, layers=[
                layer for layer in self._limit_sources(env, {}) if layer[1] == "config"
                or layer[0].startswith("kernelspec")])
        except LimitError as e:  # resolve_limits has checked every source already
            raise SliceSetupError(
                f"hami-jupyter: the kernel was not started because a GPU limit is invalid. {e}"
            ) from None

    def _check_hub_limits(self, path, env):
        """Under the hub: a smaller memory cap for every GPU is nested (returned:
        each process of the kernel is held to it); anything else stricter than
        the slice at *path* holds is refused (it cannot be nested yet); more
        than it holds is not applied, with one warning. Returns None when no
        nested cap applies. Runs before :func:`ensure_slice`, so that nothing
        of the kernel's is applied before it is checked."""
        try:
            held = hub_slice.held_by(read_snapshot(path))
        except (OSError, SliceFileError) as e:
            raise SliceSetupError(f"hami-jupyter: cannot read the hub's slice {path}: {e}") from None
        asked = self._kernel_asks(env)
        stricter, looser = hub_slice.compare(asked, held)
        holds = hub_slice.describe_held(held)
        nested = hub_slice.nested_memory_cap(stricter, asked)
        if nested:
            self.log.info(
                "hami-jupyter: kernel %s asks for %s, inside the hub's slice %s (%s): each of its "
                "processes is held to it (%s), and the slice's cap holds for all of them",
                self.kernel_id, "; ".join(f"{text} ({source})" for _, text, source in stricter),
                path, holds, hub_slice.PROCESS_CAP)
        elif stricter:
            asks = "; ".join(f"{text} ({source})" for _, text, source in stricter)
            raise SliceSetupError(
                f"hami-jupyter: the kernel was not started: it asks for {asks}, stricter than "
                f"the hub's slice {path} holds ({holds}); {hub_slice.NESTED}. Remove the "
                "limit from the kernelspec (or c.HamiProvisioner), or ask the hub's administrator "
                "for a smaller slice.")
        if looser:
            self.log.warning(
                "hami-jupyter: kernel %s asks for %s, but %s and its slice %s holds %s: the "
                "hub's limits apply", self.kernel_id,
                "; ".join(f"{text} ({source})" for _, text, source in looser),
                hub_slice.APPLIES, path, holds)
        return nested

    def _limits_in_force(self, path, asked, outcome, hub=False):
        """``(limits, snapshot)``: the limits the slice at *path* holds its
        processes to, after :func:`ensure_slice` said *outcome*, and the slice
        as read then (None when the kernel creates it). Warns once when they
        are not *asked* (under the *hub*, where :meth:`_check_hub_limits` has
        said what counts to the user, only at info level: an administrator's
        change is no news)."""
        if outcome == "deferred":  # the kernel creates the file from its environment
            return asked, None
        snap = read_snapshot(path)
        held = snap.fallback_limit
        authority = f"the hub's limits file {snap.limits_file}" if snap.limits_file else "the slice file"
        in_force = AskedLimits(held, sources=dict.fromkeys(
            ("memory_limit", "sm_share", "mode", "max_decoders"), authority))
        want = asked.limits.in_effect()
        own = [d for d in snap.devices if not d.limit_is_fallback and d.limit.in_effect() != want]
        if want == held.in_effect() and not own and not asked.per_gpu:
            return in_force, snap
        holds = held.describe() + "".join(f"; GPU {d.uuid}: {d.limit.describe()}" for d in own)
        if snap.limits_file:
            why = "the hub owns its limits"
        elif snap.slots:
            why = (f"{len(snap.slots)} process(es) of the slice are running, and a kernel start "
                   "does not undo limits an administrator may have set live")
        elif not os.access(path, os.W_OK):
            why = "this server cannot write the slice file"
        elif asked.per_gpu:
            why = "per-GPU limits (_<n> variables) only reach a slice that a kernel creates"
        else:
            why = "the slice file kept them"
        (self.log.info if hub else self.log.warning)(
            "hami-jupyter: kernel %s asked for %s, but slice %s holds %s (%s); the slice's "
            "limits apply, and the kernel's environment carries them", self.kernel_id,
            asked.describe(), path, holds, why)
        return in_force, snap

    # ---- the launch -------------------------------------------------------------

    def _kernel_environment(self, env, limits, sources, creates, hub=False):
        """Replace every limit variable of the kernel's *env* by *limits*: what
        the kernel reads agrees with what its slice enforces. Under the *hub*,
        by none: the hub's limits file holds them, an administrator may change
        them while the kernel runs, and an environment cannot follow (what
        holds is what ``%hami status`` shows). When the kernel
        *creates* the slice file, ``HAMI_MAX_DECODERS_<n>`` (which *limits*
        does not carry) keep, per GPU, the fewest decoders any source asks,
        never more than *limits*; otherwise the file's entries hold."""
        per_gpu = {}
        for label, kind, mapping in sources if creates else ():
            for name, value in mapping.items() if kind == "env" else ():
                if _DECODERS_PER_GPU.fullmatch(name):
                    try:
                        n = parse_decoders(value, name)
                    except LimitError as e:
                        raise SliceSetupError(f"hami-jupyter: the kernel was not started because "
                                              f"a GPU limit is invalid. {label}: {e}") from None
                    if n and (name not in per_gpu or n < per_gpu[name]):
                        per_gpu[name] = n
        for name in [k for k in env if _LIMIT_VARIABLE.fullmatch(k) or _DECODERS_PER_GPU.fullmatch(k)]:
            del env[name]
        if hub:
            return
        env.update(limits.environment())
        cap = limits.limits.max_decoders
        env.update({k: str(v) for k, v in per_gpu.items() if not cap or v < cap})

    async def _release_ports(self):
        """Remove the connection file and give back the ports reserved for the
        kernel: the next launch reserves new ones."""
        km = self.parent
        if km is not None and hasattr(km, "cleanup_connection_file"):
            km.cleanup_connection_file()
        await super().cleanup(restart=False)
        self.ports_cached = False

    async def _abandon_launch(self):
        """Undo what jupyter_client's part of a first launch prepared (the
        connection file, the ports it reserved): no kernel will use them."""
        if getattr(self, "_slice_path", None) is not None:
            return  # a restart: the kernel manager still owns them
        await self._release_ports()

    async def pre_launch(self, **kwargs):
        # The server's environment for the kernel, before jupyter_client adds the kernelspec's env.
        server_env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        try:
            library = str(native.library_path())
        except FileNotFoundError as e:
            raise SliceSetupError(f"hami-jupyter: cannot start the kernel in a slice: {e}") from None

        # LocalProvisioner builds the command; the base class merges the
        # kernelspec's env (with ${VAR} substitution) into the kernel's, and
        # _finalize_env tidies it. Limits are worked out from the result.
        kwargs = await super().pre_launch(**kwargs)
        env = kwargs["env"]
        try:
            try:  # the server's own environment says whether the hub manages the slice
                hub = hub_slice.hub_slice(os.environ) or hub_slice.hub_slice(server_env)
            except hub_slice.HubSliceError as e:
                raise SliceSetupError(f"hami-jupyter: the kernel was not started: {e}") from None
            if hub is not None and _in_jupyter_server(self.parent) and not _routing_in_force():
                raise SliceSetupError(
                    f"hami-jupyter: the kernel was not started: JupyterHub gave this server the "
                    f"slice {hub}, but hami-jupyter's server extension is not in force in it "
                    "(a Jupyter config file of yours may turn it off: \"hami_jupyter\": false "
                    "under ServerApp.jpserver_extensions; `jupyter server extension list` shows "
                    f"it), so kernels could start outside the slice. Remove that setting, then "
                    "stop and start your server from the hub's control panel.")
            asked = self.resolve_limits(env, server_env)
            path = self.resolve_slice(env, hub)
            if hub is not None and not path.exists():
                raise SliceSetupError(
                    f"hami-jupyter: the kernel was not started: the hub's slice {path} does not "
                    f"exist, and {hub_slice.APPLIES}. Stop and start your server from the hub's "
                    "control panel: the hub makes the slice when the server starts.")
            nested = None
            if hub is not None:  # before ensure_slice could apply any limit of the kernel's
                nested = self._check_hub_limits(path, env)
            try:
                outcome = ensure_slice(path, slice_name(path), asked)
                limits, snap = self._limits_in_force(path, asked, outcome, hub=hub is not None)
            except (OSError, ValueError, SliceFileError) as e:
                raise SliceSetupError(
                    f"hami-jupyter: cannot prepare slice file {path}: {e}. "
                    "Check that the slice root is writable, or remove a corrupt file."
                ) from None
            self._kernel_environment(env, limits, self._limit_sources(env, server_env),
                                     creates=outcome == "deferred", hub=hub is not None)
            if nested:
                env[hub_slice.PROCESS_CAP] = str(nested)
        except SliceSetupError:
            await self._abandon_launch()
            raise
        self.log.info("hami-jupyter: kernel %s starts in slice %s under %s",
                      self.kernel_id, path, _in_force_text(snap, limits, outcome))

        preload = env.get("LD_PRELOAD", "")
        entries = [p for p in preload.replace(" ", ":").split(":") if p]
        if not any(_same_file(p, library) for p in entries):  # the hub's server has it already
            entries.append(library)
        env["LD_PRELOAD"] = ":".join(entries)
        env["HAMI_SLICE"] = str(path)
        env["HAMI_KERNEL_ID"] = str(self.kernel_id)
        env.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE", None)  # HAMI_SLICE says it now
        self._slice_path = path
        # The notebook the kernel starts for (jupyter_server's session), named
        # as the server's file browser names it: every list of kernels shows it.
        self._notebook = registry.notebook_of(env.get("JPY_SESSION_NAME"), self._server_root())
        return kwargs

    def _server_root(self):
        """The Jupyter server's root folder (its kernels' manager knows it), or None."""
        manager = getattr(self.parent, "parent", None)
        root = getattr(manager, "root_dir", None)
        return root if isinstance(root, str) and root else None

    async def launch_kernel(self, cmd, **kwargs):
        info = await super().launch_kernel(cmd, **kwargs)
        try:
            registry.register(self._slice_path, registry.new_entry(
                self._slice_path, str(self.kernel_id),
                os.environ.get("JUPYTERHUB_USER") or getpass.getuser(),
                self._kernelspec_name(), self.pid, getattr(self, "_notebook", "")))
        except OSError as e:  # the kernel runs in its slice either way
            self.log.warning("hami-jupyter: cannot record kernel %s in %s: %s",
                             self.kernel_id, self._slice_path, e)
        return info

    async def poll(self):
        status = await super().poll()
        if status is not None and not getattr(self.parent, "shutting_down", False):
            self._exited_unasked = True
        return status

    async def cleanup(self, restart=False):
        # jupyter_client restarts a kernel on the ports it reserved at the first
        # launch. After the kernel exited unasked, another process may hold one
        # of them now (an outgoing connection lands on any free port), and each
        # automatic restart would fail to bind until Jupyter Server drops the
        # kernel. So that restart reserves new ports and writes a new connection
        # file; a restart the user asks for keeps them.
        if restart and self._exited_unasked:
            self._exited_unasked = False
            await self._release_ports()
        else:
            await super().cleanup(restart=restart)
        path = getattr(self, "_slice_path", None)
        if path is not None and not restart:
            registry.unregister(path, str(self.kernel_id))

    @property
    def slice_path(self):
        """The slice file this kernel runs in (None before its first launch)."""
        return getattr(self, "_slice_path", None)

    async def get_provisioner_info(self):
        info = await super().get_provisioner_info()
        info["hami_slice"] = str(getattr(self, "_slice_path", "") or "")
        return info

    async def load_provisioner_info(self, provisioner_info):
        await super().load_provisioner_info(provisioner_info)
        if provisioner_info.get("hami_slice"):
            self._slice_path = Path(provisioner_info["hami_slice"])


def _same_file(a, b):
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:
        return False


def _in_jupyter_server(kernel_manager):
    """Whether *kernel_manager* is a Jupyter server's (not nbclient's, say, in a terminal)."""
    try:
        from jupyter_server.services.kernels.kernelmanager import ServerKernelManager
    except ImportError:
        return False
    return isinstance(kernel_manager, ServerKernelManager)


def _in_force_text(snap, limits, outcome):
    """For a kernel start's log line: the limits in force in the slice (*limits*
    and the snapshot *snap* that ``_limits_in_force`` read), the GPUs with
    limits of their own, and whose they are (the hub's limits file, or the
    slice file and what :func:`ensure_slice` did with it: *outcome*)."""
    if outcome == "deferred":
        return f"{limits.describe()} (from its environment; the kernel creates the slice file)"
    own = [d for d in snap.devices if not d.limit_is_fallback]
    text = limits.describe() + (" by default" if own else "") + "".join(
        f"; GPU {d.uuid}: {d.limit.describe()}" for d in own)
    source = limits.sources.get("memory_limit") or "the slice file"
    if source == "the slice file":
        source += {"created": ", created now", "updated": ", updated now"}.get(
            outcome, ", whose limits stand")
    return f"{text} (limits in force, from {source})"
