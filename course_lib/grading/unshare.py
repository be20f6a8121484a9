"""The grading sandbox without bubblewrap: util-linux ``unshare``, ``mount`` and ``pivot_root``.

Where bubblewrap is missing, :func:`unshare_command` builds the same
:class:`~course_lib.grading.view.KernelView` with tools every Linux distribution ships in ``util-linux`` (no
daemon, no setuid helper):

1. ``setpriv --pdeathsig KILL`` makes ``unshare`` die with the grader; ``unshare --user --map-root-user
   --mount --net --pid --ipc --uts --cgroup --fork --kill-child`` creates the namespaces and starts a
   shell as PID 1 of the new PID namespace, killed when ``unshare`` dies (every process of the namespace,
   detached ones included, dies with it);
2. the shell mounts a tmpfs as the new root, bind-mounts the view's read-only paths into it and
   remounts each bind read-only, adds a private size-limited ``/tmp``, a minimal read-only ``/dev``
   (null, zero, full, random, urandom, tty) with a size-limited ``/dev/shm``, a ``/proc`` of the new
   PID namespace with ``/proc/sys`` and the other host kernel knobs read-only, then the size-limited
   in-memory notebook folder and socket folder;
3. ``pivot_root`` into it and a lazy ``umount`` of the old root: the host's file system is no longer
   reachable from the namespace at all (not merely hidden, as ``chroot`` would leave it); the root
   is remounted read-only;
4. ``setpriv`` empties every capability set (bounding, inheritable, ambient) and sets
   ``no_new_privs``, so the kernel can neither undo a read-only mount nor mount anything; ``env -i``
   gives it the view's environment only; the view's launcher applies the limits and starts the kernel
   as a child of the shell (PID 2, as under bubblewrap: PID 1 would ignore a ``SIGKILL`` sent from
   inside, so a kernel that kills itself would not die).

The network namespace has no interface up (bubblewrap brings its loopback up; the kernel talks to the
grader over ipc sockets either way). An unprivileged user needs user namespaces enabled
(``user.max_user_namespaces`` > 0; Debian before 11: ``kernel.unprivileged_userns_clone=1``; Ubuntu 23.10
and later restrict them with AppArmor: ``kernel.apparmor_restrict_unprivileged_userns=0`` or a profile).

References
----------
util-linux ``unshare(1)``, ``mount(8)`` (``-o remount,bind,ro``), ``pivot_root(8)``, ``setpriv(1)``;
``pivot_root(2)`` (the ``pivot_root(".", ".")`` idiom), ``mount_namespaces(7)`` and
``user_namespaces(7)`` (flags of mounts copied into a less privileged namespace are locked, which is why
each read-only remount repeats the source mount's ``nosuid``/``nodev``/``noexec``/atime flags).
"""

from __future__ import annotations

import os
import shlex
import shutil

from course_lib.grading.view import PROC_READ_ONLY, KernelView

__all__ = ["TOOLS", "find_tools", "unshare_command"]

#: util-linux programs the sandbox needs besides ``unshare``.
TOOLS = ("setpriv", "mount", "umount", "pivot_root", "env")
# Where an unprivileged user's PATH may lack the system folders (pivot_root lives in /usr/sbin).
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])

# Arguments: the mount program, the new root's mount point, then the command to run inside.
_SCRIPT_HEAD = r"""set -eu
MOUNT=$1; R=$2; shift 2
PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH
ro() {  # host path, path inside, remount options
    if [ -d "$1" ]; then mkdir -p "$R$2"
    elif [ ! -e "$R$2" ]; then mkdir -p "$(dirname "$R$2")"; : > "$R$2"; fi
    "$MOUNT" --bind "$1" "$R$2"
    "$MOUNT" -o "remount,bind,ro$3" "$R$2"
}
"""


def find_tools() -> dict[str, str | None]:
    """Path of each of :data:`TOOLS` and of ``unshare`` (None where missing), searching the system folders."""
    return {name: shutil.which(name, path=_SEARCH_PATH) for name in ("unshare", *TOOLS)}


def _flags(path: str, *, device: bool = False) -> str:
    """Remount options keeping the flags of ``path``'s mount that a user namespace may not clear."""
    found = os.statvfs(path).f_flag
    opts = [",nosuid"] + ([] if device else [",nodev"])
    opts += [",noexec"] if found & os.ST_NOEXEC else []
    if found & os.ST_NOATIME:
        opts.append(",noatime")
    elif not found & os.ST_RELATIME:
        opts.append(",strictatime")
    opts += [",nodiratime"] if found & os.ST_NODIRATIME else []
    return "".join(opts)


