"""The node's facts: what the agent's decisions about a process may rest on.

Facts are what a user cannot write: NVML's figures (:mod:`.nvml`), ``/proc``
(:mod:`.procs`), the root-owned limits files. The slice files
(:mod:`.slices`) are read here too, but their slots are their users' claims:
:mod:`.attribution` matches a slot to a process only when ``/proc`` agrees
(the process's owner is the file's, its PID namespace and PID are the
slot's), and :mod:`.activity` lets a claimed last GPU call make a process
look idler than the agent saw it, never busier. :mod:`.look` puts one look
at all of it together for the policies.
"""
