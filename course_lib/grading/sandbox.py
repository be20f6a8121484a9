"""Pick and build the sandbox of a grading kernel: bubblewrap, else util-linux ``unshare``, else refuse.

The kernels that run students' notebooks (:class:`course_lib.grading.manager.SandboxedKernelManager`)
run in the view of :func:`course_lib.grading.view.kernel_view`, built by the first mechanism that
works here (:func:`find_sandbox`):

1. ``bwrap`` (bubblewrap, the sandbox Flatpak uses; Debian package ``bubblewrap``):
   :func:`bwrap_command`;
2. ``unshare`` (util-linux user, mount, PID and network namespaces, ``pivot_root``; no daemon):
   :func:`course_lib.grading.unshare.unshare_command`;
3. otherwise no sandbox: autograding refuses unless the instructor asks for ``none`` (``--unsafe``).

Either way the kernel sees the system, the Python environment and ``course_lib`` read-only, and
writes only to size-limited in-memory folders (its notebook's folder, seeded with that folder's
files, ``/tmp``, ``/dev/shm``, the folder of its sockets); the course root, ``source/``, other
submissions, the gradebook and feedback do not exist in its file system. It has its own network
namespace (no network), its own PID namespace (a process it starts, detached or not, dies with the
kernel, and the sandbox dies with the grader), no capabilities, a new session, a clean environment
and per-process limits; :mod:`course_lib.grading.limits` bounds the memory and processes of the
sandbox as a whole.

Docker and Podman are not used: Docker needs a daemon (and membership of its group is root on the
host), and neither could be tested where this was written.

References
----------
bubblewrap: https://github.com/containers/bubblewrap (``bwrap(1)``: ``--size`` before ``--tmpfs``,
``--remount-ro``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from course_lib.core.checks import one_of
from course_lib.grading.unshare import find_tools, unshare_command
from course_lib.grading.view import ETC_FILES, PASSED_ENV, PROC_READ_ONLY, KernelView, kernel_view

__all__ = [
    "ETC_FILES",
    "MECHANISMS",
    "PASSED_ENV",
    "SANDBOXES",
    "SandboxUnavailableError",
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
    """Outcome of :func:`find_sandbox`: a ``mechanism`` (one of :data:`MECHANISMS`) or ``None``.

    ``reason`` says why: the mechanism that works, or what failed for each one tried.
    """

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
    # /tmp first: binds below may lie under /tmp.
    args += ["--size", str(view.size_of("/tmp")), "--tmpfs", "/tmp"]
    for src, dest in view.read_only:
        args += ["--ro-bind", src, dest]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for device in view.devices:  # over --dev's writable binds of the host's nodes
        args += ["--ro-bind", device, device]
    args += ["--size", str(view.size_of("/dev/shm")), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    for path in PROC_READ_ONLY:  # bubblewrap 0.8 covers only some of them, and only when writable
        args += ["--ro-bind-try", path, path]
    for path, size in view.in_memory:
        if path not in ("/tmp", "/dev/shm"):
            args += ["--size", str(size), "--tmpfs", path]
    return [*args, "--remount-ro", "/", "--chdir", view.cwd, "--", *view.command]


def sandbox_command(mechanism: str, executable: str, view: KernelView, *, scratch: str) -> list[str]:
    """The command line running ``view`` with ``mechanism`` (``scratch``: a private, empty host folder).

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
        seed = Path(scratch, "seed")
        seed.mkdir()
        view = kernel_view(["/bin/true"], cwd=scratch, seed_dir=str(seed), connection_dir=str(seed))
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
    prefer = one_of("prefer", prefer, SANDBOXES)
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
