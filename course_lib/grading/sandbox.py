"""Run a student's grading kernel in a bubblewrap sandbox: read-only course code, no network, limits.

nbgrader executes submissions with nbclient, which starts kernels through a jupyter_client
``KernelManager`` (``NotebookClient.kernel_manager_class``). :class:`SandboxedKernelManager` is such
a manager: it wraps the kernelspec's command line in ``bwrap`` (bubblewrap, the sandbox Flatpak uses;
Debian package ``bubblewrap``) so that the kernel

* sees only the system folders (``/usr``, the parts of ``/etc`` Python needs...), the Python installation and virtual environment,
  ``course_lib`` and ``data/`` of this checkout, all **read-only**, and the notebook's folder, which is a
  **private scratch copy** (the non-notebook files nbgrader put there; never the notebook itself, whose
  hidden tests are restored before grading). Course root, ``source/``, other submissions, the gradebook
  and feedback do not exist in its file system;
* has its own network namespace with nothing but a loopback (no network), its own PID namespace (a
  process it starts, detached or not, dies with the kernel: ``--die-with-parent``), no capabilities,
  a new session (no terminal injection) and a clean environment;
* runs under ``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (CPU seconds for the whole kernel) and
  ``RLIMIT_FSIZE`` (largest file it may write); ``/tmp`` is a size-limited private tmpfs.

The kernel talks to the grader over ZeroMQ ``ipc`` (Unix socket files in a folder bound into the
sandbox) because TCP on the host's loopback is not reachable from a separate network namespace.
Interrupts use the kernel's control channel (``interrupt_mode = "message"``): a SIGINT sent to the
process group would stop ``bwrap`` itself.

References
----------
bubblewrap: https://github.com/containers/bubblewrap (``bwrap(1)``). jupyter_client
``KernelManager.format_kernel_cmd`` and ``transport``/``ip`` (``ConnectionFileMixin``); nbclient
``NotebookClient.kernel_manager_class``. ``setrlimit(2)`` for the limits.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Integer, Unicode

__all__ = [
    "SANDBOXES",
    "SandboxUnavailableError",
    "SandboxedKernelManager",
    "bwrap_command",
    "find_sandbox",
]

#: Sandbox choices: ``auto`` (bubblewrap if it works, else refuse), ``bwrap``, or ``none`` (unsafe).
SANDBOXES = ("auto", "bwrap", "none")
REPO_ROOT = Path(__file__).resolve().parents[2]
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
# Applied inside the sandbox, then the kernel command is exec'd: argv = [mem, cpu, fsize, *cmd].
_LIMITS_LAUNCHER = (
    "import os, resource, sys\n"
    "for name, value in zip(('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE'), sys.argv[1:4]):\n"
    "    if int(value) > 0:\n"
    "        resource.setrlimit(getattr(resource, name), (int(value), int(value)))\n"
    "os.execv(sys.argv[4], sys.argv[4:])\n"
)


class SandboxUnavailableError(RuntimeError):
    """No working sandbox on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxCheck:
    """Outcome of :func:`find_sandbox`: ``mechanism`` is ``"bwrap"`` or ``None`` with ``reason``."""

    mechanism: str | None
    executable: str | None
    reason: str


@functools.lru_cache(maxsize=4)
def _probe_bwrap(bwrap: str) -> str | None:
    """Run ``true`` in the sandbox configuration used for kernels; None if it works, else the error."""
    with tempfile.TemporaryDirectory(prefix="grading-probe-") as scratch:
        cmd = bwrap_command(["/bin/true"], bwrap=bwrap, cwd=scratch, work_dir=scratch, ipc_dir=scratch)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{bwrap} could not run: {error}"
    if done.returncode != 0:
        return f"`bwrap` is installed but cannot create its namespaces here: {done.stderr.strip()}"
    return None


