"""Files: where the checkout's folders are, and writing a file so that no reader ever sees half of it.

``REPO_ROOT`` is the checkout that holds this ``course_lib`` (``data/``, ``prometheus/``,
``loadtests/``, ``requirements.lock`` and ``exercises/`` live there).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

#: The checkout holding this course_lib: ``course_lib/core/_io.py`` -> two folders up.
REPO_ROOT = Path(__file__).resolve().parents[2]
