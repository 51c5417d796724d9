"""Real Unix users for the hub tests that run as root (CI does).

* :func:`require_root_users` skips (with the reason) when the tests do not
  run as root or ``useradd`` is missing.
* :class:`UnixUsers` creates ``alice``, ``bob`` and ``carol`` (``useradd -m``)
  and the ``hami-admin`` group (carol is in it), and removes at the end only
  what it created.
* :func:`user_python` returns a Python that those users can run and that
  imports this checkout's packages: this interpreter when they can run it,
  else a virtual environment made in a world-readable folder from the
  system's Python of the same version, which reads this venv's
  site-packages. It has ``bin/jupyterhub-singleuser`` and ``share/jupyter``
  / ``etc/jupyter`` pointing at this venv's, so it looks like a hub's own
  venv (``/opt/jupyterhub``) to ``sys.prefix``.

Why: ``.venv/bin/python`` here is often a link to ``/root/.pyenv/...``, and
``/root`` is 0700: no other user can run it ("Permission denied" from
``runuser``), so a server spawned as alice would never start.
"""

import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

USERS = ("alice", "bob", "carol")
ADMIN_GROUP = "hami-admin"
ADMINS = ("carol",)
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def require_root_users():
    if os.geteuid() != 0:
        pytest.skip("needs root: it creates the Unix users alice, bob, carol and the group "
                    "hami-admin, and runs a root JupyterHub that spawns servers as them")
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing: cannot create or use real Unix users")


def _exists(kind, name):
    return subprocess.run(["getent", kind, name], capture_output=True).returncode == 0


class UnixUsers:
    def __init__(self):
        self.made_users, self.made_group = [], False

    def create(self):
        if not _exists("group", ADMIN_GROUP):
            subprocess.run(["groupadd", ADMIN_GROUP], check=True)
            self.made_group = True
        for name in USERS:
            if not _exists("passwd", name):
                # As docs/single-host.md adds them: a home only its user may enter
                # (a plain -m made it 0755 on Debian 12).
                cmd = ["useradd", "-m", "-K", "HOME_MODE=0700", "-s", "/bin/bash"]
                if name in ADMINS:
                    cmd += ["-G", ADMIN_GROUP]
                subprocess.run(cmd + [name], check=True)
                self.made_users.append(name)
                home = Path(pwd.getpwnam(name).pw_dir)
                if stat.S_IMODE(home.stat().st_mode) != 0o700:
                    raise RuntimeError(f"useradd made {home} mode {stat.S_IMODE(home.stat().st_mode):o}, "
                                       "not 0700, with -K HOME_MODE=0700")
        return self

    def remove(self):
        """Remove what :meth:`create` made. userdel refuses a user who still
        has processes, and a killed process takes a moment to go: wait for
        them, and fail loudly rather than leave users behind."""
        left = []
        for name in self.made_users:
            deadline = time.monotonic() + 10
            while True:
                subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
                done = subprocess.run(["userdel", "-r", name], capture_output=True, text=True)
                # 0, or 12: removed, but the home folder could not be (gone already)
                if done.returncode in (0, 12) or not _exists("passwd", name):
                    break
                if time.monotonic() > deadline:
                    left.append(f"{name}: {done.stderr.strip()}")
                    break
                time.sleep(0.2)
        if self.made_group:
            subprocess.run(["groupdel", ADMIN_GROUP], capture_output=True)
        if left:
            raise RuntimeError("could not remove the test users: " + "; ".join(left))


def runs_as(user, python, code="import hami_jupyter, jupyterhub, jupyter_server"):
    """True when *user* can run *python* and import what the servers need."""
    return subprocess.run([RUNUSER, "-u", user, "--", python, "-c", code],
                          capture_output=True, cwd="/").returncode == 0


def _blocking_folder(path):
    """The first folder on the way to *path* that other users cannot search."""
    for parent in reversed(Path(path).parents):
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def user_python(workdir):
    """``(python, why)``: a Python *alice* can run, made under *workdir* when
    needed; ``(None, reason)`` when there is none."""
    if runs_as("alice", sys.executable):
        return sys.executable, None
    real = os.path.realpath(sys.executable)
    blocked = _blocking_folder(real)
    why = (f"{sys.executable} resolves to {real}"
           + (f", under {blocked} (mode {os.stat(blocked).st_mode & 0o777:03o}), which other "
              "users cannot search" if blocked else ", which other users cannot run"))
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        return None, f"{why}; and there is no system {version} to make a venv they can run"
    workdir = Path(workdir)
    venv = workdir / "venv"
    made = subprocess.run([system, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        return None, f"{why}; and `{system} -m venv` failed: {made.stderr.strip()}"
    here = Path(sysconfig.get_paths()["purelib"])
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "hami-shared-site.pth").write_text(f"import site; site.addsitedir({str(here)!r})\n")
    python = str(venv / "bin" / "python")
    # The commands pip would install: the servers', and hami-jupyter (the hub runs
    # the example's services with it, the hub view's among them).
    for name, module in (("jupyterhub-singleuser", "jupyterhub.singleuser"),
                         ("hami-jupyter", "hami_jupyter.commands.cli")):
        script = venv / "bin" / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import main\n"
                          "sys.exit(main())\n")
        script.chmod(0o755)
    for sub in ("share/jupyter", "etc/jupyter"):
        if (Path(sys.prefix) / sub).is_dir():
            (venv / sub).parent.mkdir(parents=True, exist_ok=True)
            (venv / sub).symlink_to(Path(sys.prefix) / sub)
    if not runs_as("alice", python):
        return None, f"{why}; and the venv made from {system} does not import the packages as alice"
    return python, None


def shared_tmpdir(prefix):
    """A folder under /tmp that every user can search (pytest's tmp_path is 0700)."""
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o755)
    return Path(d)
