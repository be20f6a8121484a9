"""The companion package: the verified implementations the Inference Engineering Workbook's lessons import.

Layered packages, each importing only from the layers to its left (``tests/test_layers.py``)::

    core < churn < serving, optimize < simulate < measure, cost < operate, offline < tools

Lessons import concept modules, e.g. ``from course_lib.churn.model import train_churn_model``; the README
lists every module and the lessons that use it. ``import course_lib`` itself loads nothing heavy:
``env_report`` is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from course_lib._version import __version__

if TYPE_CHECKING:
    from course_lib.core.env import env_report

__all__ = ["__version__", "env_report"]


def __getattr__(name: str) -> Any:
    """Import ``env_report`` on first use, so ``import course_lib`` needs no numpy or pandas."""
    if name == "env_report":
        from course_lib.core.env import env_report  # noqa: PLC0415 (heavy optional dependency)

        return env_report
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
