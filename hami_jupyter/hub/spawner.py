"""What each spawner needs from the policy, on a single host.

``pre_spawn_hook(policy)`` makes the user's slice files (as root) and puts the
slice into the server's environment; ``options_form`` / ``options_from_form``
let a user pick among the sizes offered to them (LocalProcessSpawner,
SystemdSpawner, The Littlest JupyterHub), and ``apply_user_options`` refuses a
size the user may not have. ``SlicePolicy.configure_spawner(c)`` sets them all.

What the hook puts in force, no file of the user's can undo: a user's own
Jupyter config (``~/.jupyter``) may turn server extensions off, and with
hami-jupyter's off the default ``python3`` kernelspec started without the
preload library. So the server's own environment carries the library
(``LD_PRELOAD``, appended to any value already there) and the slice
(``HAMI_SLICE``, ``HAMI_HUB_SLICE``): every process the server starts, a
kernel of any kernelspec or a terminal's, inherits them; so does the
memory broker's socket in the hub's slice root (``HAMI_BROKER_SOCKET``,
unless the spawner's environment names one: the library's default is the
default root's, and kernels of a hub with a root of its own would ask no
broker). And the server is started with the extension enabled on its
command line (:data:`EXTENSION_ARG`), which outranks every config file, so
that every kernelspec goes through ``hami-provisioner`` and the REST API,
metrics and parking are there.

Before the slice is made, the hook admits the start (:mod:`.admission`, when
the policy uses guarantees or ``memory_oversubscription``): a start the GPUs
have no room for is refused with a 400 that names the GPU and the slices
holding guarantees there.

JupyterHub keeps a start's user options (``orm_spawner.user_options``) and
reuses them for every later start that names none. A refused size is
therefore dropped from them before the refusal is raised: the next plain
start gets the user's own size instead of the same 400 again.
"""

import html
import os

from .. import native
from ..provisioning.hub_slice import VARIABLE as HUB_SLICE_VARIABLE
from ..slice.broker_report import SOCKET_NAME, SOCKET_VARIABLE
from ..slice.paths import user_slice_name
from . import admission
from .sizes import PolicyError
from .slice_files import owner_of, prepare_user_slice

FORM_FIELD = "slice_size"
# Figures of the size the server would carry from its start on: an
# administrator's live change makes them wrong, and the limits file (which
# every view reads) holds the limits, so the server's environment has none.
LIMIT_FIGURES = ("HAMI_MEMORY_LIMIT", "HAMI_SM_LIMIT", "HAMI_SM_MODE")
# traitlets' form for one entry of a Dict trait on the command line.
EXTENSION_ARG = "--ServerApp.jpserver_extensions=hami_jupyter=True"


def _groups(policy, spawner):
    return policy.spawner_groups(spawner)


def _forget_pick(spawner):
    """Drop the slice size from the user options the spawner holds and from
    those JupyterHub keeps for the next start (other keys are left alone)."""
    spawner.user_options = {k: v for k, v in (spawner.user_options or {}).items()
                            if k != FORM_FIELD}
    orm_spawner = getattr(spawner, "orm_spawner", None)
    kept = getattr(orm_spawner, "user_options", None)
    if not kept or FORM_FIELD not in kept:
        return
    # A new dict (not an in-place change), so SQLAlchemy sees it.
    orm_spawner.user_options = {k: v for k, v in kept.items() if k != FORM_FIELD} or None
    try:
        from sqlalchemy.orm import object_session
        session = object_session(orm_spawner)
        if session is not None:
            session.commit()
    except Exception as e:  # the hub commits on its way out of the failed spawn anyway
        spawner.log.warning("hami-jupyter: could not save the cleared user options: %s", e)


def _refuse(policy, spawner, error):
    """Forget the refused pick, then the 400 that says so."""
    from tornado.web import HTTPError

    _forget_pick(spawner)
    own = policy.own_size(spawner.user.name, _groups(policy, spawner))
    then = f"your own size ({own.name})" if own is not None else "no slice limits"
    return HTTPError(400, f"{error}. This choice is not kept: a start without "
                          f"{FORM_FIELD!r} gets {then}")


