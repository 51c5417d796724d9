"""``hami-jupyter broker``: GPU room for a waiting allocation, made by parking idle kernels.

Slices may be oversubscribed: each has a *limit* (its cap) and a
*guarantee* (what it keeps whatever others need), and the limits of a GPU's
slices may add up to more than the GPU. So a process can ask for memory
within its slice's limit that the GPU itself does not have. The preload
library then does not fail the allocation at once: it keeps the bytes
reserved under the limit and asks this broker, one per node, running as
root beside the guard, for room. The broker parks idle kernels of any user
on that GPU (the longest idle first; never one active in the last
``--min-idle-seconds``; never one whose slice holds no more than its
guarantee; never more than the room asked), and answers; the allocation then
goes through. With ``--headroom``, it also parks by the same rules before
anyone asks, to keep that much free on each GPU. docs/broker.md is the
user's guide.

One module per job:

- :mod:`.protocol`: the request and answer lines, the socket's path, the peer's credentials;
- :mod:`.request`: one checked request on its open connection;
- :mod:`.queue`: who waits on which GPU, whose turn it is (oldest wait first);
- :mod:`.room`: NVML's free bytes and per-process bytes (the guard's reader);
- :mod:`.kernels`: the kernels on a GPU, which may be parked, which first;
- :mod:`.parker`: parking one kernel through ``hami-park``;
- :mod:`.decisions`: the log line, the audit record and the report's entry of each decision;
- :mod:`.server`: one connection from request to answer;
- :mod:`.headroom`: ``--headroom``: room kept free on each GPU before anyone asks;
- :mod:`.report`: ``broker.json`` (:mod:`hami_jupyter.slice.broker_report`);
- :mod:`.service`: start-up, the socket, signals, the loop.

The broker keeps nothing a restart loses: what is parked and who waits is in
the slice files and the driver, and a requester whose connection dropped
asks again with the time its wait began.
"""
