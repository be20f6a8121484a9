"""JupyterLab terminals of ``make lab``: an interactive bash whose ``PATH`` starts with the course environment.

A terminal's default shell is a login shell, and a login shell reads ``/etc/profile`` (which on Debian and
Ubuntu sets ``PATH`` afresh) and then ``~/.bashrc`` (where pyenv, conda or Homebrew put themselves first), so
``python`` there was not the course's even though ``make lab`` starts JupyterLab with ``.venv/bin`` first.
This starts an interactive, non-login bash that reads ``terminal_bashrc`` beside this file: the user's own
``~/.bashrc``, then ``$VIRTUAL_ENV/bin`` (set by ``make lab``) first on ``PATH``. Without bash the server's
default shell is kept. Loaded because ``make lab`` sets ``JUPYTER_CONFIG_DIR`` to this folder; the JSON file
beside it holds the rest of the configuration. Reference: jupyter_server documentation, "Config file and
command line options" (``ServerApp.terminado_settings``); terminado's ``shell_command``.
"""

import shutil
from pathlib import Path

c = get_config()  # noqa: F821  (Jupyter injects get_config when it loads this file)

_BASH = shutil.which("bash")
if _BASH is not None:
    c.ServerApp.terminado_settings = {
        "shell_command": [_BASH, "--rcfile", str(Path(__file__).with_name("terminal_bashrc")), "-i"]
    }
