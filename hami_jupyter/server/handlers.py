"""REST handlers of ``{base_url}hami/v1/``: what the status bar polls, the charts'
history, and parking.

They only turn :mod:`.kernel_slices` and :mod:`.parking` into HTTP. Every
handler needs a logged-in user and the authorizer's permission on "kernels":
to read them for the GETs (the answers show the kernels' usage), to write
them for parking and resuming one.
"""

import json

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..slice.parking import ParkError, ResumeTimeout
from .kernel_slices import UnknownKernel, kernel_body, kernel_slice_path, slices_body
from .sessions import kernel_notebooks

AUTH_RESOURCE = "kernels"


class _SliceAPIHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def fractions(self):
        """The memory levels' thresholds the server is configured with."""
        return self.settings["hami_fractions"]

    @property
    def notebooks(self):
        """``{kernel_id: notebook path}`` of this server's sessions."""
        return kernel_notebooks(self.settings.get("session_manager"))


class SlicesHandler(_SliceAPIHandler):
    """``GET hami/v1/slices``: every slice of this server's kernels."""

    @web.authenticated
    @authorized
    def get(self):
        self.finish(json.dumps(slices_body(self.kernel_manager, self.fractions, self.notebooks)))


class KernelHandler(_SliceAPIHandler):
    """``GET hami/v1/kernels/<kernel_id>``: one kernel and its slice."""

    @web.authenticated
    @authorized
    def get(self, kernel_id):
        try:
            body = kernel_body(self.kernel_manager, kernel_id, self.fractions, self.notebooks)
        except UnknownKernel:
            raise web.HTTPError(404, f"no kernel with id {kernel_id}") from None
        self.finish(json.dumps(body))


class KernelHistoryHandler(_SliceAPIHandler):
    """``GET hami/v1/kernels/<kernel_id>/history?minutes=N``: the last minutes of
    the kernel's slice, per GPU and per kernel (:mod:`.history`)."""

    @web.authenticated
    @authorized
    def get(self, kernel_id):
        try:
            path = kernel_slice_path(self.kernel_manager, kernel_id)
        except UnknownKernel:
            raise web.HTTPError(404, f"no kernel with id {kernel_id}") from None
        recorder = self.settings["hami_history"]
        try:
            minutes = int(self.get_argument("minutes", str(recorder.history.window_ms // 60_000)))
        except ValueError:
            raise web.HTTPError(400, "minutes must be a whole number") from None
        body = {"kernel_id": kernel_id, "in_slice": path is not None,
                "interval_s": recorder.interval, "gpus": {}, "kernels": {}, "whole": {}}
        if path is not None:
            body.update(path=str(path), **recorder.history.samples(path, max(1, minutes)))
        self.finish(json.dumps(body))


class _KernelParkingHandler(_SliceAPIHandler):
    @property
    def parking(self):
        return self.settings["hami_parking"]

    def _known(self, kernel_id):
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, f"no kernel with id {kernel_id}")


class ParkHandler(_KernelParkingHandler):
    """``POST hami/v1/kernels/<kernel_id>/park``: its GPU state to host memory, now."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id):
        self._known(kernel_id)
        try:
            result = await self.parking.park(kernel_id, why="asked over REST", reason="asked")
        except ParkError as e:
            raise web.HTTPError(409, str(e)) from None
        self.finish(json.dumps({"kernel_id": kernel_id, "park_state": "parked",
                                "parked_bytes": result.bytes, "seconds": round(result.seconds, 3)}))


class ResumeHandler(_KernelParkingHandler):
    """``POST hami/v1/kernels/<kernel_id>/resume``: its GPU state back, now."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id):
        self._known(kernel_id)
        try:
            restored, seconds = await self.parking.resume(kernel_id)
        except ResumeTimeout as e:
            raise web.HTTPError(504, str(e)) from None
        except ParkError as e:
            raise web.HTTPError(409, str(e)) from None
        self.finish(json.dumps({"kernel_id": kernel_id, "park_state": "running",
                                "restored_bytes": restored, "seconds": round(seconds, 3)}))
