# JupyterHub on one host with a few NVIDIA GPUs: every user gets a slice of
# each GPU. Install jupyterhub and hami-jupyter into the hub's environment and
# the users' (often the same one), then: sudo jupyterhub -f jupyterhub_config.py
#
# The hub runs as root so that it can make each user's slice files in
# /run/hami-jupyter before their server starts: the usage file owned by the
# user, the limits file owned by root (and the admin group below), which the
# user's kernels can read but not change.

from hami_jupyter.hub import SlicePolicy

c = get_config()  # noqa: F821 (provided by JupyterHub)

c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"  # or SystemdSpawner
c.Spawner.default_url = "/lab"

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
# Members of this Unix group may resize slices live (AdminPanel, hami-jupyter slice set).
c.SlicePolicy.admin_group = "hami-admin"

SlicePolicy(config=c).configure_spawner(c)  # pre_spawn_hook + options form
