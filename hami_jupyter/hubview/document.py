"""The hub-wide document: every server's answer, put in order by node and GPU.

A pure function of what the servers answered (:class:`Reading`, one per
server the Hub lists), so it is tested without a hub. Each running server's
``hami/v1/slices`` answer carries the node it runs on, that node's GPUs and
the slices of its kernels (:mod:`hami_jupyter.server.kernel_slices`); here
they become::

    {"nodes": [{"node", "gpus": [{"uuid", "index", "name", "memory_total", ...totals,
                                  "waiting": [waiter, ...],
                                  "slices": [{"slice", "users", "memory_used",
                                              "memory_limit", "memory_guarantee",
                                              "memory_parked",
                                              "memory_real", "guard_state",
                                              "sm_share", "sm_util", "mode",
                                              "kernels": [kernel, ...]}]}],
                "kernels_without_gpu": [kernel, ...], "errors": [...],
                "parked": [{"pid", "slice", "user", "command", "uuid", "process_bytes",
                            "unix", "why"}, ...]}],
     "servers": [{"user", "server", "url", "state", "node", "error", ...}],
     "users": [{"user", "servers", "memory_used", "memory_limit", ...}]}

Every kernel carries ``notebook``, the path of the notebook it serves (as its
server's sessions, or its registry entry, name it; None when unknown): people
tell kernels apart by it.

A kernel is listed under every GPU it holds memory on, with its numbers on
that GPU; a kernel that holds none yet is in its node's
``kernels_without_gpu``, so every kernel of every server is somewhere. Two
servers of one user on one node share a slice: it is listed once, each of its
kernels owned by the server that runs it. A server that did not answer is in
``servers`` with ``state`` "unreachable" and the error, never left out.
A node's ``parked`` are the processes the guard there parked (each slice's
``guard.parked``, as its servers read the guard's report), once each: an
administrator resumes or ends them (:mod:`.actions`).

Each GPU's totals (issue 28): ``memory_guarantees`` and ``memory_limits``,
the sums of its slices' guarantees (the cap where none is set; 0 from a
server that predates guarantees: its cap) and caps; ``memory_used`` (what
the slices count), ``nvml_memory_used`` (what NVML sees on the GPU, every
process's), ``memory_parked`` (their parked kernels' bytes, in host memory);
and ``waiting``: who waits for room on it now, one entry per process (the
slots' ``room_wait``): ``{"slice", "user", "server", "kernel_id", "pid",
"bytes", "since_unix"}``, oldest first (the order the memory broker serves).
"""

from dataclasses import dataclass, field

READY, PENDING, UNREACHABLE = "ready", "pending", "unreachable"

# Per-GPU figures of a slice_status() GPU entry that the document repeats.
_SLICE_GPU_FIELDS = ("memory_used", "memory_limit", "memory_guarantee", "memory_parked",
                     "memory_real", "guard_state",
                     "sm_share", "sm_util", "mode", "memory_level", "limit_is_fallback")


@dataclass
class ServerRef:
    """One server as the Hub REST API lists it."""

    user: str
    name: str  # "" for the default server
    url: str  # the server's path (or full URL with subdomains), ending in /
    ready: bool = True
    pending: str | None = None  # "spawn", "stop" or None
    started: str | None = None
    last_activity: str | None = None
    user_last_activity: str | None = None

    @property
    def key(self):
        return f"{self.user}/{self.name}"


@dataclass
class Reading:
    """What one server answered: *body* (its ``hami/v1/slices``) or *error*."""

    ref: ServerRef
    body: dict | None = None
    error: str | None = None
    seconds: float | None = None
    extra: dict = field(default_factory=dict)


def _server_entry(r):
    ref = r.ref
    if r.body is not None:
        state = READY
    elif ref.pending and not ref.ready:
        state = PENDING
    else:
        state = UNREACHABLE
    return {"user": ref.user, "server": ref.name, "url": ref.url, "state": state,
            "pending": ref.pending, "started": ref.started, "last_activity": ref.last_activity,
            "node": (r.body or {}).get("node"), "error": r.error,
            "read_seconds": None if r.seconds is None else round(r.seconds, 3),
            "kernels": sorted((r.body or {}).get("kernels") or {})}


def _per_gpu(kernel, key, uuid):
    return sum(p.get(key, {}).get(uuid, 0) for p in kernel.get("processes", []))


def _kernel_entry(k, node, slice_name, owner, activity, uuid=None):
    """A kernel as the document lists it; its figures on GPU *uuid* (None: all GPUs)."""
    user, server = owner or (k.get("user"), None)
    act = activity.get(k["kernel_id"]) or {}
    if uuid is None:
        memory, parked, sm = k.get("memory_used", 0), k.get("memory_parked", 0), k.get("sm_util", 0)
    else:
        memory = _per_gpu(k, "memory_used", uuid)
        parked = _per_gpu(k, "parked", uuid)
        sm = _per_gpu(k, "sm_util", uuid)
    return {"kernel_id": k["kernel_id"], "notebook": k.get("notebook"), "user": user,
            "server": server, "node": node, "slice": slice_name, "kernelspec": k.get("kernelspec"),
            "memory_used": memory, "memory_parked": parked, "sm_util": sm,
            "park_state": k.get("park_state", "running"),
            "park_reason": k.get("park_reason"),
            "room_wait": k.get("room_wait"),
            "execution_state": act.get("execution_state"),
            "idle_seconds": act.get("idle_seconds"),
            "pids": [p["pid"] for p in k.get("processes", [])]}


