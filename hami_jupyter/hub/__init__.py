"""JupyterHub integration: the hub decides each user's slice.

- :mod:`.sizes`: slice sizes as a policy writes them;
- :mod:`.policy`: ``SlicePolicy``, users and groups to slice sizes;
- :mod:`.slice_files`: the hub makes each user's slice files (single host);
- :mod:`.spawner`: ``pre_spawn_hook`` and the size-picking options form;
- :mod:`.kubernetes`: KubeSpawner profiles with HAMi's resources;
- :mod:`.next_sizes`: sizes administrators picked for users' next starts;
- :mod:`.hub_service`: ``register_hub_service``, the hub view's service in the config.
"""

from .hub_service import register_hub_service
from .kubernetes import kubespawner_profiles
from .policy import SlicePolicy
from .sizes import PolicyError, SliceSize

__all__ = ["SlicePolicy", "SliceSize", "PolicyError", "kubespawner_profiles",
           "register_hub_service"]
