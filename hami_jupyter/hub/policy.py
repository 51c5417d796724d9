"""Who gets which slice: the policy an admin writes in ``jupyterhub_config.py``.

::

    from hami_jupyter.hub import SlicePolicy

    c.SlicePolicy.sizes = {
        "small": {"memory": "4g", "sm": 25},
        "large": {"memory": "16g", "sm": 50, "mode": "elastic", "gpus": [0, 1]},
    }
    c.SlicePolicy.default = "small"
    c.SlicePolicy.groups = {"researchers": "large"}
    c.SlicePolicy.users = {"alice": {"memory": "8g", "sm": 30}}
    c.SlicePolicy.offer = {"researchers": ["small", "large"]}

    policy = SlicePolicy(config=c)
    policy.configure_spawner(c)   # pre_spawn_hook, options form, user_options check

A user's slice is, most specific first: their entry in ``users``, the entry
of the first group in ``groups`` (in the order written) they belong to, then
``default``. Which groups: ``group_source`` -- JupyterHub's groups (the
default), the user's Unix groups, or both. An entry is a size name or a
size written out. A spawner form or profile list may let the user pick
another size among those ``offer`` allows them (their own size is always
allowed).

Every size is checked when the policy is built, so a typo stops the hub at
start-up with a message naming the size, never at a user's spawn.

With ``next_sizes_file`` set, a size an administrator picked for a user's
next start (through the hub service, on Kubernetes, where a running slice
cannot grow: :mod:`.next_sizes`) beats all of the above until it is cleared.

A size may carry a ``guarantee`` below its ``memory`` (the cap): memory the
slice keeps whatever others need, the rest up to the cap lent. Once any size
has one, or ``memory_oversubscription`` is set, the hub admits a start only
if every GPU it may use has room (:mod:`.admission`): the guarantees of the
running servers' slices and the new one no more than the GPU's memory, their
caps no more than ``memory_oversubscription`` (1.0 unless set) times it. A
policy with neither starts every server as before: the hub adds nothing up.
"""

from __future__ import annotations

import grp
import os
import pwd

from traitlets import Dict, Float, Unicode, Union
from traitlets.config import LoggingConfigurable

from . import admission, next_sizes, spawner
from .sizes import PolicyError, parse_size_spec

