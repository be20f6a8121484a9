"""What a sandboxed grading kernel sees: one description, built by every sandbox mechanism.

:func:`kernel_view` lists the file system, environment and limits of a student's kernel; the
mechanisms in :mod:`course_lib.grading.sandbox` (bubblewrap) and :mod:`course_lib.grading.unshare`
(util-linux ``unshare``) build exactly this view, so the guarantees do not depend on which one runs:

* read-only: the system folders (``/usr``, ``/opt``, merged-``/usr`` links or folders ``/bin``,
  ``/lib``...), the parts of ``/etc`` in :data:`ETC_FILES`, the Python installation and virtual
  environment, ``course_lib``, ``data/`` and ``build/`` of this checkout, the folder holding the
  kernel's connection file, and the *seed*: the files of the notebook's folder, which the launcher
  copies into the writable folder below before the kernel starts;
* a private ``/dev`` (read-only, its device nodes of :data:`DEVICES` bound read-only) and a ``/proc``
  of the kernel's own PID namespace with the host kernel's knobs (:data:`PROC_READ_ONLY`) read-only;
* writable, and only in memory, each with a size limit (:attr:`KernelView.in_memory`): the
  notebook's folder (``cwd``), ``/tmp``, ``/dev/shm`` and :data:`IPC_DIR`, where the kernel binds its
  ZeroMQ sockets. Nothing the kernel writes reaches the host's disk; the grader reaches the sockets
  through ``/proc/<pid>/root`` (:mod:`course_lib.grading.sandbox`);
* nothing else: the course root, ``source/``, other submissions, the gradebook and feedback do not
  exist in the kernel's file system;
* a clean environment (:data:`PASSED_ENV` plus fixed values) and, applied just before the kernel
  starts, ``RLIMIT_AS`` (address space of one process), ``RLIMIT_CPU`` (CPU seconds),
  ``RLIMIT_FSIZE`` (largest file) and ``RLIMIT_NPROC`` (processes), then a new session. The memory
  and process count of the sandbox as a whole are bounded by :mod:`course_lib.grading.limits`.

References
----------
``setrlimit(2)``, ``setsid(2)``, ``tmpfs(5)`` (``size=``); jupyter_client ``KernelManager.format_kernel_cmd``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from course_lib.core.files import REPO_ROOT as _REPO_ROOT

__all__ = [
    "DEVICES",
    "ETC_FILES",
    "GIB",
    "IPC_DIR",
    "MIB",
    "PASSED_ENV",
    "PROC_READ_ONLY",
    "REPO_ROOT",
    "SEED_DIR",
    "KernelView",
    "kernel_view",
]

REPO_ROOT = _REPO_ROOT
GIB = 1024**3
MIB = 1024**2
#: The parts of /etc a Python kernel uses (the dynamic loader, time zone, fonts, certificates, user names);
#: the rest of /etc (password hashes, host keys, credentials) stays out of the sandbox.
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/fonts",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/mime.types",
)
#: Environment variables passed into the sandbox (everything else, tokens included, is dropped).
PASSED_ENV = ("LANG", "LC_ALL", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TZ")
#: Device nodes the kernel gets, bound read-only: writing to a device works, changing the node (its mode,
#: owner) does not. A kernel run by root owns the host's nodes, so a writable bind would let it chmod them.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
#: /proc entries that change the host kernel (global sysctls, sysrq): read-only inside. Their permission
#: checks look at the user id only, and a kernel run by root keeps root's id outside its namespace.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
#: Top-level folders that are links into /usr on merged-/usr systems (kept as links), else bound.
TOP_FOLDERS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32")
#: Inside the sandbox: the in-memory folder of the kernel's sockets, and where the seed is bound.
IPC_DIR = "/run/grading/ipc"
SEED_DIR = "/run/grading/seed"
# Applied inside the sandbox, then the kernel command is exec'd:
# argv = [as, cpu, fsize, nproc, seed, cwd, *cmd]. setsid fails (harmlessly) where the sandbox already
# made the process a session leader.
_LIMITS_LAUNCHER = (
    "import os, resource, shutil, sys\n"
    "for name, value in zip(('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NPROC'), sys.argv[1:5]):\n"
    "    if int(value) > 0:\n"
    "        resource.setrlimit(getattr(resource, name), (int(value), int(value)))\n"
    "shutil.copytree(sys.argv[5], sys.argv[6], dirs_exist_ok=True)\n"
    "os.chdir(sys.argv[6])\n"
    "try:\n"
    "    os.setsid()\n"
    "except OSError:\n"
    "    pass\n"
    "os.execv(sys.argv[7], sys.argv[7:])\n"
)


@dataclass(frozen=True)
class KernelView:
    """The sandbox of one kernel, independent of the mechanism that builds it.

    Attributes
    ----------
    read_only : tuple of (host path, path inside)
        Bound read-only, in order (a later path may lie inside an earlier one).
    symlinks : tuple of (target, path inside)
        Links to create (merged-/usr ``/bin -> usr/bin``).
    devices : tuple of str
        Device nodes of :data:`DEVICES` that exist here, bound read-only at the same path in a
        private, read-only ``/dev`` (which also holds the ``fd``/``stdin``... links).
    in_memory : tuple of (path inside, size in bytes)
        Writable in-memory file systems (tmpfs), in mount order: ``/tmp``, ``/dev/shm``, ``cwd``,
        :data:`IPC_DIR`.
    cwd : str
        Working folder inside (the notebook's folder as the grader sees it).
    env : dict of str to str
        The whole environment of the kernel.
    command : tuple of str
        What to run inside: the limits launcher, the limits, the seed and cwd, then the kernel command.
    """

    read_only: tuple[tuple[str, str], ...]
    symlinks: tuple[tuple[str, str], ...]
    devices: tuple[str, ...]
    in_memory: tuple[tuple[str, int], ...]
    cwd: str
    env: dict[str, str]
    command: tuple[str, ...]

    def size_of(self, path: str) -> int:
        """Size limit of the in-memory file system at ``path`` (KeyError if there is none)."""
        return dict(self.in_memory)[path]


def _read_only(paths: list[Path]) -> list[tuple[str, str]]:
    """(real path, dest) for each existing path, at its real location and at the path as written."""
    binds: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path in paths:
        if not os.path.lexists(path):
            continue
        real = os.path.realpath(path)
        for dest in dict.fromkeys([real, os.path.abspath(path)]):
            if dest not in seen:
                binds.append((real, dest))
                seen.add(dest)
    return binds


def _kernel_env(env: dict[str, str]) -> dict[str, str]:
    kept = {key: env[key] for key in PASSED_ENV if key in env}
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {
        **kept,
        "PATH": path,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "IPYTHONDIR": "/tmp/.ipython",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "NBGRADER_EXECUTION": env.get("NBGRADER_EXECUTION", "autograde"),
        # ipykernel: 1 means "no parent to watch" (the sandbox dies with its parent anyway) and keeps
        # it from printing its console banner into the grader's log.
        "JPY_PARENT_PID": "1",
    }


def _check_limits(limits: dict[str, int], sizes: dict[str, int]) -> None:
    """Raise ValueError for a resource limit below 0 (0: no limit) or an in-memory size below 1 byte."""
    for name, value in limits.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0 (0: no limit), got {value}")
    for path, value in sizes.items():
        if value < 1:
            raise ValueError(f"the in-memory file system at {path} needs a size >= 1 byte, got {value}")


def _python_installation() -> tuple[str, list[Path]]:
    """This interpreter as an absolute path, and the folders of its installation and virtual environment.

    The path has no "..": started as ../.venv/bin/python, the path as written would go through folders
    the sandbox does not show.
    """
    python = os.path.abspath(sys.executable)
    return python, [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(python).parent]


def kernel_view(
    kernel_cmd: list[str],
    *,
    cwd: str,
    seed_dir: str,
    connection_dir: str,
    env: dict[str, str] | None = None,
    memory_limit_bytes: int = 4 * GIB,
    cpu_limit_s: int = 600,
    file_size_limit_bytes: int = 256 * MIB,
    max_processes: int = 0,
    tmp_size_bytes: int = 256 * MIB,
    shm_size_bytes: int = 64 * MIB,
    cwd_size_bytes: int = 256 * MIB,
    ipc_size_bytes: int = MIB,
) -> KernelView:
    """Describe the sandbox that runs ``kernel_cmd``.

    Parameters
    ----------
    kernel_cmd : list of str
        The command to run (for a kernel: the formatted kernelspec ``argv``).
    cwd : str
        Working folder as the kernel sees it (the notebook's folder): an in-memory file system there.
    seed_dir : str
        Host folder whose files are copied into ``cwd`` before the kernel starts (bound read-only).
    connection_dir : str
        Host folder holding the connection file, bound read-only at the same path.
    env : dict, optional
        Environment to pass (default: this process's); only :data:`PASSED_ENV` keys survive, plus
        fixed HOME, PATH, PYTHONPATH.
    memory_limit_bytes, cpu_limit_s, file_size_limit_bytes, max_processes : int
        ``RLIMIT_AS`` (bytes per process), ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_FSIZE`` (bytes per
        file), ``RLIMIT_NPROC`` (processes of the sandbox's user); 0 means no limit.
    tmp_size_bytes, shm_size_bytes, cwd_size_bytes, ipc_size_bytes : int
        Sizes of the in-memory ``/tmp``, ``/dev/shm``, ``cwd`` and :data:`IPC_DIR`, bytes (each > 0).

    Returns
    -------
    KernelView

    Raises
    ------
    ValueError
        If a limit is negative or a size is not positive.
    """
    limits = {
        "memory_limit_bytes": memory_limit_bytes,
        "cpu_limit_s": cpu_limit_s,
        "file_size_limit_bytes": file_size_limit_bytes,
        "max_processes": max_processes,
    }
    sizes = {"/tmp": tmp_size_bytes, "/dev/shm": shm_size_bytes, cwd: cwd_size_bytes, IPC_DIR: ipc_size_bytes}
    _check_limits(limits, sizes)
    python, python_dirs = _python_installation()
    kernel_cmd = [python if part == sys.executable else part for part in kernel_cmd]
    symlinks = [(os.readlink(top), top) for top in TOP_FOLDERS if os.path.islink(top)]
    top_dirs = [Path(top) for top in TOP_FOLDERS if os.path.isdir(top) and not os.path.islink(top)]
    system = [Path(p) for p in ("/usr", "/opt", *ETC_FILES)]
    # build/ holds what the lessons built (feature stores, the trained model): read-only, so a problem set
    # can read them (the capstone's baseline) and never change them.
    course = [REPO_ROOT / "course_lib", REPO_ROOT / "data", REPO_ROOT / "build"]
    launcher = [python, "-I", "-c", _LIMITS_LAUNCHER]
    launcher += [str(memory_limit_bytes), str(cpu_limit_s), str(file_size_limit_bytes), str(max_processes)]
    launcher += [SEED_DIR, cwd]
    read_only = _read_only(top_dirs + system + python_dirs + course)
    read_only += [(seed_dir, SEED_DIR), (connection_dir, connection_dir)]
    return KernelView(
        read_only=tuple(read_only),
        symlinks=tuple(symlinks),
        devices=tuple(dev for dev in DEVICES if os.path.exists(dev)),
        in_memory=tuple(sizes.items()),
        cwd=cwd,
        env=_kernel_env(dict(os.environ if env is None else env)),
        command=(*launcher, *kernel_cmd),
    )
