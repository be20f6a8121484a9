"""What machine and software produced a lesson's numbers.

Every lesson prints ``env_report()`` first, so a measured number can always be read next to the CPU,
the core count, the thread settings and the library versions that produced it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from course_lib.core.bench import usable_cores
from course_lib.core.files import course_workspace

__all__ = ["THREAD_ENV_VARS", "EnvReport", "course_environment", "cpu_model", "env_report"]

THREAD_ENV_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)
_PACKAGES: tuple[str, ...] = (
    "numpy",
    "pandas",
    "scikit-learn",
    "xgboost",
    "xgboost-cpu",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "skl2onnx",
    "onnxmltools",
    "fastapi",
    "uvicorn",
)


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class EnvReport:
    """A snapshot of the environment; ``str()`` gives the printable table."""

    python: str
    platform: str
    cpu: str
    logical_cores: int
    usable_cores: int
    thread_env: dict[str, str]
    onnxruntime_providers: list[str]
    packages: dict[str, str] = field(default_factory=dict)
    timestamp_utc: str = ""
    load_average_1m: float = 0.0
    environment: str = ""

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        lines = [
            f"python          {self.python}",
            f"platform        {self.platform}",
            f"cpu             {self.cpu}",
            f"cores           {self.usable_cores} usable of {self.logical_cores} logical",
            "threads         " + ", ".join(f"{k}={v}" for k, v in self.thread_env.items()),
            "course pinning  XGBoost nthread=1, ONNX Runtime intra_op_num_threads=1 unless stated otherwise",
            f"load average    {self.load_average_1m:.2f} over the last minute"
            + (
                " (busy: other programs compete for the cores)"
                if self.load_average_1m > 0.5 * self.usable_cores
                else ""
            ),
            "ORT providers   " + ", ".join(self.onnxruntime_providers),
        ]
        if self.environment:
            lines.append(f"environment     {self.environment}")
        lines += [f"{name:<15} {ver}" for name, ver in self.packages.items()]
        lines.append(f"measured at     {self.timestamp_utc}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython display
        p.text(str(self))


def env_report() -> EnvReport:
    """Collect Python and package versions, CPU model, core counts, thread settings and load average.

    Returns
    -------
    EnvReport
        Print it (``print(env_report())``) at the top of a lesson or benchmark.
    """
    try:
        import onnxruntime as ort  # noqa: PLC0415 (heavy optional dependency)

        providers = list(ort.get_available_providers())
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        providers = []
    packages = {name: v for name in _PACKAGES if (v := _version(name)) is not None}
    return EnvReport(
        python=sys.version.split()[0],
        platform=platform.platform(),
        cpu=cpu_model(),
        logical_cores=os.cpu_count() or 1,
        usable_cores=usable_cores(),
        thread_env={k: os.environ.get(k, "unset") for k in THREAD_ENV_VARS},
        onnxruntime_providers=providers,
        packages=packages,
        timestamp_utc=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        load_average_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        environment=course_environment(),
    )


_LOCK = course_workspace() / "requirements.lock"  # the lock of the checkout this runs in, if any


def course_environment(lock: str | Path = _LOCK) -> str:
    """Whether this Python is the course environment: its library versions against ``requirements.lock``.

    Returns one line for ``env_report``: "course environment (...)" when every library the report
    lists is installed at the locked version, otherwise "NOT the course environment: ..." naming the
    first differences and what to do (``make lab``, then pick the course kernel). Empty when there is no
    lock file (outside a course checkout: ``course_lib.core.files.course_workspace``).
    """
    try:
        text = Path(lock).read_text(encoding="utf-8")
    except OSError:
        return ""
    pinned = {}
    for line in text.splitlines():
        if "==" in line and not line.startswith("#") and ";" not in line:
            name, version = line.split("==", 1)
            pinned[name.strip().lower()] = version.strip()
    wrong = []
    for name in _PACKAGES:
        if name in pinned and (installed := _version(name)) != pinned[name]:
            wrong.append(f"{name} {installed or 'missing'} (lock: {pinned[name]})")
    if not wrong:
        return f"course environment (library versions match requirements.lock; python at {sys.prefix})"
    return (
        "NOT the course environment: "
        + ", ".join(wrong[:3])
        + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        + ". Timings and outputs may differ from the lessons'; start JupyterLab with `make lab` in the "
        "repository and use its Python 3 kernel "
        "(elsewhere: `make kernel`, then 'Python (Inference Workbook)')"
    )
