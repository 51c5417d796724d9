"""REST handlers of ``{base_url}hami/v1/``: what the status bar polls.

They only turn :mod:`.kernel_slices` into HTTP. Every handler needs a logged-in
user, and the authorizer's permission to read "kernels": the answers show the
kernels' usage, so whoever may not see the kernels may not see these either.
"""

import json

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .kernel_slices import UnknownKernel, kernel_body, slices_body

AUTH_RESOURCE = "kernels"


class _SliceAPIHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def fractions(self):
        """The memory levels' thresholds the server is configured with."""
        return self.settings["hami_fractions"]


class SlicesHandler(_SliceAPIHandler):
    """``GET hami/v1/slices``: every slice of this server's kernels."""

    @web.authenticated
    @authorized
    def get(self):
        self.finish(json.dumps(slices_body(self.kernel_manager, self.fractions)))


class KernelHandler(_SliceAPIHandler):
    """``GET hami/v1/kernels/<kernel_id>``: one kernel and its slice."""

    @web.authenticated
    @authorized
    def get(self, kernel_id):
        try:
            body = kernel_body(self.kernel_manager, kernel_id, self.fractions)
        except UnknownKernel:
            raise web.HTTPError(404, f"no kernel with id {kernel_id}") from None
        self.finish(json.dumps(body))
