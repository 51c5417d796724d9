"""The server extension's settings are listed where Jupyter admins look for a
server's settings: ``jupyter server --help-all`` and ``jupyter server
--generate-config`` (issue 26). jupyter_server lists only ``ServerApp.classes``
there, before it finds any extension; the wheel's
``hami_jupyter_server_help.pth`` adds ours (hami_jupyter/_server_help.py).
Run as an admin runs them: the venv's ``jupyter`` command, in a child process.
"""

import os
import subprocess
import sys
from pathlib import Path

JUPYTER = str(Path(sys.executable).parent / "jupyter")
SETTINGS = ("HamiProvisioner.memory_limit", "SliceDisplay.warning_fraction",
            "SliceDisplay.critical_fraction", "HamiParking.enabled", "HamiParking.idle_seconds")


def jupyter_server(*argv, env=None):
    done = subprocess.run([JUPYTER, "server", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_all_lists_the_extensions_settings():
    shown = jupyter_server("--help-all")
    for heading in ("HamiProvisioner(LocalProvisioner) options", "SliceDisplay(Configurable) options",
                    "HamiParking(LoggingConfigurable) options"):
        assert f"\n{heading}\n" in shown, heading
    for setting in SETTINGS:
        assert f"\n--{setting}=" in shown, setting
    # With its help text and default, as for the server's own settings.
    warning = shown.split("\n--SliceDisplay.warning_fraction=<Float>\n", 1)[1].split("\n--", 1)[0]
    assert "the JupyterLab status bar turns orange" in warning and "Default: 0.8" in warning


def test_generate_config_writes_the_extensions_settings(tmp_path):
    jupyter_server("--generate-config", "-y", env={"JUPYTER_CONFIG_DIR": str(tmp_path)})
    written = (tmp_path / "jupyter_server_config.py").read_text()
    for setting in SETTINGS:
        assert f"\n# c.{setting} = " in written, setting
    assert "# c.HamiParking.enabled = False\n" in written
