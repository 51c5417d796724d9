# JupyterHub on one host with a few NVIDIA GPUs: every user gets a slice of
# each GPU. Install jupyterhub and hami-jupyter into one virtual environment
# that every user can run (e.g. /opt/jupyterhub), then:
#   sudo /opt/jupyterhub/bin/jupyterhub -f jupyterhub_config.py
# docs/single-host.md walks through it from an empty machine.
#
# The hub runs as root so that it can make each user's slice files in
# /run/hami-jupyter before their server starts: the usage file owned by the
# user, the limits file owned by root (and the admin group below), which the
# user's kernels can read but not change.
#
# Every kernel of a user's server runs in that slice, the default "Python 3"
# kernel too: the hook marks the server's environment with HAMI_HUB_SLICE, and
# hami-jupyter's server extension (enabled when the package is installed) then
# starts every kernelspec through hami-provisioner, whatever provisioner it
# names or none. A kernelspec cannot name another slice, and gets no cap other
# than the slice's (`hami-jupyter kernelspec install` refuses both under the hub).

import os
import sys

from hami_jupyter.hub import SlicePolicy, register_hub_service

c = get_config()  # noqa: F821 (provided by JupyterHub)

c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"  # or SystemdSpawner
c.Spawner.default_url = "/lab"
# Who may log in (PAM, JupyterHub's default authenticator, checks the Unix
# password): these users of the host; c.LocalAuthenticator.allowed_groups
# admits a Unix group instead. Without any allow setting JupyterHub 5 warns
# "No allow config found" at every start.
c.Authenticator.allowed_users = {"alice", "bob", "carol"}

# The users' servers run from the hub's own environment (sys.prefix: the venv
# whose jupyterhub runs this file). LocalProcessSpawner would otherwise look
# for `jupyterhub-singleuser` on PATH, which under sudo or systemd does not
# hold the venv; PATH also makes the venv's python, pip and jupyter the
# users' own in terminals and notebooks.
_venv_bin = os.path.join(sys.prefix, "bin")
c.Spawner.cmd = [os.path.join(_venv_bin, "jupyterhub-singleuser")]
c.Spawner.environment = {"PATH": f"{_venv_bin}:/usr/local/bin:/usr/bin:/bin"}
# Kernels idle for 15 minutes give their GPU memory back (parked in host
# memory; their next cell brings it back): docs/parking.md. On the servers'
# command line, so a user's own config cannot undo them; a change here needs a
# hub restart, and reaches each server at its next start.
c.Spawner.args = ["--HamiParking.enabled=True", "--HamiParking.idle_seconds=900"]

# Named slice sizes. memory: per GPU; sm: percent of each GPU's compute;
# mode: hard (never above the share) or elastic (idle GPU time may be used,
# but under contention every slice gets at least its share); gpus: which GPUs
# (NVML indices or UUIDs; unset: all); per_gpu: limits of single GPUs.
c.SlicePolicy.sizes = {
    "small": {"memory": "8g", "sm": 20, "mode": "elastic",
              "display_name": "Small: 8 GiB, 20 % of a GPU (may use idle time)"},
    "large": {"memory": "24g", "sm": 50, "display_name": "Large: 24 GiB, half a GPU"},
    "course": {"memory": "4g", "sm": 10, "gpus": [1],
               "display_name": "Course: 4 GiB on GPU 1"},
}
# Who gets what, most specific first: users, then the first matching group
# (in this order), then the default.
c.SlicePolicy.default = "small"
c.SlicePolicy.groups = {"ml-course": "course", "research": "large"}
c.SlicePolicy.users = {"alice": {"memory": "40g", "sm": 60}}
# Sizes a user may pick in the spawn form besides their own ("*": everyone).
c.SlicePolicy.offer = {"research": ["small", "large"]}
# c.SlicePolicy.groups names JupyterHub groups; to match the users' Unix
# groups instead (or as well: "both"):
# c.SlicePolicy.group_source = "unix"
# Members of this Unix group may resize slices live (AdminPanel, hami-jupyter slice set).
c.SlicePolicy.admin_group = "hami-admin"
# Oversubscription: a size may keep less than its cap for sure, e.g.
# "shared": {"memory": "16g", "guarantee": "4g"} (4 GiB kept, the 12 GiB above
# lent: the memory broker parks idle kernels to take them back). The hub then
# admits a start only if the GPUs have room: guarantees within each GPU, caps
# within memory_oversubscription times it (docs/jupyterhub.md).
# c.SlicePolicy.memory_oversubscription = 4.0

# No GPU (trying the set-up out): the simulated GPU, one state for all users;
# see docs/single-host.md, "Running without a GPU" for the state file's mode.
# from hami_jupyter import native
# c.Spawner.environment.update(native.sim_env(
#     "/run/hami-sim/state", base={}, HAMI_SIM_DEVICES=2, HAMI_SIM_MEMORY="80g"))

policy = SlicePolicy(config=c)
policy.configure_spawner(c)  # pre_spawn_hook + options form
# Administrators' changes go through this service, which runs as root like the
# hub: it learns who asks from the operating system (not the environment), and
# writes the limits file and the audit log, which only root may write
# (`hami-jupyter audit verify` checks the log's chain).
c.JupyterHub.services = [{
    "name": "hami-admin",
    "command": [os.path.join(_venv_bin, "hami-jupyter"), "admin-service",
                "--root", str(policy.slice_root), "--admin-group", policy.admin_group],
}]

# The hub view (docs/hub-view.md): one service that reads every server's
# slices through the proxy and shows them per node, GPU and user in
# AdminPanel(), with actions for administrators: JupyterHub admins
# (c.Authenticator.admin_users) and members of the JupyterHub group named here
# (a JupyterHub group, whatever the Unix group above is called). It resizes
# slices of this host live, audit-logged like the admin service's changes.
# Prometheus finds every server's /metrics at /services/hami-hub/api/targets.
register_hub_service(c, policy, admin_groups=["hami-admin"])
# Settings below may assign c.JupyterHub.load_roles or .services, or
# c.Spawner.environment, plainly (a Prometheus role, say): what the call added
# stays beside them (docs/hub-view.md).