def pre_spawn_hook(policy):
    """A ``Spawner.pre_spawn_hook`` that prepares the user's slice."""

    def hook(spawner):
        user = spawner.user.name
        try:
            size = policy.choose(user, _groups(policy, spawner),
                                 (spawner.user_options or {}).get(FORM_FIELD))
        except PolicyError as e:
            # Only without apply_user_options (JupyterHub < 5.3, or a hub that
            # set its own): a size not offered (any more) is refused once.
            spawner.log.warning("hami-jupyter: refusing %s's start: %s", user, e)
            raise _refuse(policy, spawner, e) from None
        if size is None:
            spawner.log.info("hami-jupyter: no slice size for %s: the server runs without limits", user)
            return
        gpus = policy.host_gpus(size, spawner.environment)
        try:
            policy.admit(user, size, admission.hub_running_users(spawner), gpus)
        except admission.AdmissionError as e:
            # The size is the user's to have; only the GPUs are full now. The
            # pick is kept: a later start may find room.
            spawner.log.warning("hami-jupyter: refusing %s's start: %s", user, e)
            from tornado.web import HTTPError
            raise HTTPError(400, str(e)) from None
        name = user_slice_name({"JUPYTERHUB_USER": user})
        uid, gid = owner_of(user)
        path = prepare_user_slice(name, size, uid, gid, policy.slice_root, policy.admin_group,
                                  gpus=gpus, log=spawner.log)
        env = {k: v for k, v in size.environment().items() if k not in LIMIT_FIGURES}
        env.update({"HAMI_SLICE": str(path), "HAMI_SLICE_ROOT": policy.slice_root})
        env[HUB_SLICE_VARIABLE] = str(path)  # every kernel runs in it (provisioning.hub_slice)
        env["LD_PRELOAD"] = _with_library(spawner.environment)
        broker_socket = _broker_socket(policy, spawner)
        if broker_socket:
            env[SOCKET_VARIABLE] = broker_socket
        spawner.environment.update(env)
        for figure in LIMIT_FIGURES:
            spawner.environment.pop(figure, None)
        if EXTENSION_ARG not in (spawner.args or []):
            spawner.args = [*(spawner.args or []), EXTENSION_ARG]
        spawner.log.info("hami-jupyter: %s gets slice %s (%s, size %s)", user, path,
                         size.describe(), size.name)

    return hook


# A Unix socket's path holds 107 bytes; the library refuses a longer setting
# (and disables CUDA), and no broker could listen there anyway.
MAX_SOCKET_PATH = 107


def _broker_socket(policy, spawner):
    """Where the server's kernels ask the memory broker for room: the spawner's
    own setting, else ``<slice root>/broker.sock``, where ``hami-jupyter broker
    --root`` listens (docs/broker.md); None (the library's default) when that
    path is too long for a socket."""
    if spawner.environment.get(SOCKET_VARIABLE):
        return None  # the administrator's, kept as it is
    path = os.path.join(policy.slice_root, SOCKET_NAME)
    if len(path.encode()) > MAX_SOCKET_PATH:
        spawner.log.warning("hami-jupyter: the memory broker's socket %s is longer than a Unix socket "
                            "path may be: %s is not set, kernels ask at the library's default", path,
                            SOCKET_VARIABLE)
        return None
    return path


def _with_library(environment):
    """``LD_PRELOAD`` for the server: what *environment* (the spawner's) has,
    then the preload library, once. The library is found as the server will
    find it (``HAMI_NATIVE_DIR`` of *environment* counts): the hub and the
    servers run from one installation."""
    library = str(native.library_path({**environment}))
    entries = [p for p in str(environment.get("LD_PRELOAD", "")).replace(" ", ":").split(":") if p]
    return ":".join(entries if library in entries else [*entries, library])


def apply_user_options(policy):
    """A ``Spawner.apply_user_options`` callable (JupyterHub 5.3+): a size the
    user may not have is refused before anything starts, as a 400 with the
    reason, rather than an error inside the spawn. The refused size is not
    kept for later starts, whether this start asked for it or it was kept
    from an earlier one (the policy changed since)."""

    def apply(spawner, user_options):
        picked = (user_options or {}).get(FORM_FIELD)
        try:
            policy.choose(spawner.user.name, _groups(policy, spawner), picked)
        except PolicyError as e:
            raise _refuse(policy, spawner, e) from None
        if picked:
            spawner.user_options = {**(spawner.user_options or {}), FORM_FIELD: picked}

    return apply


def options_form(policy):
    """A ``Spawner.options_form`` callable: a choice of the sizes offered to the
    user, their own preselected; no form when there is nothing to choose."""

    def form(spawner):
        sizes = policy.offered(spawner.user.name, _groups(policy, spawner))
        if len(sizes) < 2:
            return ""
        options = []
        for i, size in enumerate(sizes):
            label = size.display_name or f"{size.name}: {size.describe()}"
            # The user's own size written out in users has no size name: it
            # goes back as "" (no pick), which is the user's own size.
            value = size.name if size.name in policy.size_names else ""
            options.append(f'<option value="{html.escape(value)}"{" selected" if i == 0 else ""}>'
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
