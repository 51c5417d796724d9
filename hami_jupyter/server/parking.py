"""Parking in the Jupyter server: when to park an idle kernel, and its next cell's resume.

``c.HamiParking.enabled = True`` (off by default; the hub examples turn it
on) parks a kernel of this server that has been idle for ``idle_seconds``
(jupyter_server's execution state and last activity, and no GPU call by any
of its processes that long) and holds at least ``min_bytes`` of GPU memory:
always, or with ``when = "pressure"`` only while a GPU it uses has less than
``pressure_free_fraction`` of its memory free or some kernel's resume waits
for room. The moves are :mod:`hami_jupyter.slice.parking`'s.

A parked kernel comes back when its work needs the GPU, never because a
page was opened. Its next cell: the kernel websocket connection
(:class:`ParkingConnectionMixin`, put in front of the server's own class)
holds an ``execute_request`` for a kernel that is parked (or being parked)
until its GPU state is back, writes one line into the cell ("GPU memory
restored: 8.0 GiB in 2.4 s"; while it waits, what for), then sends it on in
order. A resume that finds no room within ``resume_timeout`` answers the cell
with an error instead, and the kernel stays parked, nothing lost. Anything
else goes to the kernel as it is: a browser tab that opens the notebook sends
``kernel_info_request`` and, with ipywidgets, a ``comm_open`` and
``comm_msg`` of its widget manager (``jupyter.widget.control``), which once
brought the kernel's GPU memory back 0.2 s after a page load; and a process
of the kernel that calls CUDA (a widget's handler, a thread, a timer) asks
for its state back on its own through the library's parking gate, with or
without a server (issue 35, item 1).
"""

import asyncio
import time
from datetime import datetime, timezone

from traitlets import Bool, Enum, Float, Int, TraitError, Unicode, Union, validate
from traitlets.config import LoggingConfigurable

from ..gpus import read_gpus
from ..provisioning.provisioner import HamiProvisioner
from ..slice import parking
from ..slice.file import SliceFileError, read_snapshot
from ..slice.size import format_size, parse_size
from ..slice.status import PARK_REASON_WORDS, PARK_REASONS

# The messages a kernel is resumed for before it sees them: a cell. Comm traffic
# is not (a page load sends some); its GPU work comes back through the gate.
RUN_CODE = ("execute_request",)


def _bytes(value, what):
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    try:
        return parse_size(value)
    except (TypeError, ValueError):
        raise TraitError(f"HamiParking.{what}: {value!r} is not a size such as 256m or 2g") from None


class HamiParking(LoggingConfigurable):
    """When the server parks its idle kernels, and how long a cell waits for a resume."""

    enabled = Bool(False, config=True, help="""Park idle kernels. Off by default.""")
    idle_seconds = Float(900.0, config=True, help="""Seconds a kernel must be idle (no cell
        running, no message, no GPU call) before it is parked.""")
    min_bytes = Union([Int(), Unicode()], default_value="256m", config=True, help="""Park only
        kernels holding at least this much GPU memory: a size, e.g. "256m".""")
    when = Enum(["always", "pressure"], "always", config=True, help="""always: park every idle
        kernel; pressure: only while a GPU it uses is short of free memory (see
        pressure_free_fraction) or some kernel's resume waits for room.""")
    pressure_free_fraction = Float(0.1, config=True, help="""With when = "pressure": a GPU is
        short of memory when less than this fraction of it is free.""")
    resume_timeout = Float(300.0, config=True, help="""Seconds a cell waits for its kernel's GPU
        memory to come back before it fails (the kernel then stays parked).""")
    host_memory_reserve = Union([Int(), Unicode()], default_value="2g", config=True, help="""Host
        memory that must stay available after a park: a size. A kernel whose GPU state does not
        fit beside it is not parked.""")
    check_interval = Float(5.0, config=True, help="""Seconds between two looks for idle kernels.""")

    @validate("min_bytes", "host_memory_reserve")
    def _valid_size(self, proposal):
        _bytes(proposal["value"], proposal["trait"].name)
        return proposal["value"]

    @validate("idle_seconds", "resume_timeout", "check_interval")
    def _positive(self, proposal):
        if not proposal["value"] > 0:
            raise TraitError(f"HamiParking.{proposal['trait'].name} must be above 0")
        return proposal["value"]


