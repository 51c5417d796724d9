"""``hami-jupyter guard``: memory caps held with the driver's own figures.

The preload library keeps a slice's processes within its memory cap from
inside each process, counting in the slice file. That is cooperative: a
process started without ``LD_PRELOAD`` is not counted at all, and a user
can rewrite the counters in their own slice file. The guard is the check
from outside. Every interval it asks NVML how much device memory each
process on each GPU really holds, works out which slice each process belongs
to, and ends processes of a slice that really uses more than its cap (or,
with ``--action warn``, says so). Neither skipping the library nor editing
the slice file changes what the driver reports.

One module per job, each importable and testable alone:

- :mod:`.nvml`: the GPU processes and their bytes, from NVML; NVML errors and
  GPUs that come and go become lines in the report, never a crash;
- :mod:`.procs`: what ``/proc`` says about a process (owner, start time, PID
  namespace, the slice variables of its environment), cached per process;
- :mod:`.slices`: the slice files under the root, read every interval, and
  the slots' processes by PID namespace;
- :mod:`.attribution`: which slice a GPU process is charged to, and why;
- :mod:`.policy`: real against cap per slice and GPU; whom to end, in order;
- :mod:`.actions`: warn or kill, each logged and appended to the audit log;
- :mod:`.report`: ``guard.json`` (:mod:`hami_jupyter.slice.guard_report`);
- :mod:`.service`: the loop, its start-up checks and its signals.

The guard keeps nothing that a restart loses: the figures are read afresh
every interval, and what it remembers between intervals (which slices it
already warned about, its latest actions) is in the report it writes, which
a restarted guard reads back. docs/guard.md is the user's guide.
"""
