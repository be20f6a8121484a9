"""A real JupyterLab terminal of ``make lab``: ``python`` there is the course environment's.

The server starts as ``make lab`` starts JupyterLab (``config/student-jupyter``, ``.venv/bin`` first on
``PATH``, ``VIRTUAL_ENV`` set), with a home folder whose ``~/.bashrc`` puts another ``python`` first, as
pyenv or conda do. A terminal is opened through the terminals API and asked which ``python`` it runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from course_lib.core.process import free_port
from course_lib.core.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
LIFETIME_S = 300  # the server stops by itself after this long, also if this test's process is killed


# the printed answer: PY=<path>=END, or PY==END when there is no python; the echoed command line
# (PY=$(command -v python)=END) does not match
ANSWER = re.compile(r"PY=(/[^=\s]*|)=END")


async def _which_python(url: str, token: str) -> str:
    """Type a command into the terminal at ``url``; the path of ``python`` it printed."""
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    ws.write_message(json.dumps(["stdin", 'echo "PY=$(command -v python)=END"\r']))
    seen = ""
    while not ANSWER.search(seen):
        message = await ws.read_message()
        assert message is not None, f"terminal closed; output so far: {seen!r}"
        kind, *rest = json.loads(message)
        if kind == "stdout":
            seen += rest[0]
    ws.close()
    return ANSWER.search(seen).group(1)  # type: ignore[union-attr]


def test_a_lab_terminal_runs_the_course_python_even_when_bashrc_puts_another_first(tmp_path: Path) -> None:
    home, fake_bin = tmp_path / "home", tmp_path / "pyenv-shims"
    home.mkdir()
    fake_bin.mkdir()
    (fake_bin / "python").write_text("#!/bin/sh\necho not-the-course-python\n")
    (fake_bin / "python").chmod(0o755)
    (home / ".bashrc").write_text(f'export PATH="{fake_bin}:$PATH"\n')
    port, token = free_port(), "course-terminal-test"
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "JUPYTER_CONFIG_DIR": str(ROOT / "config" / "student-jupyter"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
    }
    server = subprocess.Popen(
        ["timeout", str(LIFETIME_S), str(VENV_BIN / "jupyter"), "server", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"}
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/api/status", headers=auth, timeout=2).status_code == 200
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                return False

        wait_until(up, timeout_s=60, what="the Jupyter server to answer")
        name = httpx.post(f"{base}/api/terminals", headers=auth, timeout=10).json()["name"]
        url = f"ws://127.0.0.1:{port}/terminals/websocket/{name}"
        printed = IOLoop.current().run_sync(lambda: _which_python(url, token), timeout=60)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server, and the terminal's bash with it
        server.wait(timeout=30)
    assert printed == str(VENV_BIN / "python")
