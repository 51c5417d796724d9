"""The room policy (the memory broker's): GPU room for a waiting allocation, made by parking idle kernels.

Slices may be oversubscribed: each has a *limit* (its cap) and a
*guarantee* (what it keeps whatever others need), and the limits of a GPU's
slices may add up to more than the GPU. So a process can ask for memory
within its slice's limit that the GPU itself does not have. The preload
library then does not fail the allocation at once: it keeps the bytes
reserved under the limit and asks the node's agent for room. This policy
decides, from a look at the node (:mod:`hami_jupyter.agent.facts`), who may
ask and for how much (:mod:`.request`), in which order (:mod:`.queue`), and
which kernels may be parked for it, the idlest first (:mod:`.kernels`); and
fills ``broker.json`` in (:mod:`.report`). The agent's actor parks
(:mod:`hami_jupyter.agent.actor`); :mod:`hami_jupyter.agent.rooms` runs a
request from look to answer. docs/broker.md is the user's guide.
"""
