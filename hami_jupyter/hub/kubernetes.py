"""KubeSpawner profiles from the policy (Kubernetes with HAMi's device plugin).

Each offered size becomes one ``profile_list`` entry whose
``kubespawner_override`` sets the server's environment (the provisioner's
``HAMI_*`` source) and, with *hami_resources*, HAMi's extended resources, so
that HAMi's scheduler places the pod on a GPU with room and its device plugin
enforces the same limits at the container level:

- ``nvidia.com/gpu``: GPUs (the size's ``gpus`` count, else 1);
- ``nvidia.com/gpumem``: MiB per GPU (the size's memory, rounded up to a
  whole MiB, so the container's share is never below the slice);
- ``nvidia.com/gpucores``: percent of each GPU (the size's SM share).

They are set as limits (``extra_resource_limits``) and, the same, as
requests (``extra_resource_guarantees``): Kubernetes takes a missing request
of an extended resource to be its limit, but refuses a pod whose request
differs from its limit, which a request set for every pod by the deployment
(Zero to JupyterHub's ``singleuser.extraResource.guarantees``) would.

Set ``c.KubeSpawner.profile_list = kubespawner_profiles(policy)``: a callable,
so each user sees the sizes offered to them.

KubeSpawner puts a profile's ``display_name`` and ``description`` into its
spawn form as HTML, so they are escaped here: a name shows as written.
"""

import html

from .sizes import SliceSize

MiB = 1 << 20


def profile(size: SliceSize, hami_resources=True, default=False):
    """One KubeSpawner profile for *size*."""
    override = {"environment": size.environment()}
    override["environment"].pop("CUDA_VISIBLE_DEVICES", None)  # the device plugin decides
    if hami_resources:
        limits = {"nvidia.com/gpu": str(len(size.gpus) if size.gpus else 1)}
        if size.limits.memory_limit:
            limits["nvidia.com/gpumem"] = str(-(-size.limits.memory_limit // MiB))
        if size.limits.sm_share:
            limits["nvidia.com/gpucores"] = str(size.limits.sm_share)
        override["extra_resource_limits"] = limits
        override["extra_resource_guarantees"] = dict(limits)
    entry = {
        "display_name": html.escape(size.display_name or f"GPU slice {size.name}"),
        "slug": size.name,
        "description": html.escape(size.description or size.describe()),
        "kubespawner_override": override,
    }
    if default:
        entry["default"] = True
    return entry


def kubespawner_profiles(policy, hami_resources=True):
    """A ``KubeSpawner.profile_list`` callable: the sizes offered to the user."""

    def profiles(spawner):
        groups = policy.spawner_groups(spawner)
        sizes = policy.offered(spawner.user.name, groups)
        return [profile(s, hami_resources, default=(i == 0)) for i, s in enumerate(sizes)]

    return profiles
