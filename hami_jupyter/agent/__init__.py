"""``hami-jupyter agent``: the node's one root program, the guard and the memory broker in one.

Two policies act on the GPU processes of a node, and both need root: the
**guard** holds each slice to its memory cap by the driver's own figures
(a process started without the preload library, or counters rewritten by
hand, is parked or ended), and the **room** policy, the memory broker, makes
GPU room for a process of an oversubscribed slice by parking idle kernels of
any user. They run in this one daemon, over one set of facts, through one
actor, so that no two decisions race on a process (the guard must never end
a process the broker is parking).

The agent trusts nothing a user writes. A user's slice file is written by
her own processes, so what its slots say (a PID, a charge, a last GPU call,
a park state, a wait) is her claim. A decision that touches a process rests
on facts she cannot write: its owner, PID namespace and liveness from
``/proc``, its bytes from NVML, its last GPU activity from the driver's
per-process samples or from what the agent itself saw change, limits and
guarantees from the root-owned limits file. A claim may make her own kernels
*more* parkable, never another user's, never her own less enforced.

The package reads like the design, from the ground up:

- :mod:`.facts`: the node's facts: NVML (:mod:`.facts.nvml`), ``/proc``
  (:mod:`.facts.procs`), the slice files (:mod:`.facts.slices`), which slice a
  process is charged to (:mod:`.facts.attribution`), when it last used the GPU
  (:mod:`.facts.activity`), and one look at all of it (:mod:`.facts.look`);
- :mod:`.guard` and :mod:`.room`: the two policies, side by side, each deciding
  from a look and nothing else; neither imports the other;
- :mod:`.actor` (parks, holds, kills: one action on a process at a time),
  :mod:`.records` (the one audit writer, rate-limited) and :mod:`.ledger`
  (the room ledger every preload library reads before taking GPU memory on
  a tight GPU: the reserve, the room granted to each requester, who waits);
- :mod:`.watch` (every interval: look, judge by the guard's policy, act,
  report), :mod:`.rooms` (the room loop: a request for room, and a step of
  the headroom's, each in one pass of facts, plan by the room policy, act,
  record) and :mod:`.headroom` (which asks the room loop for its steps);
- :mod:`.server` (the socket: who asks, from ``SO_PEERCRED``; each user's
  connections and requests bounded; every request timed out) with
  :mod:`.protocol` (the request and answer lines);
- :mod:`.service`: start-up, the threads, the signals. ``hami-jupyter guard``
  and ``hami-jupyter broker`` are the agent with one policy on.

docs/guard.md and docs/broker.md are the users' guides.
"""
