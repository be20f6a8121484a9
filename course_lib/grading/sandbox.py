"""Run a student's grading kernel in a sandbox: bubblewrap, else util-linux ``unshare``, else refuse.

nbgrader executes submissions with nbclient, which starts kernels through a jupyter_client
``KernelManager`` (``NotebookClient.kernel_manager_class``). :class:`SandboxedKernelManager` is such
a manager: it wraps the kernelspec's command line so that the kernel runs in the view of
:func:`course_lib.grading.view.kernel_view`, built by the first mechanism that works here
(:func:`find_sandbox`):

1. ``bwrap`` (bubblewrap, the sandbox Flatpak uses; Debian package ``bubblewrap``):
   :func:`bwrap_command`;
2. ``unshare`` (util-linux user, mount, PID and network namespaces, ``pivot_root``; no daemon):
   :func:`course_lib.grading.unshare.unshare_command`;
3. otherwise no sandbox: autograding refuses unless the instructor asks for ``none`` (``--unsafe``).

Either way the kernel sees the system, the Python environment and ``course_lib`` read-only and a
private scratch copy of its notebook's folder (the non-notebook files nbgrader put there; never the
notebook itself, whose hidden tests are restored before grading); the course root, ``source/``, other
submissions, the gradebook and feedback do not exist in its file system. It has its own network
namespace (no network), its own PID namespace (a process it starts, detached or not, dies with the
kernel, and the sandbox dies with the grader), no capabilities, a new session, a clean environment,
memory, CPU-time and file-size limits and a size-limited private ``/tmp``.

The kernel talks to the grader over ZeroMQ ``ipc`` (Unix socket files in a folder bound into the
sandbox) because TCP on the host's loopback is not reachable from a separate network namespace.
Interrupts use the kernel's control channel (``interrupt_mode = "message"``): a SIGINT sent to the
process group would stop the sandbox's own process.

Docker and Podman are not used: Docker needs a daemon (and membership of its group is root on the
host), and neither could be tested where this was written.

References
----------
bubblewrap: https://github.com/containers/bubblewrap (``bwrap(1)``). jupyter_client
``KernelManager.format_kernel_cmd`` and ``transport``/``ip`` (``ConnectionFileMixin``); nbclient
``NotebookClient.kernel_manager_class``.
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

from course_lib.grading.unshare import find_tools, unshare_command
from course_lib.grading.view import ETC_FILES, GIB, MIB, PASSED_ENV, PROC_READ_ONLY, KernelView, kernel_view

__all__ = [
    "ETC_FILES",
    "MECHANISMS",
    "PASSED_ENV",
    "SANDBOXES",
    "SandboxUnavailableError",
    "SandboxedKernelManager",
    "bwrap_command",
    "find_sandbox",
    "sandbox_command",
]

#: Sandbox mechanisms in the order ``auto`` tries them.
MECHANISMS = ("bwrap", "unshare")
#: Sandbox choices: ``auto`` (the first of :data:`MECHANISMS` that works, else refuse), one mechanism
#: (that one or refuse), or ``none`` (unsafe: student code runs with the grader's rights).
SANDBOXES = ("auto", *MECHANISMS, "none")
_INSTALL_HINTS = {
    "bwrap": "bubblewrap (`bwrap`) is not installed: install it (Debian/Ubuntu: `apt-get install "
    "bubblewrap`, or `make system-deps`)",
    "unshare": "util-linux's `unshare`, `setpriv`, `mount`, `umount`, `pivot_root` are not all installed "
    "(Debian/Ubuntu: `apt-get install util-linux mount`)",
}
_USERNS_HINT = (
    "Unprivileged user namespaces may be disabled (sysctl user.max_user_namespaces > 0; "
    "kernel.unprivileged_userns_clone=1 on older Debian; kernel.apparmor_restrict_unprivileged_userns=0 "
    "on Ubuntu 23.10+), or this is a container without them"
)


class SandboxUnavailableError(RuntimeError):
    """No working sandbox on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxCheck:
    """Outcome of :func:`find_sandbox`: ``mechanism`` (one of :data:`MECHANISMS`) or ``None`` with ``reason``."""

    mechanism: str | None
    executable: str | None
    reason: str


def bwrap_command(view: KernelView, *, bwrap: str) -> list[str]:
    """The ``bwrap`` command line that runs ``view.command`` in ``view``'s sandbox.

    Parameters
    ----------
    view : KernelView
        What the kernel sees (:func:`course_lib.grading.view.kernel_view`).
    bwrap : str
        Path of the ``bwrap`` executable.

    Returns
    -------
    list of str
    """
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for key, value in view.env.items():
        args += ["--setenv", key, value]
    for target, path in view.symlinks:
        args += ["--symlink", target, path]
    args += ["--size", str(view.tmp_size_bytes), "--tmpfs", "/tmp"]  # first: binds below may lie under /tmp
    for src, dest in view.read_only:
        args += ["--ro-bind", src, dest]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for device in view.devices:  # over --dev's writable binds of the host's nodes
        args += ["--ro-bind", device, device]
    for path in PROC_READ_ONLY:  # bubblewrap 0.8 covers only some of them, and only when writable
        args += ["--ro-bind-try", path, path]
    for src, dest in view.writable:
        args += ["--bind", src, dest]
    return [*args, "--remount-ro", "/", "--chdir", view.cwd, "--", *view.command]