class SlicePolicy(LoggingConfigurable):
    """Maps users and groups to slice sizes (see the module docstring)."""

    sizes = Dict(config=True, help="Named slice sizes: name -> {memory, sm, mode, gpus, per_gpu, "
                                    "display_name, description}.")
    default = Union([Unicode(), Dict()], default_value=None, allow_none=True, config=True,
                    help="Size (a name, or written out) of users no other entry names. "
                         "None: such users get no slice limits.")
    users = Dict(config=True, help="User name -> size name or size written out.")
    groups = Dict(config=True, help="Group name -> size name or size written out; the first "
                                    "group in this order that a user belongs to counts.")
    offer = Dict(config=True, help="User or group name -> size names the spawner lets them pick. "
                                   "'*' is everyone. Unset: only their own size.")
    slice_root = Unicode("/run/hami-jupyter", config=True,
                         help="Folder the hub keeps slice files in (created if missing).")
    admin_group = Unicode(None, allow_none=True, config=True,
                          help="Unix group whose members may change limits (panel, CLI).")
    next_sizes_file = Unicode(
        None, allow_none=True, config=True,
        help="JSON file of the sizes administrators picked for users' next starts "
             "(written by `hami-jupyter hub-service`, read at every spawn; a picked size "
             "beats users, groups and default). None: no such picks.")
    group_source = Unicode(
        "jupyterhub", config=True,
        help="Which groups the names in ``groups`` and ``offer`` mean. "
             "'jupyterhub' (default): the user's JupyterHub groups (admin panel, REST API, "
             "load_groups, an authenticator's manage_groups). "
             "'unix': the user's Unix groups on the hub host, looked up at each spawn for "
             "the Unix user of the hub user's name: primary group and supplementary groups "
             "(pwd, os.getgrouplist); a hub user with no Unix account has none. "
             "'both': either. "
             "Group names in ``groups`` that match no group are warned about, never an "
             "error: Unix group names when the policy is built (hub start), against "
             "grp.getgrall(); JupyterHub group names once, at the first spawn after the "
             "hub starts, against the groups in the hub's database then (groups created "
             "later are not rechecked).")

    memory_oversubscription = Float(
        None, allow_none=True, config=True,
        help="How far the memory caps of the slices on one GPU may add up, as a multiple of "
             "the GPU's memory (a float >= 1.0; 4.0: caps may add up to 4x the GPU), when a "
             "server starts; their guarantees never add up to more than the GPU. The memory "
             "above the guarantees is lent: the node's memory broker takes it back by parking "
             "idle kernels. None (the default): 1.0 once any size has a guarantee, and no "
             "check at all for a policy without guarantees (as before they existed). Single "
             "host only: on Kubernetes HAMi's scheduler places pods (docs/jupyterhub.md).")

    GROUP_SOURCES = ("jupyterhub", "unix", "both")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.group_source not in self.GROUP_SOURCES:
            raise PolicyError(f"group_source: {self.group_source!r} is not one of "
                              f"{', '.join(map(repr, self.GROUP_SOURCES))}")
        over = self.memory_oversubscription
        if over is not None and not over >= 1.0:  # NaN too
            raise PolicyError(f"memory_oversubscription: {over!r} is below 1.0; give 1.0 (caps "
                              "never add up to more than a GPU) or more (4.0: up to 4x a GPU)")
        self._sizes = {name: parse_size_spec(name, spec) for name, spec in self.sizes.items()}
        self._default = self._entry(self.default, "default") if self.default is not None else None
        self._users = {u: self._entry(v, f"users[{u!r}]") for u, v in self.users.items()}
        self._groups = {g: self._entry(v, f"groups[{g!r}]") for g, v in self.groups.items()}
        if self.admin_group:
            try:
                grp.getgrnam(self.admin_group)
            except KeyError:
                raise PolicyError(f"admin_group: no Unix group {self.admin_group!r} on this host; "
                                  f"create it (groupadd {self.admin_group}) or leave it unset") from None
        for who, names in self.offer.items():
            for n in names:
                if n not in self._sizes:
                    raise PolicyError(f"offer[{who!r}]: no slice size named {n!r}; "
                                      f"sizes: {', '.join(self._sizes) or 'none'}")
        # Group names of `groups` still to be checked against JupyterHub's
        # groups (at the first spawn: the database is not open yet here).
        self._hub_groups_unchecked = []
        if self.group_source in ("unix", "both") and self.groups:
            unix = {g.gr_name for g in grp.getgrall()}
            missing = [g for g in self.groups if g not in unix]
            if self.group_source == "unix":
                for g in missing:
                    self.log.warning(
                        "hami-jupyter: SlicePolicy.groups[%r]: no Unix group %r on this host "
                        "(group_source = 'unix'): nobody gets its size through it", g, g)
            else:
                self._hub_groups_unchecked = missing
        elif self.group_source == "jupyterhub":
            self._hub_groups_unchecked = list(self.groups)

    def _entry(self, value, where):
        if isinstance(value, str):
            if value not in self._sizes:
                raise PolicyError(f"{where}: no slice size named {value!r}; "
                                  f"sizes: {', '.join(self._sizes) or 'none'}")
            return self._sizes[value]
        return parse_size_spec(f"{where}", value)

    # ---- groups ---------------------------------------------------------------

    def groups_of(self, user, hub_groups=()):
        """The group names that count for *user* under ``group_source``:
        *hub_groups* (their JupyterHub groups), their Unix groups, or both."""
        names = list(hub_groups) if self.group_source in ("jupyterhub", "both") else []
        if self.group_source in ("unix", "both"):
            found = unix_groups(user)
            if found is None:
                self.log.warning("hami-jupyter: no Unix user %r: no Unix groups count for "
                                 "their slice (group_source = %r)", user, self.group_source)
            else:
                names += [g for g in found if g not in names]
        return names

    def spawner_groups(self, spawner):
        """:meth:`groups_of` the spawner's user; on the first call that can read
        the hub's database, warn about ``groups`` names no JupyterHub group has."""
        user = spawner.user
        if self._hub_groups_unchecked:
            known = hub_group_names(user)
            if known is not None:
                self.check_hub_groups(known)
        return self.groups_of(user.name, [g.name for g in getattr(user, "groups", None) or []])

    def check_hub_groups(self, known):
        """Warn, once, about names of ``groups`` that are none of *known* (the
        hub's JupyterHub groups) and, for 'both', no Unix group either."""
        known = set(known)
        for g in self._hub_groups_unchecked:
            if g in known:
                continue
            if self.group_source == "both":
                self.log.warning("hami-jupyter: SlicePolicy.groups[%r]: no JupyterHub group and "
                                 "no Unix group is named %r: nobody gets its size through it", g, g)
                continue
            hint = ""
            try:
                grp.getgrnam(g)
                hint = (f"; there is a Unix group {g!r}: set c.SlicePolicy.group_source = "
                        f"'unix' (or 'both') if that is the one meant")
            except KeyError:
                pass
            self.log.warning("hami-jupyter: SlicePolicy.groups[%r]: no JupyterHub group is "
                             "named %r (group_source = 'jupyterhub'): nobody gets its size "
                             "through it%s", g, g, hint)
        self._hub_groups_unchecked = []

    # ---- resolution ---------------------------------------------------------

    def size_of(self, user, groups=()):
        """The user's own size: user entry, then first matching group, then default."""
        if user in self._users:
            return self._users[user]
        member = set(groups)
        for group, size in self._groups.items():
            if group in member:
                return size
        return self._default

    def own_size(self, user, groups=()):
        """:meth:`size_of`, unless an administrator picked the user's next size."""
        picked = next_sizes.size_for(self.next_sizes_file, user) if self.next_sizes_file else None
        if picked is not None:
            if picked in self._sizes:
                return self._sizes[picked]
            self.log.warning("hami-jupyter: the next size picked for %s, %r, is no size of the "
                             "policy any more: the policy's size counts", user, picked)
        return self.size_of(user, groups)

    def offered(self, user, groups=()):
        """Sizes the user may pick, their own first (names unique, order kept)."""
        own = self.own_size(user, groups)
        names = []
        for who in ("*", *groups, user):
            names += self.offer.get(who, [])
        picks = [own] if own is not None else []
        for n in names:
            if all(p.name != n for p in picks):
                picks.append(self._sizes[n])
        return picks

    def choose(self, user, groups=(), picked=None):
        """The size a spawn uses: *picked* (a size name from a form or profile)
        if the user may have it, else their own. PolicyError if not allowed."""
        if not picked:
            return self.own_size(user, groups)
        if picked not in self._sizes:
            raise PolicyError(f"no slice size named {picked!r}; sizes: {', '.join(self._sizes) or 'none'}")
        for size in self.offered(user, groups):
            if size.name == picked:
                return size
        raise PolicyError(f"slice size {picked!r} is not offered to {user!r}; "
                          f"offered: {', '.join(s.name for s in self.offered(user, groups)) or 'none'}")

    @property
    def size_names(self):
        return list(self._sizes)

    # ---- admission ---------------------------------------------------------------

    @property
    def checks_admission(self):
        """Whether starts are admitted by the GPUs' room (:mod:`.admission`):
        once ``memory_oversubscription`` is set or any size has a guarantee."""
        if self.memory_oversubscription is not None:
            return True
        sizes = [*self._sizes.values(), *self._users.values(), *self._groups.values(),
                 *([self._default] if self._default is not None else [])]
        return any(size.lends for size in sizes)

    @property
    def oversubscription(self):
        """The factor in force: ``memory_oversubscription``, else 1.0."""
        return 1.0 if self.memory_oversubscription is None else self.memory_oversubscription

    def host_gpus(self, size, server_environment=None):
        """The GPUs the hub counts at *size*'s start: NVML's in the hub's process;
        where that knows none, those a server with *server_environment* (the
        spawner's) will see (:func:`hami_jupyter.gpus.read_gpus_as`), read only
        where they matter: admission, or a size with ``per_gpu`` limits. So a hub
        tried out on the simulated GPU, which only its servers' environment
        names, admits by that GPU from its first start."""
        from ..gpus import read_gpus, read_gpus_as

        gpus, _ = read_gpus()
        if gpus or server_environment is None or size is None:
            return gpus
        if not (self.checks_admission or size.per_gpu):
            return gpus
        return read_gpus_as(server_environment)[0]

    def admit(self, user, size, running_users, gpus=None):
        """Refuse (:class:`.admission.AdmissionError`) *user*'s start with *size*
        when a GPU it may use has no room; nothing when admission is off.
        *running_users*: users with a server started or starting (None: every
        slice under the root counts); *gpus*: the host's (default:
        :meth:`host_gpus` without a server environment, NVML's)."""
        if not self.checks_admission or size is None:
            return
        if gpus is None:
            gpus = self.host_gpus(size)
        admission.check(user, size, self.slice_root, self.oversubscription, running_users, gpus)

    def configure_spawner(self, c):
        """Wire this policy into a single-host hub's config: the slice files and
        server environment before each spawn, and the size-picking form."""
        c.Spawner.pre_spawn_hook = spawner.pre_spawn_hook(self)
        c.Spawner.apply_user_options = spawner.apply_user_options(self)
        c.Spawner.options_form = spawner.options_form(self)
        c.Spawner.options_from_form = spawner.options_from_form(self)


def unix_groups(user_name):
    """Names of the Unix groups of the Unix user *user_name*, primary group
    first, then the supplementary ones; None when there is no such user."""
    try:
        pw = pwd.getpwnam(user_name)
    except KeyError:
        return None
    names = []
    for gid in [pw.pw_gid, *os.getgrouplist(pw.pw_name, pw.pw_gid)]:
        try:
            name = grp.getgrgid(gid).gr_name
        except KeyError:
            continue  # a gid with no name: nothing a policy can name
        if name not in names:
            names.append(name)
    return names


def hub_group_names(user):
    """Every group name in the hub's database, through *user*'s session (a
    jupyterhub.user.User); None where that cannot be read."""
    db = getattr(user, "db", None)
    if db is None:
        return None
    try:
        from jupyterhub import orm
        return [name for (name,) in db.query(orm.Group.name)]
    except Exception:  # not JupyterHub's User, or no database: check later
        return None
