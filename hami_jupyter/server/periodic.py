"""A task of the server extension that runs every few seconds on the server's event loop."""

import asyncio


class Periodic:
    """Calls :meth:`tick` every :attr:`interval` seconds from :meth:`start` until
    :meth:`stop`. What one tick meets is logged (naming :attr:`what`), never
    raised: the server goes on, and the next tick may do fine."""

    interval = 1.0
    what = "a periodic task"

    def __init__(self, serverapp):
        self.serverapp, self.log = serverapp, serverapp.log
        self._task = None

    def tick(self):
        raise NotImplementedError

    async def _run(self):
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.tick()
            except Exception as e:  # the server goes on whatever one look meets
                self.log.error("hami-jupyter: %s failed: %r", self.what, e)

    def start(self):
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return self

    def stop(self):
        if self._task is not None:
            self._task.cancel()
            self._task = None
