"""``HamiProvisioner``: start each notebook kernel inside its vGPU slice.

A :class:`~jupyter_client.provisioning.LocalProvisioner` that, before the
kernel process starts,

- works out the slice (by default the user's: every kernel of one user shares
  one slice) and its limits (see :mod:`hami_jupyter.limits` for the order);
- makes sure the slice file exists and, while no process of it runs, carries
  those limits (:mod:`hami_jupyter.slice_setup`);
- appends the packaged ``libvgpu.so`` to the kernel's ``LD_PRELOAD`` and
  passes the slice's path and the kernel id in its environment, so every
  process the kernel starts is held to the slice and attributable to it;
- records the kernel in the slice's registry (:mod:`hami_jupyter.kernel_registry`).

A bad limit raises :class:`SliceSetupError` before anything starts; Jupyter
shows its message to the user, and no unlimited kernel is ever started in
its place. Restart keeps the slice (the same kernel id comes back into the
same slice); shutdown removes the kernel from the registry, and the kernel's
slots in the slice file free themselves when its processes exit (a killed
process's are reclaimed by the slice's next sweep).

Kernelspec example (``kernel.json``)::

    "metadata": {"kernel_provisioner": {
        "provisioner_name": "hami-provisioner",
        "config": {"memory_limit": "4g", "sm_limit": 25}}}
"""

import getpass
import os
from pathlib import Path

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Int, Unicode, Union

from . import kernel_registry, native
from .limits import LimitError, resolve_limits
from .slice_file import SliceFileError
from .slice_paths import SliceNameError, check_name, slice_name, slice_path, user_slice_name
from .slice_setup import ensure_slice

# Limit traits that, set by a kernelspec, give that kernelspec a slice of its own.
_LIMIT_TRAITS = ("memory_limit", "sm_limit", "sm_mode", "max_decoders")


class SliceSetupError(RuntimeError):
    """The kernel cannot start in its slice; the message says why and what to fix."""