def _on_gpu(kernel, uuid):
    return any(uuid in p.get("memory_used", {}) or uuid in p.get("parked", {})
               for p in kernel.get("processes", []))


def _new_gpu(uuid):
    return {"uuid": uuid, "index": None, "name": "", "memory_total": 0,
            "nvml_memory_used": None, "utilization": None, "slices": [], "waiting": []}


def _new_node(name):
    return {"node": name, "gpus": {}, "kernels_without_gpu": [], "errors": [], "servers": [],
            "gpu_facts_error": None}


def _gather(readings):
    """Per node: the GPU facts, each slice once, who owns each kernel, their activity."""
    nodes = {}
    for r in readings:
        body = r.body
        if body is None:
            continue
        node = nodes.setdefault(body.get("node") or "?", {
            **_new_node(body.get("node") or "?"), "slices": {}, "owners": {}, "activity": {},
            "reporters": {}, "parked": {}, "notebooks": {}})
        node["servers"].append(r.ref.key)
        for g in body.get("host_gpus") or []:
            gpu = node["gpus"].setdefault(g["uuid"], _new_gpu(g["uuid"]))
            gpu.update(index=g.get("index"), name=g.get("name") or "",
                       memory_total=g.get("memory_total") or 0,
                       nvml_memory_used=g.get("memory_used"), utilization=g.get("utilization"))
        if body.get("host_gpus_error") and not body.get("host_gpus"):
            node["gpu_facts_error"] = body["host_gpus_error"]
        for kernel_id in body.get("kernels") or {}:
            node["owners"][kernel_id] = (r.ref.user, r.ref.name)
        node["notebooks"].update({k: v for k, v in (body.get("notebooks") or {}).items() if v})
        node["activity"].update(body.get("kernel_activity") or {})
        for s in body.get("slices") or []:
            key = s.get("path") or s.get("slice")
            node["reporters"].setdefault(key, set()).add(r.ref.user)
            if "error" in s:
                if all(e.get("path") != s.get("path") for e in node["errors"]):
                    node["errors"].append({"slice": s.get("slice"), "path": s.get("path"),
                                           "error": s["error"], "server": r.ref.key})
                continue
            node["slices"].setdefault(key, s)
            for p in (s.get("guard") or {}).get("parked") or []:
                if isinstance(p, dict) and isinstance(p.get("pid"), int):
                    node["parked"].setdefault(p["pid"], {**p, "slice": s.get("slice")})
    return nodes


def _slice_entry(status, uuid, g, node_name, node, users):
    entry = {"slice": status["slice"], "path": status["path"], "node": node_name, "uuid": uuid,
             "users": users, "default_limit": status.get("default_limit"),
             **{f: g.get(f) for f in _SLICE_GPU_FIELDS}, "kernels": []}
    for k in status.get("kernels", []):
        if _on_gpu(k, uuid):
            entry["kernels"].append(_kernel_entry(k, node_name, status["slice"],
                                                  node["owners"].get(k["kernel_id"]),
                                                  node["activity"], uuid))
    return entry


def _guarantee(s):
    """A slice entry's guarantee on its GPU; its cap from a server that sends none."""
    g = s.get("memory_guarantee")
    return (s["memory_limit"] or 0) if g is None else g


def _waiters(status, node):
    """``{uuid: [waiter, ...]}`` of a slice's processes that wait for GPU room."""
    found = {}
    procs = [(k, p) for k in status.get("kernels", []) for p in k.get("processes", [])]
    procs += [(None, p) for p in status.get("other_processes", [])]
    for k, p in procs:
        wait = p.get("room_wait")
        if not isinstance(wait, dict) or not wait.get("uuid"):
            continue
        user, server = node["owners"].get(k["kernel_id"], (None, None)) if k else (None, None)
        found.setdefault(wait["uuid"], []).append({
            "slice": status["slice"], "user": user or (k or {}).get("user"), "server": server,
            "kernel_id": k["kernel_id"] if k else None, "notebook": (k or {}).get("notebook"),
            "pid": p.get("pid"),
            "bytes": wait.get("bytes") or 0, "since_unix": wait.get("since_unix")})
    return found


