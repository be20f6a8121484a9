"""The kernel manager of grading kernels: a sandboxed kernel the grader reaches without sharing a folder.

nbgrader executes submissions with nbclient, which starts kernels through a jupyter_client
``KernelManager`` (``NotebookClient.kernel_manager_class``). :class:`SandboxedKernelManager` is such a
manager:

* the kernelspec's command line runs in the sandbox of :func:`course_lib.grading.sandbox.find_sandbox`
  (bubblewrap, else ``unshare``), inside the bounds of :func:`course_lib.grading.limits.contain`
  (a cgroup, else the watchdog);
* the kernel binds its ZeroMQ ``ipc`` sockets in a small in-memory folder of its own
  (:data:`~course_lib.grading.view.IPC_DIR`): TCP on the host's loopback is not reachable from a
  separate network namespace, and a host folder it could write to would let it fill the host's disk.
  The grader connects through ``/proc/<pid>/root``, the kernel process's view of its own file system
  (the process that holds the sockets, :func:`holds_listening_sockets`, not a short-lived child), after
  checking that each socket is a socket (not a link) and already listening, and with reconnection off;
* every socket the grader opens to the kernel caps the size of a message it accepts and how many it
  queues (:data:`SOCKET_LIMITS`): a kernel cannot make the grader buffer gigabytes;
* interrupts go over the control channel (``interrupt_mode = "message"``): a SIGINT sent to the
  process group would stop the sandbox's own process.

``sandbox = "none"`` (what ``--unsafe`` sets) starts the kernel as jupyter_client does, unsandboxed.

References
----------
jupyter_client 8 ``KernelManager`` (``format_kernel_cmd``, ``_async_post_start_kernel``, ``transport``
and ``ip`` of ``ConnectionFileMixin``, ``_create_connected_socket``); ZeroMQ ``zmq_setsockopt(3)``
(``ZMQ_MAXMSGSIZE``: a peer sending a larger message is disconnected; ``ZMQ_RCVHWM``;
``ZMQ_RECONNECT_IVL`` -1: no reconnection); ``proc(5)`` (``/proc/PID/root``, ``/proc/PID/fd``,
``/proc/net/unix``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Integer, Type, Unicode

from course_lib.grading.limits import Containment, contain, paused_processes, sandbox_processes
from course_lib.grading.sandbox import SandboxCheck, SandboxUnavailableError, find_sandbox, sandbox_command
from course_lib.grading.view import GIB, IPC_DIR, MIB, kernel_view

__all__ = ["SOCKET_LIMITS", "SandboxedKernelClient", "SandboxedKernelManager", "holds_listening_sockets"]

#: ``/proc/net/unix``'s flag of a listening socket (Linux ``include/linux/net.h``).
_SO_ACCEPTCON = 0x10000
#: Per channel: (largest message frame accepted, bytes; messages queued before more are dropped).
SOCKET_LIMITS = {
    "shell": (16 * MIB, 16),
    "iopub": (16 * MIB, 16),
    "control": (MIB, 16),
    "stdin": (MIB, 16),
    "hb": (4096, 16),
}


def _limited_socket(owner, channel: str, identity: bytes | None = None) -> zmq.Socket:
    """``ConnectionFileMixin._create_connected_socket`` with the limits of :data:`SOCKET_LIMITS`."""
    url = owner._make_url(channel)
    sock = owner.context.socket(_SOCKET_TYPES[channel])
    sock.linger = 1000
    max_bytes, queued = SOCKET_LIMITS[channel]
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sock.setsockopt(zmq.RCVHWM, queued)
    sock.setsockopt(zmq.SNDTIMEO, 1000)  # a send to a kernel that is gone fails instead of waiting forever
    if getattr(owner, "_sandboxed", False):
        sock.setsockopt(zmq.RECONNECT_IVL, -1)
    if identity:
        sock.identity = identity
    sock.connect(url)
    return sock


_SOCKET_TYPES = {
    "shell": zmq.DEALER,
    "iopub": zmq.SUB,
    "control": zmq.DEALER,
    "stdin": zmq.DEALER,
    "hb": zmq.REQ,
}


class SandboxedKernelClient(AsyncKernelClient):
    """An async kernel client whose sockets have :data:`SOCKET_LIMITS` and no heartbeat channel.

    Liveness comes from the manager (is the sandbox's process alive?), not from heartbeats.
    """

    @property
    def _sandboxed(self) -> bool:
        return bool(getattr(self.parent, "_check", None))

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> zmq.Socket:
        return _limited_socket(self, channel, identity)

    def start_channels(self, shell=True, iopub=True, stdin=True, hb=True, control=True) -> None:
        super().start_channels(shell=shell, iopub=iopub, stdin=stdin, hb=False, control=control)


def _copy_seed(src: Path, dest: Path) -> None:
    """Regular files and folders of ``src`` into ``dest`` (no notebooks, no links, nothing else)."""
    dest.mkdir(exist_ok=True)
    for entry in os.scandir(src):
        if entry.name.endswith(".ipynb") or entry.name == ".ipynb_checkpoints":
            continue
        if entry.is_dir(follow_symlinks=False):
            _copy_seed(Path(entry.path), dest / entry.name)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, dest / entry.name, follow_symlinks=False)


def holds_listening_sockets(pid: int, paths: list[str]) -> bool:
    """True when process ``pid`` holds open, for every one of ``paths``, a Unix socket *listening* there.

    How the grader finds its kernel, and when. *When*: a socket file exists from ``bind()``; ZeroMQ calls
    ``listen()`` right after, and a connection made in between is refused, and the grader's sockets to a
    sandboxed kernel never reconnect (module docstring), so it would stay dead. *Which process*: the
    grader connects through ``/proc/<pid>/root``, which is gone when ``pid`` exits; any process of the
    sandbox's namespaces sees the same files, including a short-lived child of the kernel (its own
    ``uname -p`` at start), so only a process that holds the sockets itself is taken. Both were seen as
    nbclient's "didn't respond in 60 seconds" under load.

    Read from ``/proc/<pid>/net/unix`` (a listening socket has the ``__SO_ACCEPTCON`` flag, 0x10000,
    its inode and its bound path, ``proc(5)``) and the ``socket:[inode]`` links of ``/proc/<pid>/fd``.
    False when either cannot be read (the process has gone).

    Parameters
    ----------
    pid : int
        A process of the sandbox.
    paths : list of str
        Socket paths as the kernel bound them (inside its own root).
    """
    try:
        with open(f"/proc/{pid}/net/unix") as fh:
            rows = fh.read().splitlines()[1:]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed since the listing (the listing's own one, at least)
            held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    inodes: dict[str, set[str]] = {}
    for row in rows:
        fields = row.split(maxsplit=7)
        if len(fields) == 8 and int(fields[3], 16) & _SO_ACCEPTCON:
            inodes.setdefault(fields[7], set()).add(f"socket:[{fields[6]}]")
    return all(inodes.get(path, set()) & held for path in paths)


class SandboxedKernelManager(AsyncKernelManager):
    """A jupyter_client kernel manager whose kernels run sandboxed and bounded (see the module).

    Configure it from ``nbgrader_config.py``: ``c.SandboxedKernelManager.sandbox`` is ``"auto"``
    (bubblewrap, else ``unshare``), a mechanism's name, or ``"none"``; the limits below are its
    other options.

    Raises
    ------
    SandboxUnavailableError
        At kernel start, when ``sandbox`` is not ``none`` and no mechanism it allows works here.
    TimeoutError
        When the sandboxed kernel's sockets are not all listening within ``startup_timeout_s``.
    """

    sandbox = Unicode("auto", help="auto | bwrap | unshare | none (none runs student code unsandboxed)").tag(
        config=True
    )
    containment = Unicode("auto", help="auto | cgroup2 | cgroup1 | watchdog (limits.contain)").tag(
        config=True
    )
    memory_limit_bytes = Integer(4 * GIB, help="RLIMIT_AS of each process, bytes (0: none)").tag(config=True)
    sandbox_memory_bytes = Integer(3 * GIB, help="memory of the whole sandbox, bytes").tag(config=True)
    max_processes = Integer(64, help="processes (and, under cgroups, threads) of the sandbox").tag(
        config=True
    )
    cpu_limit_s = Integer(900, help="RLIMIT_CPU of each process, CPU seconds").tag(config=True)
    file_size_limit_bytes = Integer(256 * MIB, help="RLIMIT_FSIZE, bytes per file").tag(config=True)
    tmp_size_bytes = Integer(256 * MIB, help="size of the in-memory /tmp, bytes").tag(config=True)
    shm_size_bytes = Integer(64 * MIB, help="size of the in-memory /dev/shm, bytes").tag(config=True)
    cwd_size_bytes = Integer(256 * MIB, help="size of the in-memory notebook folder, bytes").tag(config=True)
    startup_timeout_s = Integer(60, help="seconds for the sandboxed kernel's sockets to listen").tag(
        config=True
    )

    client_class = DottedObjectName("course_lib.grading.manager.SandboxedKernelClient")
    client_factory = Type(default_value=SandboxedKernelClient, klass=AsyncKernelClient)

    _scratch: str | None = None
    _check: SandboxCheck | None = None
    _containment: Containment | None = None
    _sandboxed = False

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> zmq.Socket:
        return _limited_socket(self, channel, identity)

    async def _async_interrupt_kernel(self) -> None:  # type: ignore[override]
        try:
            await super()._async_interrupt_kernel()
        except zmq.Again:  # the control channel is gone with the kernel
            self.log.warning("the interrupt could not be sent: the kernel's control channel is closed")

    interrupt_kernel = _async_interrupt_kernel  # type: ignore[assignment]

    async def _async_request_shutdown(self, restart: bool = False) -> None:  # type: ignore[override]
        try:
            await super()._async_request_shutdown(restart=restart)
        except zmq.Again:
            self.log.warning("the shutdown request could not be sent: the kernel's control channel is closed")

    request_shutdown = _async_request_shutdown  # type: ignore[assignment]

    def events(self) -> list[str]:
        """Limits the sandbox hit so far (memory, processes), for the report."""
        return self._containment.events() if self._containment is not None else []

    @property
    def containment_kind(self) -> str:
        """What bounds the whole sandbox (:data:`course_lib.grading.limits.CONTAINMENTS`), or ``"none"``."""
        return self._containment.kind if self._containment is not None else "none"

    def peak_memory_bytes(self) -> int:
        """The most memory the sandbox held so far, bytes (0 when unknown or unsandboxed)."""
        return self._containment.peak_memory_bytes() if self._containment is not None else 0

    async def _async_pre_start_kernel(self, **kw):  # type: ignore[override]
        if self.sandbox != "none":
            check = find_sandbox(self.sandbox)
            if check.mechanism is None:
                raise SandboxUnavailableError(
                    f"refusing to run student code without a sandbox: {check.reason}. "
                    "Pass --unsafe to `python -m course_lib.grading autograde` to grade anyway."
                )
            self._check, self._sandboxed = check, True
            cwd = str(Path(kw.get("cwd") or os.getcwd()).resolve())
            kw["cwd"] = cwd
            self._scratch = tempfile.mkdtemp(prefix="grading-")
            try:
                _copy_seed(Path(cwd), Path(self._scratch, "seed"))
            except BaseException:  # a seed that cannot be copied: no scratch folder is left behind
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
                raise
            Path(self._scratch, "conn").mkdir()
            self.transport = "ipc"
            self.ip = f"{IPC_DIR}/kernel"
            self.connection_file = str(Path(self._scratch, "conn", "kernel.json"))
            if self.kernel_spec is not None:
                self.kernel_spec.interrupt_mode = "message"
            in_memory = ("/tmp", "/dev/shm", cwd, IPC_DIR)
            self._containment = contain(
                self.sandbox_memory_bytes,
                self.max_processes,
                prefer=self.containment,
                in_memory_dirs=in_memory,
            )
        return await super()._async_pre_start_kernel(**kw)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self._scratch is None or self._check is None or self._containment is None:
            return cmd
        # jupyter_client annotates _launch_args with traitlets.Any (a trait type) where it means typing.Any
        launch: dict[str, Any] | None = self._launch_args
        assert launch is not None  # _async_pre_start_kernel sets it before it formats the command
        view = kernel_view(
            cmd,
            cwd=str(launch.get("cwd") or os.getcwd()),
            seed_dir=str(Path(self._scratch, "seed")),
            connection_dir=str(Path(self._scratch, "conn")),
            env=launch.get("env") or dict(os.environ),
            memory_limit_bytes=self.memory_limit_bytes,
            cpu_limit_s=self.cpu_limit_s,
            file_size_limit_bytes=self.file_size_limit_bytes,
            max_processes=self.max_processes if self._containment.kind == "watchdog" else 0,
            tmp_size_bytes=self.tmp_size_bytes,
            shm_size_bytes=self.shm_size_bytes,
            cwd_size_bytes=self.cwd_size_bytes,
        )
        mechanism, executable = str(self._check.mechanism), str(self._check.executable)
        return self._containment.wrap(sandbox_command(mechanism, executable, view, scratch=self._scratch))

    async def _async_post_start_kernel(self, **kw) -> None:  # type: ignore[override]
        if self._containment is not None and self.provisioner is not None:
            top = self.provisioner.process.pid  # type: ignore[attr-defined]
            try:
                root = await self._wait_for_sockets(top)
            except BaseException:  # a kernel that never listened is not left running, nor its scratch
                self.kill_sandbox()
                raise
            self.ip = f"{root}{IPC_DIR}/kernel"
            self._containment.started(top, inner_root=root)
        await super()._async_post_start_kernel(**kw)

    async def _wait_for_sockets(self, top: int) -> str:
        """``/proc/<pid>/root`` of the kernel once its sockets listen (checked to be sockets).

        The kernel is the first process of the sandbox (ancestors come before their children), in a
        mount namespace other than the grader's, that holds its listening sockets
        (:func:`holds_listening_sockets`): not a child it started, which may exit at any time.
        """
        own_ns = os.readlink("/proc/self/ns/mnt")
        names = [f"{IPC_DIR}/kernel-{port}" for port in self.ports]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout_s
        while loop.time() < deadline:
            if not await self.is_alive():
                raise RuntimeError("the sandboxed kernel exited while starting (see the log above)")
            for pid in sandbox_processes(top):
                try:
                    if os.readlink(f"/proc/{pid}/ns/mnt") == own_ns:
                        continue
                except OSError:
                    continue
                root = f"/proc/{pid}/root"
                if all(self._is_socket(f"{root}{name}") for name in names) and holds_listening_sockets(
                    pid, names
                ):
                    return root
            await asyncio.sleep(0.05)
        raise TimeoutError(
            f"the sandboxed kernel's sockets were not all listening within {self.startup_timeout_s} s"
        )

    @staticmethod
    def _is_socket(path: str) -> bool:
        try:
            return stat.S_ISSOCK(os.lstat(path).st_mode)
        except OSError:
            return False

    @contextlib.contextmanager
    def paused(self) -> Iterator[list[int]]:
        """The kernel and every process it started, stopped for the block (``limits.paused_processes``)."""
        process = getattr(self.provisioner, "process", None) if self.provisioner is not None else None
        top = self._containment._top_pid if self._containment is not None else None
        top = top or getattr(process, "pid", None)
        if top is None:
            yield []
            return
        with paused_processes(top) as stopped:
            yield stopped

    def kill_sandbox(self) -> None:
        """Kill the sandbox and remove its cgroups and scratch folder, without the event loop."""
        process = getattr(self.provisioner, "process", None) if self.provisioner is not None else None
        if process is not None:  # a LocalProvisioner's Popen
            with contextlib.suppress(OSError):
                process.kill()
        if self._containment is not None:
            self._containment.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:  # type: ignore[override]
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            if self._containment is not None:
                self._containment.close()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None

    cleanup_resources = _async_cleanup_resources  # type: ignore[assignment]