class HamiProvisioner(LocalProvisioner):
    """Launch local kernels with the vGPU preload library, inside a slice."""

    memory_limit = Union(
        [Unicode(), Int()], default_value=None, allow_none=True, config=True,
        help="""GPU memory cap of the slice, per GPU: bytes or a size such as
        "4g" or "4096m". Unset: HAMI_MEMORY_LIMIT, then CUDA_DEVICE_MEMORY_LIMIT
        from the server's environment; none of them means no memory cap.""",
    )
    sm_limit = Union(
        [Int(), Unicode()], default_value=None, allow_none=True, config=True,
        help="""Compute (SM) share of the slice in percent of each GPU, 1-99
        (0 or 100: none). Unset: HAMI_SM_LIMIT, then CUDA_DEVICE_SM_LIMIT.""",
    )
    sm_mode = Unicode(
        None, allow_none=True, config=True,
        help="""How the SM share is held: "hard" (never above it) or "elastic"
        (idle GPU time may be used; under contention each slice gets its share).
        Unset: HAMI_SM_MODE, else hard.""",
    )
    max_decoders = Union(
        [Int(), Unicode()], default_value=None, allow_none=True, config=True,
        help="""Video decoders (NVDEC) the slice may run at once on each GPU
        (0: no cap). Unset: HAMI_MAX_DECODERS.""",
    )
    slice = Unicode(
        None, allow_none=True, config=True,
        help="""The slice kernels start in: a name (a file under the slice root)
        or a path. Unset: HAMI_SLICE, then CUDA_DEVICE_MEMORY_SHARED_CACHE, then
        the user's name; a kernelspec that sets its own limits gets its own
        slice, "<user>-<kernelspec name>".""",
    )
    slice_root = Unicode(
        None, allow_none=True, config=True,
        help="""Folder of named slices. Unset: HAMI_SLICE_ROOT, /run/hami-jupyter
        when it exists, $XDG_RUNTIME_DIR/hami-jupyter, /tmp/hami-jupyter-<uid>.""",
    )

    # ---- working out the slice ------------------------------------------------

    def _kernelspec_config(self):
        spec = getattr(self, "kernel_spec", None)
        meta = getattr(spec, "metadata", None) or {}
        return meta.get("kernel_provisioner", {}).get("config", {}) or {}

    def _kernelspec_name(self):
        spec = getattr(self, "kernel_spec", None)
        resource_dir = getattr(spec, "resource_dir", "") or ""
        return os.path.basename(resource_dir.rstrip("/")) or "unknown"

    def resolve_slice(self, env):
        """Path of this kernel's slice, by the order the ``slice`` help gives."""
        ref = self.slice or env.get("HAMI_SLICE") or env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        try:
            if not ref:
                ref = user_slice_name(env)
                if any(self._kernelspec_config().get(t) is not None for t in _LIMIT_TRAITS):
                    ref = check_name(f"{ref}-{self._kernelspec_name()}"[:63])
            path = slice_path(ref, root=self.slice_root or None, env=env)
        except SliceNameError as e:
            raise SliceSetupError(f"hami-jupyter: {e}") from None
        return path.absolute()

    def resolve_limits(self, env):
        try:
            return resolve_limits(
                {"memory_limit": self.memory_limit, "sm_limit": self.sm_limit,
                 "sm_mode": self.sm_mode, "max_decoders": self.max_decoders},
                env,
            )
        except LimitError as e:
            raise SliceSetupError(
                f"hami-jupyter: the kernel was not started because a GPU limit is invalid. {e}"
            ) from None

    # ---- the launch -------------------------------------------------------------

    async def pre_launch(self, **kwargs):
        base_env = kwargs.get("env") or os.environ
        limits = self.resolve_limits(base_env)
        path = self.resolve_slice(base_env)
        try:
            library = str(native.library_path())
        except FileNotFoundError as e:
            raise SliceSetupError(f"hami-jupyter: cannot start the kernel in a slice: {e}") from None
        try:
            outcome = ensure_slice(path, slice_name(path), limits)
        except (OSError, ValueError, SliceFileError) as e:
            raise SliceSetupError(
                f"hami-jupyter: cannot prepare slice file {path}: {e}. "
                "Check that the slice root is writable, or remove a corrupt file."
            ) from None
        self.log.info("hami-jupyter: kernel %s starts in slice %s (%s; %s)",
                      self.kernel_id, path, limits.describe(), outcome)

        kwargs = await super().pre_launch(**kwargs)
        env = kwargs["env"]
        preload = env.get("LD_PRELOAD", "")
        entries = [p for p in preload.replace(" ", ":").split(":") if p]
        if library not in entries:
            entries.append(library)
        env["LD_PRELOAD"] = ":".join(entries)
        env["HAMI_SLICE"] = str(path)
        env["HAMI_KERNEL_ID"] = str(self.kernel_id)
        env.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE", None)  # HAMI_SLICE says it now
        # Only read when the kernel creates the file itself ("deferred"), or by
        # NVML for a GPU no process of the slice has met; same values either way.
        env.update(limits.environment())
        self._slice_path = path
        return kwargs

    async def launch_kernel(self, cmd, **kwargs):
        info = await super().launch_kernel(cmd, **kwargs)
        try:
            kernel_registry.register(self._slice_path, kernel_registry.new_entry(
                self._slice_path, str(self.kernel_id),
                os.environ.get("JUPYTERHUB_USER") or getpass.getuser(),
                self._kernelspec_name(), self.pid))
        except OSError as e:  # the kernel runs in its slice either way
            self.log.warning("hami-jupyter: cannot record kernel %s in %s: %s",
                             self.kernel_id, self._slice_path, e)
        return info

    async def cleanup(self, restart=False):
        await super().cleanup(restart=restart)
        path = getattr(self, "_slice_path", None)
        if path is not None and not restart:
            kernel_registry.unregister(path, str(self.kernel_id))

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