def find_sandbox(prefer: str = "auto") -> SandboxCheck:
    """Find a working sandbox for grading kernels.

    Parameters
    ----------
    prefer : {"auto", "bwrap", "none"}
        ``auto`` and ``bwrap`` look for a working bubblewrap; ``none`` returns no mechanism (unsafe).

    Returns
    -------
    SandboxCheck
        ``mechanism`` ``"bwrap"`` with its path, or ``None`` with the reason in plain words.

    Raises
    ------
    ValueError
        If ``prefer`` is not one of :data:`SANDBOXES`.
    """
    if prefer not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {SANDBOXES}, got {prefer!r}")
    if prefer == "none":
        return SandboxCheck(None, None, "sandbox disabled (--unsafe): student code runs with your rights")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return SandboxCheck(
            None,
            None,
            "bubblewrap (`bwrap`) is not installed: install it (Debian/Ubuntu: `apt-get install bubblewrap`, "
            "or `make system-deps`)",
        )
    if sys.platform != "linux":
        return SandboxCheck(None, None, f"bubblewrap needs Linux namespaces; this is {sys.platform}")
    failure = _probe_bwrap(bwrap)
    if failure is not None:
        return SandboxCheck(
            None,
            bwrap,
            f"{failure}. Unprivileged user namespaces may be disabled "
            "(sysctl kernel.unprivileged_userns_clone=1, or a container without them)",
        )
    return SandboxCheck("bwrap", bwrap, "bubblewrap works")


def _ro_binds(paths: list[Path]) -> list[str]:
    """``--ro-bind`` each existing path (its real location, also at the path as written if a symlink)."""
    args: list[str] = []
    seen: set[str] = set()
    for path in paths:
        if not os.path.lexists(path):
            continue
        real = os.path.realpath(path)
        for dest in dict.fromkeys([real, os.path.abspath(path)]):
            if dest not in seen:
                args += ["--ro-bind", real, dest]
                seen.add(dest)
    return args


