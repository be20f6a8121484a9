"""One check for every server the course starts: it stops by itself when its parent dies.

The parent is a Python process standing in for a notebook kernel: it starts the server, prints the server's
URL as the first word of its first line, and waits. The check answers once the server is up, SIGKILLs the
parent (no cleanup runs in it), and waits until the server stops answering.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from course_lib.core.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def server_stops_with_its_parent(script: str, health_path: str, *, what: str, timeout_s: float) -> list[str]:
    """Run ``script`` as the parent, kill it, wait for its server to go; return the parent's first line, split."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None  # started with stdout=PIPE
    try:
        words = parent.stdout.readline().split()
        assert words, f"the parent printed no URL (exit code {parent.poll()})"
        health = words[0] + health_path
        assert httpx.get(health, timeout=10).status_code == 200
        parent.send_signal(signal.SIGKILL)  # the notebook kernel dies: no cleanup runs in it
        parent.wait(10)

        def gone() -> bool:
            try:
                httpx.get(health, timeout=1)
            except httpx.TransportError:
                return True
            return False

        wait_until(gone, timeout_s=timeout_s, interval_s=0.2, what=f"{what} to stop after its parent")
        return words
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()
