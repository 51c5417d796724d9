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

HAMi has no resource for a guarantee: its scheduler sets ``nvidia.com/gpumem``
(the whole cap) aside on a GPU for each pod, and the pod's slice has no
guarantee of its own (the cap is the guarantee). A size's ``guarantee`` is
therefore not applied on Kubernetes, and its profile says so rather than
promise it. How far HAMi lets the caps of one GPU add up is HAMi's setting
(``nvidia.deviceMemoryScaling``), not ``SlicePolicy.memory_oversubscription``:
the hub does not see which node or GPU a pod lands on (docs/jupyterhub.md).

KubeSpawner puts a profile's ``display_name`` and ``description`` into its
spawn form as HTML, so they are escaped here: a name shows as written. It
puts the ``slug`` in as it is (the value of a radio button), and the browser
posts back what it reads there, so a slug must need no escaping: a size's
slug is its name, which must therefore be letters, digits, ``.``, ``_`` and
``-`` (:func:`kubespawner_profiles` refuses others when the hub starts). A
user's own size written out in ``users`` or ``groups`` (or a ``default``
written out) has no name a user could pick, and a user name may hold
anything; its slug is ``(own)``, which no size name can be.
"""

import html
import re

from .sizes import PolicyError, SliceSize

MiB = 1 << 20
SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
OWN_SLUG = "(own)"
# Said in a profile whose size has a guarantee below its cap (see the module docstring).
NO_GUARANTEE = (" (its guarantee does not apply on Kubernetes: HAMi sets the whole memory cap "
                "aside for the pod)")


def profile(size: SliceSize, hami_resources=True, default=False, slug=None):
    """One KubeSpawner profile for *size*, picked by *slug* (else its name)."""
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
    description = size.description or size.describe(guarantee=False)
    if size.lends:
        description += NO_GUARANTEE
    entry = {
        "display_name": html.escape(size.display_name or f"GPU slice {size.name}"),
        "slug": slug or size.name,
        "description": html.escape(description),
        "kubespawner_override": override,
    }
    if default:
        entry["default"] = True
    return entry


def kubespawner_profiles(policy, hami_resources=True):
    """A ``KubeSpawner.profile_list`` callable: the sizes offered to the user,
    their own first (the default). PolicyError, at once, for a size name that
    cannot be a slug."""
    named = set(policy.size_names)
    for name in policy.size_names:
        if not SLUG.fullmatch(name):
            raise PolicyError(f"slice size {name!r}: a KubeSpawner profile is picked by the "
                              f"size's name, which must be letters, digits, '.', '_' and '-' "
                              f"(KubeSpawner's form carries it unescaped); rename it and "
                              f"show the text as its display_name")

    def profiles(spawner):
        groups = policy.spawner_groups(spawner)
        sizes = policy.offered(spawner.user.name, groups)
        return [profile(s, hami_resources, default=(i == 0),
                        slug=s.name if s.name in named else OWN_SLUG)
                for i, s in enumerate(sizes)]

    return profiles