def bwrap_command(
    kernel_cmd: list[str],
    *,
    bwrap: str,
    cwd: str,
    work_dir: str,
    ipc_dir: str,
    env: dict[str, str] | None = None,
    memory_limit_bytes: int = 4 * GIB,
    cpu_limit_s: int = 600,
    file_size_limit_bytes: int = 256 * MIB,
    tmp_size_bytes: int = 256 * MIB,
) -> list[str]:
    """The ``bwrap`` command line that runs ``kernel_cmd`` sandboxed.

    Parameters
    ----------
    kernel_cmd : list of str
        The command to run (for a kernel: the formatted kernelspec ``argv``).
    bwrap : str
        Path of the ``bwrap`` executable.
    cwd : str
        Working folder as the kernel sees it (the notebook's folder); ``work_dir`` is mounted there.
    work_dir : str
        Host folder mounted read-write at ``cwd``: the private scratch copy.
    ipc_dir : str
        Host folder mounted read-write at the same path: the connection file and ipc sockets.
    env : dict, optional
        Environment to pass; only :data:`PASSED_ENV` keys survive, plus fixed HOME, PATH, PYTHONPATH.
    memory_limit_bytes, cpu_limit_s, file_size_limit_bytes : int
        ``RLIMIT_AS`` (bytes), ``RLIMIT_CPU`` (CPU seconds over the kernel's life), ``RLIMIT_FSIZE``
        (bytes per file); 0 means no limit.
    tmp_size_bytes : int
        Size of the private ``/tmp`` tmpfs, bytes.

    Returns
    -------
    list of str
    """
    env = dict(os.environ if env is None else env)
    python_dirs = [
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.executable).parent,
    ]
    system = [Path(p) for p in ("/usr", "/opt", *ETC_FILES)]
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args += ["--clearenv"]
    for key in PASSED_ENV:
        if key in env:
            args += ["--setenv", key, env[key]]
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    fixed = {
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
    for key, value in fixed.items():
        args += ["--setenv", key, value]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--size", str(tmp_size_bytes), "--tmpfs", "/tmp"]  # first: binds below may lie under /tmp
    # build/ holds what the lessons built (feature stores, the trained model): read-only, so a problem set
    # can read them (the capstone's baseline) and never change them.
    args += _ro_binds(
        system + python_dirs + [REPO_ROOT / "course_lib", REPO_ROOT / "data", REPO_ROOT / "build"]
    )
    args += ["--dev", "/dev", "--proc", "/proc"]
    args += ["--bind", work_dir, cwd, "--bind", ipc_dir, ipc_dir]
    args += ["--remount-ro", "/", "--chdir", cwd, "--"]
    limits = [str(memory_limit_bytes), str(cpu_limit_s), str(file_size_limit_bytes)]
    return [*args, sys.executable, "-I", "-c", _LIMITS_LAUNCHER, *limits, *kernel_cmd]


class SandboxedKernelManager(AsyncKernelManager):
    """A jupyter_client kernel manager whose kernels run in :func:`bwrap_command`'s sandbox.

    Configure it from ``nbgrader_config.py`` (``c.SandboxedKernelManager.sandbox = "none"`` is the
    unsafe escape; ``python -m course_lib.grading autograde --unsafe`` sets it). Each kernel gets a
    fresh scratch folder (removed when the kernel is cleaned up).

    Raises
    ------
    SandboxUnavailableError
        At kernel start, when ``sandbox`` is ``auto`` or ``bwrap`` and no working bubblewrap exists.
    """

    sandbox = Unicode("auto", help="auto | bwrap | none (none runs student code unsandboxed)").tag(
        config=True
    )
    memory_limit_bytes = Integer(4 * GIB, help="RLIMIT_AS of the kernel, bytes (0: none)").tag(config=True)
    cpu_limit_s = Integer(600, help="RLIMIT_CPU of the kernel, CPU seconds over its life").tag(config=True)
    file_size_limit_bytes = Integer(256 * MIB, help="RLIMIT_FSIZE, bytes per file").tag(config=True)

    _scratch: str | None = None
    _check: SandboxCheck | None = None

    async def _async_pre_start_kernel(self, **kw):  # type: ignore[override]
        if self.sandbox != "none":
            check = find_sandbox(self.sandbox)
            if check.mechanism is None:
                raise SandboxUnavailableError(
                    f"refusing to run student code without a sandbox: {check.reason}. "
                    "Pass --unsafe to `python -m course_lib.grading autograde` to grade anyway."
                )
            self._check = check
            cwd = str(Path(kw.get("cwd") or os.getcwd()).resolve())
            kw["cwd"] = cwd
            self._scratch = tempfile.mkdtemp(prefix="grading-")
            work, ipc = Path(self._scratch, "work"), Path(self._scratch, "ipc")
            shutil.copytree(cwd, work, ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
            ipc.mkdir()
            self.transport = "ipc"
            self.ip = str(ipc / "kernel")
            self.connection_file = str(ipc / "kernel.json")
            if self.kernel_spec is not None:
                self.kernel_spec.interrupt_mode = "message"
        return await super()._async_pre_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.sandbox == "none" or self._scratch is None or self._check is None:
            return cmd
        return bwrap_command(
            cmd,
            bwrap=str(self._check.executable),
            cwd=str(self._launch_args.get("cwd") or os.getcwd()),
            work_dir=str(Path(self._scratch, "work")),
            ipc_dir=str(Path(self._scratch, "ipc")),
            env=self._launch_args.get("env") or dict(os.environ),
            memory_limit_bytes=self.memory_limit_bytes,
            cpu_limit_s=self.cpu_limit_s,
            file_size_limit_bytes=self.file_size_limit_bytes,
        )

    async def _async_cleanup_resources(self, restart: bool = False) -> None:  # type: ignore[override]
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    cleanup_resources = _async_cleanup_resources  # type: ignore[assignment]
