"""What each spawner needs from the policy, on a single host.

``pre_spawn_hook(policy)`` makes the user's slice files (as root) and puts the
slice into the server's environment; ``options_form`` / ``options_from_form``
let a user pick among the sizes offered to them (LocalProcessSpawner,
SystemdSpawner, The Littlest JupyterHub), and ``apply_user_options`` refuses a
size the user may not have. ``SlicePolicy.configure_spawner(c)`` sets them all.
"""

import html

from ..slice_paths import user_slice_name
from .policy import PolicyError
from .slice_files import owner_of, prepare_user_slice

FORM_FIELD = "slice_size"


def _groups(spawner):
    return [g.name for g in getattr(spawner.user, "groups", [])]


def pre_spawn_hook(policy):
    """A ``Spawner.pre_spawn_hook`` that prepares the user's slice."""

    def hook(spawner):
        user = spawner.user.name
        size = policy.choose(user, _groups(spawner), (spawner.user_options or {}).get(FORM_FIELD))
        if size is None:
            spawner.log.info("hami-jupyter: no slice size for %s: the server runs without limits", user)
            return
        name = user_slice_name({"JUPYTERHUB_USER": user})
        uid, gid = owner_of(user)
        path = prepare_user_slice(name, size, uid, gid, policy.slice_root, policy.admin_group)
        env = dict(size.environment())
        env.update({"HAMI_SLICE": str(path), "HAMI_SLICE_ROOT": policy.slice_root})
        spawner.environment.update(env)
        spawner.log.info("hami-jupyter: %s gets slice %s (%s, size %s)", user, path,
                         size.describe(), size.name)

    return hook


def apply_user_options(policy):
    """A ``Spawner.apply_user_options`` callable (JupyterHub 5.3+): a size the
    user may not have is refused before anything starts, as a 400 with the
    reason, rather than an error inside the spawn."""

    def apply(spawner, user_options):
        picked = (user_options or {}).get(FORM_FIELD)
        try:
            policy.choose(spawner.user.name, _groups(spawner), picked)
        except PolicyError as e:
            from tornado.web import HTTPError
            raise HTTPError(400, str(e)) from None
        if picked:
            spawner.user_options = {**(spawner.user_options or {}), FORM_FIELD: picked}

    return apply


def options_form(policy):
    """A ``Spawner.options_form`` callable: a choice of the sizes offered to the
    user, their own preselected; no form when there is nothing to choose."""

    def form(spawner):
        sizes = policy.offered(spawner.user.name, _groups(spawner))
        if len(sizes) < 2:
            return ""
        options = []
        for i, size in enumerate(sizes):
            label = size.display_name or f"{size.name}: {size.describe()}"
            options.append(f'<option value="{html.escape(size.name)}"{" selected" if i == 0 else ""}>'
                           f"{html.escape(label)}</option>")
        return (f'<label for="{FORM_FIELD}">GPU slice</label>\n'
                f'<select class="form-control" name="{FORM_FIELD}" id="{FORM_FIELD}">\n'
                + "\n".join(options) + "\n</select>")

    return form


def options_from_form(policy):
    """A ``Spawner.options_from_form`` callable: the picked size's name, checked
    against the policy (the hook checks again who may have it)."""

    def parse(formdata):
        picked = (formdata.get(FORM_FIELD) or [""])[0]
        if picked and picked not in policy.size_names:
            raise PolicyError(f"unknown GPU slice size {picked!r}")
        return {FORM_FIELD: picked} if picked else {}

    return parse