def _gpu_totals(gpu):
    slices = gpu["slices"]
    reals = [s["memory_real"] for s in slices]
    gpu["waiting"].sort(key=lambda w: (w["since_unix"] or 0, w["pid"] or 0))
    gpu.update(
        memory_used=sum(s["memory_used"] or 0 for s in slices),
        memory_parked=sum(s["memory_parked"] or 0 for s in slices),
        memory_real=None if not slices or None in reals else sum(reals),
        memory_limits=sum(s["memory_limit"] or 0 for s in slices),
        memory_guarantees=sum(_guarantee(s) for s in slices),
        room_wait_bytes=sum(w["bytes"] for w in gpu["waiting"]),
        uncapped_slices=sum(1 for s in slices if not s["memory_limit"]),
        sm_util=sum(s["sm_util"] or 0 for s in slices),
        kernels=sum(len(s["kernels"]) for s in slices),
        over_cap=[s["slice"] for s in slices if s["guard_state"] == "over"],
    )
    return gpu


def _nodes(gathered):
    out = []
    for name in sorted(gathered):
        node = gathered[name]
        placed = set()
        for key, status in sorted(node["slices"].items()):
            users = sorted({k.get("user") for k in status.get("kernels", []) if k.get("user")}
                           | node["reporters"].get(key, set()))
            for uuid, waiters in _waiters(status, node).items():
                node["gpus"].setdefault(uuid, _new_gpu(uuid))["waiting"].extend(waiters)
            for g in status.get("gpus", []):
                gpu = node["gpus"].setdefault(g["uuid"], _new_gpu(g["uuid"]))
                if not gpu["memory_total"]:
                    gpu["memory_total"] = g.get("memory_total") or 0
                entry = _slice_entry(status, g["uuid"], g, name, node, users)
                placed.update(k["kernel_id"] for k in entry["kernels"])
                gpu["slices"].append(entry)
            for k in status.get("kernels", []):
                if k["kernel_id"] not in placed and not any(_on_gpu(k, g["uuid"])
                                                            for g in status.get("gpus", [])):
                    node["kernels_without_gpu"].append(_kernel_entry(
                        k, name, status["slice"], node["owners"].get(k["kernel_id"]),
                        node["activity"]))
                    placed.add(k["kernel_id"])
        # Kernels outside any slice (a kernelspec not run by hami-provisioner): still listed.
        for kernel_id, (user, server) in sorted(node["owners"].items()):
            if kernel_id not in placed:
                act = node["activity"].get(kernel_id) or {}
                node["kernels_without_gpu"].append({
                    "kernel_id": kernel_id, "notebook": node["notebooks"].get(kernel_id),
                    "user": user, "server": server, "node": name,
                    "slice": None, "kernelspec": None, "memory_used": 0, "memory_parked": 0,
                    "sm_util": 0, "park_state": "running",
                    "execution_state": act.get("execution_state"),
                    "idle_seconds": act.get("idle_seconds"), "pids": []})
        gpus = sorted(node["gpus"].values(),
                      key=lambda g: (g["index"] is None, g["index"] or 0, g["uuid"]))
        out.append({"node": name, "servers": node["servers"],
                    "gpus": [_gpu_totals(g) for g in gpus],
                    "kernels_without_gpu": node["kernels_without_gpu"],
                    "errors": node["errors"], "gpu_facts_error": node["gpu_facts_error"],
                    "parked": sorted(node["parked"].values(), key=lambda p: (p.get("unix") or 0, p["pid"]))})
    return out


def _users(readings, nodes):
    users = {}
    for r in readings:
        u = users.setdefault(r.ref.user, {"user": r.ref.user, "servers": [], "memory_used": 0,
                                          "memory_parked": 0, "memory_limit": 0, "sm_util": 0,
                                          "kernels": 0, "last_activity": r.ref.user_last_activity})
        u["servers"].append(r.ref.name)
    capped = set()
    for node in nodes:
        for gpu in node["gpus"]:
            for s in gpu["slices"]:
                for k in s["kernels"]:
                    u = users.get(k["user"])
                    if u is not None:
                        u["memory_used"] += k["memory_used"]
                        u["memory_parked"] += k["memory_parked"]
                        u["sm_util"] += k["sm_util"]
                for name in s["users"]:
                    key = (node["node"], s["path"], gpu["uuid"], name)
                    if name in users and key not in capped and s["memory_limit"]:
                        capped.add(key)
                        users[name]["memory_limit"] += s["memory_limit"]
    for u in users.values():
        u["kernels"] = len({k["kernel_id"] for k in _kernels_of(nodes, u["user"])})
    return [users[name] for name in sorted(users)]


def _kernels_of(nodes, user):
    for n in nodes:
        for g in n["gpus"]:
            for s in g["slices"]:
                yield from (k for k in s["kernels"] if k["user"] == user)
        yield from (k for k in n["kernels_without_gpu"] if k["user"] == user)


def build(readings, now, hub_error=None):
    """The document for *readings* (one per server the Hub lists), read at *now*."""
    nodes = _nodes(_gather(readings))
    servers = sorted((_server_entry(r) for r in readings), key=lambda s: (s["user"], s["server"]))
    return {
        "version": 1,
        "refreshed_unix": now,
        "hub_error": hub_error,
        "nodes": nodes,
        "servers": servers,
        "unreachable": [s for s in servers if s["state"] == UNREACHABLE],
        "users": _users(readings, nodes),
    }