class ParkingManager:
    """Parks the idle kernels of one server, and resumes them for their cells."""

    def __init__(self, serverapp, config):
        self.serverapp, self.config, self.log = serverapp, config, serverapp.log
        self._task = None
        self._busy = set()  # kernels being parked or resumed by this server now

    # ---- which kernels ------------------------------------------------------

    @property
    def kernel_manager(self):
        return self.serverapp.kernel_manager

    def slice_of(self, kernel_id):
        """The slice file of one of this server's kernels, or None (not in a slice)."""
        if kernel_id not in self.kernel_manager:
            raise KeyError(kernel_id)
        provisioner = getattr(self.kernel_manager.get_kernel(kernel_id), "provisioner", None)
        return provisioner.slice_path if isinstance(provisioner, HamiProvisioner) else None

    def state(self, kernel_id):
        """"running", "parking", "parked", "resuming", or None outside a slice or the GPU."""
        path = self.slice_of(kernel_id)
        if path is None:
            return None
        try:
            return parking.park_state(read_snapshot(path), kernel_id)
        except (OSError, SliceFileError):
            return None

    def reason(self, kernel_id):
        """Why the kernel is parked, in its user's words ("to make room for another
        user's work"), or None when no process of it says (hami_slot.park_reason)."""
        path = self.slice_of(kernel_id)
        if path is None:
            return None
        try:
            slots = parking.kernel_slots(read_snapshot(path), kernel_id)
        except (OSError, SliceFileError):
            return None
        named = [PARK_REASONS.get(s.park_reason) for s in slots if s.park_reason]
        return PARK_REASON_WORDS.get(named[0]) if named else None

    # ---- parking --------------------------------------------------------------

    async def park(self, kernel_id, why="asked", reason="asked"):
        """Park one kernel (in a worker thread: the moves take seconds); a
        ParkResult. *why* is for the log; *reason* (idle, asked) for the slot,
        where the kernel's user sees it."""
        path = self.slice_of(kernel_id)
        if path is None:
            raise parking.ParkError(f"kernel {kernel_id} is not in a GPU slice")
        if kernel_id in self._busy:
            raise parking.ParkError(f"kernel {kernel_id} is being parked or resumed already")
        self._busy.add(kernel_id)
        try:
            reserve = _bytes(self.config.host_memory_reserve, "host_memory_reserve")
            result = await asyncio.to_thread(parking.park_kernel, path, kernel_id,
                                             host_reserve=reserve, reason=reason)
        finally:
            self._busy.discard(kernel_id)
        self.log.info("hami-jupyter: parked kernel %s (%s): %s to host memory in %.1f s",
                      kernel_id, why, format_size(result.bytes), result.seconds)
        return result

    async def resume(self, kernel_id, on_wait=None, timeout=None):
        """Bring a parked kernel's GPU state back; ``(bytes, seconds)``, ``(0, 0)``
        when nothing was parked. ResumeTimeout when it does not come in time."""
        path = self.slice_of(kernel_id)
        if path is None or self.state(kernel_id) in (None, "running"):
            return 0, 0.0
        timeout = self.config.resume_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()

        def waiting(why):  # called from the worker thread
            if on_wait is not None:
                loop.call_soon_threadsafe(on_wait, why)

        self._busy.add(kernel_id)
        try:
            bytes_, seconds = await asyncio.to_thread(parking.resume_kernel, path, kernel_id,
                                                      timeout, waiting)
        finally:
            self._busy.discard(kernel_id)
        self.log.info("hami-jupyter: resumed kernel %s: %s back on the GPU in %.1f s", kernel_id,
                      format_size(bytes_), seconds)
        return bytes_, seconds

    # ---- the policy -------------------------------------------------------------

    def _idle_for(self, kernel, snapshot, kernel_id, now):
        """Seconds the kernel has been idle: no cell, no message, no GPU call."""
        if getattr(kernel, "execution_state", None) != "idle":
            return 0.0
        last = getattr(kernel, "last_activity", None)
        if last is None:
            return 0.0
        if last.tzinfo is None:
            last = last.replace(tzinfo=timezone.utc)
        idle = (datetime.now(timezone.utc) - last).total_seconds()
        gpu = max((s.gpu_active_unix_ns for s in parking.kernel_slots(snapshot, kernel_id)),
                  default=0) / 1e9
        return min(idle, now - gpu) if gpu else idle

    def _pressure(self, snapshot, kernel_id):
        """Whether a GPU the kernel uses is short of memory, or a resume waits for room."""
        for s in snapshot.slots:
            if s.park_wanted and s.park_wait:
                return True
        uuids = {d.uuid for d in snapshot.devices
                 for s in parking.kernel_slots(snapshot, kernel_id) if s.memory_used.get(d.index)}
        gpus, _ = read_gpus()
        return any(g.uuid in uuids and g.memory_total and g.memory_used is not None and
                   (g.memory_total - g.memory_used) < self.config.pressure_free_fraction * g.memory_total
                   for g in gpus)

    def candidates(self):
        """``[(kernel_id, why)]``: the kernels of this server that the policy would park now."""
        out, now = [], time.time()
        floor = _bytes(self.config.min_bytes, "min_bytes")
        for kernel_id in list(self.kernel_manager.list_kernel_ids()):
            try:
                path = self.slice_of(kernel_id)
                if path is None or kernel_id in self._busy:
                    continue
                snap = read_snapshot(path)
            except (KeyError, OSError, SliceFileError):
                continue
            if parking.park_state(snap, kernel_id) != "running":
                continue
            held = sum(sum(s.memory_used.values()) for s in parking.kernel_slots(snap, kernel_id))
            if held < max(floor, 1):
                continue
            idle = self._idle_for(self.kernel_manager.get_kernel(kernel_id), snap, kernel_id, now)
            if idle < self.config.idle_seconds:
                continue
            if self.config.when == "pressure" and not self._pressure(snap, kernel_id):
                continue
            out.append((kernel_id, f"idle for {idle:.0f} s, holding {format_size(held)}"))
        return out

    async def check(self):
        """Park what the policy says to; a failure is logged, never raised."""
        for kernel_id, why in self.candidates():
            try:
                await self.park(kernel_id, why, reason="idle")
            except parking.ParkError as e:
                self.log.warning("hami-jupyter: %s", e)
            except Exception as e:  # the watcher must go on whatever one kernel does
                self.log.error("hami-jupyter: parking kernel %s failed: %r", kernel_id, e)

    async def _watch(self):
        while True:
            await asyncio.sleep(self.config.check_interval)
            await self.check()

    def start(self):
        if self.config.enabled and self._task is None:
            self._task = asyncio.ensure_future(self._watch())
            self.log.info("hami-jupyter: parking kernels idle for %g s (%s)",
                          self.config.idle_seconds, self.config.when)
        return self

    def stop(self):
        if self._task is not None:
            self._task.cancel()
            self._task = None