def sandbox_command(mechanism: str, executable: str, view: KernelView, *, scratch: str) -> list[str]:
    """The command line running ``view`` with ``mechanism`` (``scratch``: a private host folder).

    Raises
    ------
    ValueError
        If ``mechanism`` is not one of :data:`MECHANISMS`.
    """
    if mechanism == "bwrap":
        return bwrap_command(view, bwrap=executable)
    if mechanism == "unshare":
        root = Path(scratch, "root")
        root.mkdir(exist_ok=True)
        return unshare_command(view, root_dir=str(root))
    raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")


@functools.lru_cache(maxsize=8)
def _probe(mechanism: str, executable: str) -> str | None:
    """Run ``true`` in the sandbox configuration used for kernels; None if it works, else the error."""
    with tempfile.TemporaryDirectory(prefix="grading-probe-") as scratch:
        view = kernel_view(["/bin/true"], cwd=scratch, work_dir=scratch, ipc_dir=scratch)
        try:
            cmd = sandbox_command(mechanism, executable, view, scratch=scratch)
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"`{mechanism}` could not run: {error}"
    if done.returncode != 0:
        return f"`{mechanism}` is installed but cannot build the sandbox here: {done.stderr.strip()[-500:]}"
    return None


def _executable(mechanism: str) -> str | None:
    if mechanism == "bwrap":
        return shutil.which("bwrap")
    tools = find_tools()
    return tools["unshare"] if all(tools.values()) else None


def find_sandbox(prefer: str = "auto") -> SandboxCheck:
    """Find a working sandbox for grading kernels.

    Parameters
    ----------
    prefer : {"auto", "bwrap", "unshare", "none"}
        ``auto`` tries :data:`MECHANISMS` in order (bubblewrap, then ``unshare``) and takes the first
        that runs a test command; a mechanism's name tries that one only; ``none`` returns no
        mechanism (unsafe).

    Returns
    -------
    SandboxCheck
        The mechanism and its executable, or ``None`` with the reason for each mechanism tried.

    Raises
    ------
    ValueError
        If ``prefer`` is not one of :data:`SANDBOXES`.
    """
    if prefer not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {SANDBOXES}, got {prefer!r}")
    if prefer == "none":
        return SandboxCheck(None, None, "sandbox disabled (--unsafe): student code runs with your rights")
    if sys.platform != "linux":
        return SandboxCheck(None, None, f"the sandboxes need Linux namespaces; this is {sys.platform}")
    reasons = []
    for mechanism in MECHANISMS if prefer == "auto" else (prefer,):
        executable = _executable(mechanism)
        failure = _INSTALL_HINTS[mechanism] if executable is None else _probe(mechanism, executable)
        if failure is None:
            return SandboxCheck(mechanism, executable, f"`{mechanism}` works")
        reasons.append(failure)
    if any("cannot build" in reason for reason in reasons):
        reasons.append(_USERNS_HINT)
    return SandboxCheck(None, None, "; ".join(reasons))


class SandboxedKernelManager(AsyncKernelManager):
    """A jupyter_client kernel manager whose kernels run in the sandbox :func:`find_sandbox` picks.

    Configure it from ``nbgrader_config.py``: ``c.SandboxedKernelManager.sandbox`` is ``"auto"``
    (bubblewrap, else ``unshare``), a mechanism's name, or ``"none"``, the unsafe escape that
    ``python -m course_lib.grading autograde --unsafe`` sets. Each kernel gets a fresh scratch folder
    (removed when the kernel is cleaned up).

    Raises
    ------
    SandboxUnavailableError
        At kernel start, when ``sandbox`` is not ``none`` and no mechanism it allows works here.
    """

    sandbox = Unicode("auto", help="auto | bwrap | unshare | none (none runs student code unsandboxed)").tag(
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
        view = kernel_view(
            cmd,
            cwd=str(self._launch_args.get("cwd") or os.getcwd()),
            work_dir=str(Path(self._scratch, "work")),
            ipc_dir=str(Path(self._scratch, "ipc")),
            env=self._launch_args.get("env") or dict(os.environ),
            memory_limit_bytes=self.memory_limit_bytes,
            cpu_limit_s=self.cpu_limit_s,
            file_size_limit_bytes=self.file_size_limit_bytes,
        )
        mechanism, executable = str(self._check.mechanism), str(self._check.executable)
        return sandbox_command(mechanism, executable, view, scratch=self._scratch)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:  # type: ignore[override]
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    cleanup_resources = _async_cleanup_resources  # type: ignore[assignment]
