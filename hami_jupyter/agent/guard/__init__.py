"""The guard's policy: memory caps held with the driver's own figures.

The preload library keeps a slice's processes within its memory cap from
inside each process, counting in the slice file. That is cooperative: a
process started without ``LD_PRELOAD`` is not counted at all, and a user
can rewrite the counters in their own slice file. The guard is the check
from outside: from a look at the node (:mod:`hami_jupyter.agent.facts`), it
judges each slice's real use on each GPU against its cap and chooses whom to
park or end (:mod:`.policy`), and says what it saw in ``guard.json``
(:mod:`.report`). It decides only; the agent's actor acts
(:mod:`hami_jupyter.agent.actor`), and its watch runs it every interval
(:mod:`hami_jupyter.agent.watch`). docs/guard.md is the user's guide.
"""