# ---- the kernel websocket: a parked kernel's next cell resumes it ------------------


def parking_connection_class(base, manager):
    """A subclass of the server's kernel websocket connection class *base* that
    resumes a parked kernel before code runs in it (see the module docstring)."""
    return type(f"Parking{base.__name__}", (ParkingConnectionMixin, base), {"parking": manager})


class ParkingConnectionMixin:
    """The part of the websocket connection that holds cells for a resume."""

    parking = None  # the ParkingManager, set by parking_connection_class

    def _incoming_header(self, ws_msg):
        """``(channel, header)`` of a message from the browser, or ``(None, None)``."""
        from jupyter_server.services.kernels.connection.base import (
            deserialize_binary_message,
            deserialize_msg_from_ws_v1,
        )
        import json

        try:
            if self.subprotocol == "v1.kernel.websocket.jupyter.org":
                channel, msg_list = deserialize_msg_from_ws_v1(ws_msg)
                return channel, self.session.unpack(msg_list[0])
            msg = deserialize_binary_message(ws_msg) if isinstance(ws_msg, bytes) else json.loads(ws_msg)
            return msg.get("channel") or "shell", msg.get("header")
        except Exception:  # not ours to judge: the base class reports bad messages
            return None, None

    def handle_incoming_message(self, incoming_msg):
        pending = getattr(self, "_hami_pending", None)
        if pending is not None:  # a resume is under way: keep the order of messages
            pending.append(incoming_msg)
            return
        channel, header = self._incoming_header(incoming_msg)
        if (channel == "shell" and header and header.get("msg_type") in RUN_CODE
                and self.parking is not None
                and self.parking.state(self.kernel_id) not in (None, "running")):
            self._hami_pending = [incoming_msg]
            asyncio.ensure_future(self._resume_then_send(header))
            return
        super().handle_incoming_message(incoming_msg)

    async def _resume_then_send(self, header):
        started = time.monotonic()
        # Read before the resume clears it: the user learns why her kernel was
        # parked (idle, on request, for another user's work, by the guard).
        parked = " ".join(filter(None, ("was parked in host memory", self.parking.reason(self.kernel_id))))

        def waiting(why):
            self._write("stream", {"name": "stdout", "text": (
                f"hami: this kernel's GPU memory {parked}; bringing it back waits for {why}\n")}, header)

        try:
            bytes_, _ = await self.parking.resume(self.kernel_id, on_wait=waiting)
        except parking.ParkError as e:
            pending, self._hami_pending = self._hami_pending, None
            self._refuse(header, str(e))
            for msg in pending[1:]:
                super().handle_incoming_message(msg)
            return
        if bytes_:
            self._write("stream", {"name": "stdout", "text": (
                f"hami: GPU memory restored: {format_size(bytes_)} in "
                f"{time.monotonic() - started:.1f} s\n")}, header)
        pending, self._hami_pending = self._hami_pending, None
        for msg in pending:
            super().handle_incoming_message(msg)

    def _write(self, msg_type, content, parent, channel="iopub"):
        """One message to the browser, as if the kernel had sent it."""
        from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1
        import json

        from jupyter_client.jsonutil import json_default

        msg = self.session.msg(msg_type, content=content, parent=parent)
        try:
            if self.subprotocol == "v1.kernel.websocket.jupyter.org":
                self.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack),
                                   binary=True)
            else:
                msg["channel"] = channel
                self.write_message(json.dumps(msg, default=json_default))
        except Exception as e:  # the browser went away: nothing to tell
            self.log.debug("hami-jupyter: could not write to the kernel websocket: %s", e)

    def _refuse(self, header, why):
        """Answer a held request the kernel never saw: the cell fails with *why*."""
        if header.get("msg_type") != "execute_request":
            self._write("stream", {"name": "stderr", "text": f"hami: {why}\n"}, header)
            return
        error = {"ename": "GPUMemoryParked", "evalue": why,
                 "traceback": [f"GPUMemoryParked: {why}"]}
        self._write("status", {"execution_state": "busy"}, header)
        self._write("error", error, header)
        self._write("execute_reply", {"status": "error", "execution_count": None, **error},
                          header, channel="shell")
        self._write("status", {"execution_state": "idle"}, header)
