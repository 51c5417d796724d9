"""The last minutes of every GPU and user, one sample per refresh, for charts.

Kept in memory only, on purpose: everything else the hub view shows is read
again from the servers at each refresh, so a restart of the service loses
nothing but these few minutes of samples (docs/hub-view.md says so). Long
history is Prometheus's job (``{prefix}metrics`` and ``{prefix}api/targets``).

A sample is ``[unix time, memory used, cap, SM utilization]``: for a GPU the
cap is its memory; for a user it is the sum of their slices' caps (0: none).
A GPU or user that stops showing up keeps its samples until they age out, so
a chart does not vanish the moment a server stops.
"""

from collections import deque


class History:
    """Samples of the last *seconds* per GPU (``"node/uuid"``) and per user."""

    def __init__(self, seconds=600.0):
        self.seconds = seconds
        self.gpus = {}
        self.users = {}

    def _add(self, series, key, sample):
        series.setdefault(key, deque()).append(sample)

    def _trim(self, now):
        oldest = now - self.seconds
        for series in (self.gpus, self.users):
            for key in list(series):
                samples = series[key]
                while samples and samples[0][0] < oldest:
                    samples.popleft()
                if not samples:
                    del series[key]

    def add(self, document):
        """One sample of each GPU and user of *document* (as :func:`.document.build` makes it)."""
        now = document["refreshed_unix"]
        for node in document["nodes"]:
            for gpu in node["gpus"]:
                self._add(self.gpus, f"{node['node']}/{gpu['uuid']}",
                          [round(now, 1), gpu["memory_used"], gpu["memory_total"], gpu["sm_util"]])
        for user in document["users"]:
            self._add(self.users, user["user"],
                      [round(now, 1), user["memory_used"], user["memory_limit"], user["sm_util"]])
        self._trim(now)

    def as_dict(self):
        return {"seconds": self.seconds,
                "sample": ["unix", "memory_used", "cap", "sm_util"],
                "gpus": {k: list(v) for k, v in self.gpus.items()},
                "users": {k: list(v) for k, v in self.users.items()}}
