"""Which host a server runs on, its GPUs, and how idle each of its kernels is.

The hub service (:mod:`hami_jupyter.hubview`) puts every server's answer of
``hami/v1/slices`` under the node the server runs on and the GPUs of that
node, so the answer says both. Nothing else tells the hub where a server
runs: the Hub REST API knows a server's URL, not its host.

The node is ``HAMI_NODE_NAME`` when set, else the host name. On Kubernetes a
pod's host name is the pod's name, so the spawner should pass the node's name
in (``HAMI_NODE_NAME`` from the downward API's ``spec.nodeName``); tests use
it to put servers of one machine on two "nodes".

The GPUs are NVML's, physical figures (:mod:`hami_jupyter.gpus`): a server
a hub started has the preload library loaded (its environment carries it,
so that every process it starts does), and then they are read in a child
process without it (about a quarter of a second), in the background once a
first answer is known, so that no request waits for it.
A kernel's idle time is Jupyter's own: the time since its last message.
"""

import os
import socket
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone

from ..gpus import read_gpus

NODE_VARIABLE = "HAMI_NODE_NAME"


def node_name(env=None):
    """``HAMI_NODE_NAME``, else this host's name."""
    env = os.environ if env is None else env
    return env.get(NODE_VARIABLE) or socket.gethostname()


GPUS_FRESH_S = 5.0  # the hub service asks every second; a host's GPUs change rarely
_gpus_lock = threading.Lock()
_gpus_cache = {"read": None, "answer": None}


def _read_into_cache(now):
    gpus, message = read_gpus()
    with _gpus_lock:
        _gpus_cache["answer"] = ([asdict(g) for g in gpus], message)
        _gpus_cache["read"] = now
        _gpus_cache["reading"] = False


def host_gpus(now=None):
    """``(gpus as dicts, why they are missing or None)``: NVML's GPUs of this host,
    read again at most every GPUS_FRESH_S seconds (NVML runs in the server's event
    loop; a busy host must not make every poll of the hub service wait on it).
    Once an answer is known, a stale one is answered while a thread reads anew."""
    now = time.monotonic() if now is None else now
    with _gpus_lock:
        read = _gpus_cache["read"]
        stale = read is None or now - read >= GPUS_FRESH_S or now < read
        first = _gpus_cache["answer"] is None
        background = stale and not first and not _gpus_cache.get("reading")
        if background:
            _gpus_cache["reading"] = True
    if stale and first:
        _read_into_cache(now)
    elif background:
        threading.Thread(target=_read_into_cache, args=(now,), name="hami-host-gpus",
                         daemon=True).start()
    with _gpus_lock:
        gpus, message = _gpus_cache["answer"]
    return [dict(g) for g in gpus], message


def _unix(when):
    if not isinstance(when, datetime):
        return None
    if when.tzinfo is None:  # jupyter_server keeps UTC
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def kernel_activity(kernel_manager, now=None):
    """``{kernel_id: {"execution_state", "last_activity_unix", "idle_seconds"}}``
    of every kernel of the server; idle is None when Jupyter has no time for it.
    The server works the idle time out itself, so no two hosts' clocks meet."""
    now = time.time() if now is None else now
    found = {}
    for kernel_id in kernel_manager.list_kernel_ids():
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:  # shut down meanwhile
            continue
        last = _unix(getattr(kernel, "last_activity", None))
        found[kernel_id] = {
            "execution_state": getattr(kernel, "execution_state", None),
            "last_activity_unix": last,
            "idle_seconds": None if last is None else max(0.0, round(now - last, 1)),
        }
    return found