def _script(view: KernelView, tools: dict[str, str]) -> str:
    q = shlex.quote
    mount, umount = '"$MOUNT"', q(tools["umount"])
    lines = [_SCRIPT_HEAD]
    lines.append(f'{mount} -t tmpfs -o mode=0755,size=16m grading-root "$R"')
    tmp = f"mode=1777,nosuid,nodev,size={view.size_of('/tmp')}"
    lines.append(f'mkdir -p "$R/tmp" && {mount} -t tmpfs -o {tmp} grading-tmp "$R/tmp"')
    lines += [f"ro {q(src)} {q(dest)} {q(_flags(src))}" for src, dest in view.read_only]
    lines += [f'ln -s {q(target)} "$R"{q(path)}' for target, path in view.symlinks]
    lines.append(f'mkdir -p "$R/dev" && {mount} -t tmpfs -o mode=0755,nosuid,size=1m grading-dev "$R/dev"')
    lines += [f"ro {q(dev)} {q(dev)} {q(_flags(dev, device=True))}" for dev in view.devices]
    for index, name in enumerate(("stdin", "stdout", "stderr")):
        lines.append(f'ln -s /proc/self/fd/{index} "$R/dev/{name}"')
    lines.append('ln -s /proc/self/fd "$R/dev/fd"')
    shm = f"mode=1777,nosuid,nodev,size={view.size_of('/dev/shm')}"
    lines.append(f'mkdir "$R/dev/shm" && {mount} -t tmpfs -o {shm} grading-shm "$R/dev/shm"')
    lines.append(f'{mount} -o remount,bind,ro,nosuid "$R/dev"')
    lines.append(f'mkdir -p "$R/proc" && {mount} -t proc -o nosuid,nodev,noexec proc "$R/proc"')
    for name in PROC_READ_ONLY:
        path = f'"$R"{q(name)}'
        lines.append(
            f"if [ -e {path} ]; then {mount} --bind {path} {path}; "
            f"{mount} -o remount,bind,ro,nosuid,nodev,noexec {path}; fi"
        )
    for path, size in view.in_memory:
        if path not in ("/tmp", "/dev/shm"):
            opts = f"mode=0755,nosuid,nodev,size={size}"
            lines.append(f'mkdir -p "$R"{q(path)} && {mount} -t tmpfs -o {opts} grading-mem "$R"{q(path)}')
    lines.append(f'cd "$R" && {q(tools["pivot_root"])} . . && {umount} -l . && cd /')
    lines.append(f"{mount} -o remount,bind,ro /")
    lines.append(f"cd {q(view.cwd)}")
    drop = "--no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all"
    env = " ".join(q(f"{key}={value}") for key, value in view.env.items())
    # Not exec'd: the shell stays PID 1, so the kernel is an ordinary process that a signal can kill
    # (PID 1 ignores signals it has no handler for) and the namespace ends when the kernel does.
    lines.append(f'{q(tools["setpriv"])} {drop} -- {q(tools["env"])} -i {env} "$@"')
    return "\n".join(lines) + "\n"


def unshare_command(
    view: KernelView, *, root_dir: str, tools: dict[str, str | None] | None = None
) -> list[str]:
    """The command line that runs ``view.command`` in ``view``'s sandbox built with util-linux.

    Parameters
    ----------
    view : KernelView
        What the kernel sees (:func:`course_lib.grading.view.kernel_view`).
    root_dir : str
        An empty host folder; the sandbox's root file system is mounted on it inside the new mount
        namespace only (the host sees it stay empty).
    tools : dict, optional
        Paths of ``unshare`` and :data:`TOOLS` (default: :func:`find_tools`).

    Returns
    -------
    list of str

    Raises
    ------
    FileNotFoundError
        If ``unshare`` or one of :data:`TOOLS` is not installed (it names them).
    """
    found = find_tools() if tools is None else tools
    missing = [name for name in ("unshare", *TOOLS) if not found.get(name)]
    if missing:
        raise FileNotFoundError(f"the unshare sandbox needs util-linux programs that are missing: {missing}")
    paths: dict[str, str] = {name: str(path) for name, path in found.items() if path}
    namespaces = ["--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts", "--cgroup"]
    return [
        paths["setpriv"],
        "--pdeathsig",
        "KILL",
        "--",
        paths["unshare"],
        *namespaces,
        "--propagation",
        "private",
        "--fork",
        "--kill-child=SIGKILL",
        "--",
        "/bin/sh",
        "-c",
        _script(view, paths),
        "grading-sandbox",
        paths["mount"],
        root_dir,
        *view.command,
    ]
