"""Limits on a whole sandbox: memory and processes for all its processes together.

Per-process limits (``RLIMIT_AS``...) do not bound a submission that forks: three children of 2 GiB
each take 6 GiB. :func:`contain` picks the first way of bounding the whole sandbox that works here:

1. **cgroup v2**: a child cgroup with ``memory.max`` (memory of every process of the sandbox, its
   in-memory files included) and ``pids.max``, created where this process may create one with the
   ``memory`` and ``pids`` controllers enabled (as root, or in a systemd-delegated subtree);
2. **cgroup v1**: the same with ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``) and
   ``pids.max`` in the v1 ``memory`` and ``pids`` hierarchies (root on a hybrid system);
3. **watchdog**: a thread of the grader that adds up every sandbox process's proportional memory
   (PSS, so pages a fork shares count once) and the sandbox's in-memory file systems every
   :data:`WATCHDOG_INTERVAL_S` (0.05 s) and kills the whole sandbox past the limit or past the process
   count (so a sandbox can overshoot by what its processes allocate in that time);
   each process also gets ``RLIMIT_AS`` and ``RLIMIT_NPROC`` (:mod:`course_lib.grading.view`), which
   bound how far it can go between two looks. Linux does not apply ``RLIMIT_NPROC`` to processes of
   root, so as root the watchdog's count is the process limit.

The kernel of the cgroup kills a process of the sandbox when the sandbox is over its memory; the
watchdog kills all of them. Either way the grader sees a dead kernel, scores 0 what needed it and
goes on. :meth:`Containment.events` says what was hit, for the report.

References
----------
Linux ``Documentation/admin-guide/cgroup-v2.rst`` (``memory.max``, ``memory.events``, ``pids.max``,
``cgroup.kill``, delegation), ``cgroup-v1/memory.rst`` (``memory.limit_in_bytes``, ``memory.oom_control``),
``proc(5)`` (``/proc/PID/smaps_rollup``: ``Pss``), ``setrlimit(2)`` (``RLIMIT_NPROC``: not enforced
for processes with ``CAP_SYS_ADMIN`` or ``CAP_SYS_RESOURCE``, nor for root's processes).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.core.checks import integer, one_of

__all__ = ["CONTAINMENTS", "Containment", "contain", "paused_processes", "sandbox_processes"]

#: Ways to bound a sandbox, in the order ``auto`` tries them.
CONTAINMENTS = ("cgroup2", "cgroup1", "watchdog")
WATCHDOG_INTERVAL_S = 0.05
_JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 121; shift; done; shift; exec "$@"'


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    return found


def sandbox_processes(top_pid: int) -> list[int]:
    """``top_pid`` and every process below it (the whole sandbox, as the host sees it)."""
    seen, todo = [], [top_pid]
    while todo:
        pid = todo.pop()
        if pid in seen or not os.path.exists(f"/proc/{pid}"):
            continue
        seen.append(pid)
        todo += _children(pid)
    return seen


@contextlib.contextmanager
def paused_processes(top_pid: int) -> Iterator[list[int]]:
    """Stop ``top_pid`` and every process below it (``SIGSTOP``) for the block, then continue them.

    A process forked while the tree is being stopped is found by looking again, until a look finds
    none new. Used while the grader times the baseline (:func:`course_lib.grading.reference.speedup`),
    so that nothing a submission started (a CPU burner between its own calls) runs then.

    Yields
    ------
    list of int
        The processes stopped (empty if ``top_pid`` is gone).
    """
    stopped: list[int] = []
    try:
        for _ in range(100):
            new = [pid for pid in sandbox_processes(top_pid) if pid not in stopped]
            if not new:
                break
            for pid in new:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
            stopped += new
        deadline = time.monotonic() + 1.0  # a signal takes effect when its process is next scheduled
        while time.monotonic() < deadline and not all(map(_is_stopped, stopped)):
            time.sleep(0.0005)
        yield stopped
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


def _is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T``/``t`` in ``/proc/<pid>/stat``) or gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t", "Z", "X")
    except (OSError, IndexError):
        return True


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _used_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@dataclass
class Containment:
    """How one sandbox is bounded: ``kind`` is one of :data:`CONTAINMENTS`.

    Use: :meth:`wrap` the sandbox's command line, :meth:`started` with its process id once it runs,
    :meth:`events` for what was hit, :meth:`close` when the kernel is gone (kills what is left).
    """

    kind: str
    memory_bytes: int
    max_processes: int
    cgroup_dirs: tuple[Path, ...] = ()
    memory_dir: Path | None = None
    pids_dir: Path | None = None
    in_memory_dirs: tuple[str, ...] = ()
    _top_pid: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _watchdog: threading.Thread | None = None
    _events: list[str] = field(default_factory=list)
    _peak_bytes: int = 0

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` started inside the cgroup (a shell joins it, then execs the command)."""
        if not self.cgroup_dirs:
            return list(command)
        procs = [str(d / "cgroup.procs") for d in self.cgroup_dirs]
        return ["/bin/sh", "-c", _JOIN_SCRIPT, "grading-cgroup", *procs, "--", *command]

    def started(self, top_pid: int, *, inner_root: str | None = None) -> None:
        """The sandbox runs as ``top_pid``; the watchdog (if this is one) starts watching it."""
        self._top_pid = top_pid
        if self.kind == "watchdog" and self._watchdog is None:
            roots = [f"{inner_root}{d}" for d in self.in_memory_dirs] if inner_root else []
            self._watchdog = threading.Thread(target=self._watch, args=(top_pid, roots), daemon=True)
            self._watchdog.start()

    def _watch(self, top_pid: int, roots: list[str]) -> None:
        while not self._stop.wait(WATCHDOG_INTERVAL_S):
            pids = sandbox_processes(top_pid)
            if not pids:
                return
            used = sum(_pss_bytes(pid) for pid in pids) + sum(_used_bytes(r) for r in roots)
            self._peak_bytes = max(self._peak_bytes, used)
            if used > self.memory_bytes or len(pids) > self.max_processes + 2:  # + sandbox's own init
                what = "memory" if used > self.memory_bytes else "process"
                self._events.append(f"{what} limit reached: the watchdog killed the sandbox")
                self._kill(pids)
                return

    @staticmethod
    def _kill(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def events(self) -> list[str]:
        """What the sandbox hit so far (``"memory limit reached (1 process killed)"``...)."""
        found = list(self._events)
        if self.memory_dir is not None:
            for name in ("memory.events", "memory.oom_control"):
                counts = _counts(self.memory_dir / name)
                if counts.get("oom_kill"):
                    found.append(f"memory limit reached ({counts['oom_kill']} process(es) killed)")
                    break
        if self.pids_dir is not None and _counts(self.pids_dir / "pids.events").get("max"):
            found.append("process limit reached (a fork was refused)")
        return found

    def peak_memory_bytes(self) -> int:
        """Peak memory of the sandbox so far, bytes, as its cgroup or the watchdog saw it (0: unknown)."""
        if self.memory_dir is not None:
            for name in ("memory.peak", "memory.max_usage_in_bytes"):
                text = _read(self.memory_dir / name).strip()
                if text.isdigit():
                    return int(text)
        return self._peak_bytes

    def close(self) -> None:
        """Kill whatever of the sandbox is still running and remove its cgroups."""
        self._stop.set()
        if self._top_pid is not None:
            self._kill(sandbox_processes(self._top_pid)[::-1])
        for folder in self.cgroup_dirs:
            kill = folder / "cgroup.kill"
            if kill.exists():
                _write(kill, "1")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                pids = [int(p) for p in _read(folder / "cgroup.procs").split()]
                if not pids:
                    break
                self._kill(pids)
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                folder.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError:
        return False


def _counts(path: Path) -> dict[str, int]:
    counts = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


def _cgroup_mounts() -> dict[str, Path]:
    """Mount point of each cgroup hierarchy: ``"unified"`` for v2, else the v1 controller names."""
    mounts: dict[str, Path] = {}
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            mounts.setdefault("unified", Path(fields[4]))
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                mounts.setdefault(option, Path(fields[4]))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path in each hierarchy (``"unified"`` for v2)."""
    own = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            own["unified"] = path
        for name in controllers.split(","):
            own[name] = path
    return own


#: An empty ``grading-*`` cgroup older than this is a leftover of a grader that was killed: removed.
STALE_CGROUP_S = 600.0


def _sweep(parent: Path) -> None:
    """Remove empty ``grading-*`` cgroups under ``parent`` older than :data:`STALE_CGROUP_S`."""
    now = time.time()
    for folder in parent.glob("grading-*"):
        try:
            if now - folder.stat().st_mtime > STALE_CGROUP_S:
                folder.rmdir()  # fails (harmlessly) if a process is still in it
        except OSError:
            pass


def _make(parent: Path, settings: dict[str, str]) -> Path | None:
    """A new cgroup under ``parent`` with ``settings`` written (required first), else None."""
    _sweep(parent)
    folder = parent / f"grading-{secrets.token_hex(6)}"
    try:
        folder.mkdir()
    except OSError:
        return None
    for name, value in settings.items():
        optional = name.startswith("?")
        if not _write(folder / name.lstrip("?"), value) and not optional:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return None
    return folder


def _cgroup2(memory_bytes: int, max_processes: int) -> Containment | None:
    mounts, own = _cgroup_mounts(), _own_cgroups()
    if "unified" not in mounts or "unified" not in own:
        return None
    root = mounts["unified"]
    mine = root / own["unified"].lstrip("/")
    for parent in (mine.parent, root):
        enabled = _read(parent / "cgroup.subtree_control").split()
        if not {"memory", "pids"} <= set(enabled):
            continue
        folder = _make(
            parent, {"memory.max": str(memory_bytes), "pids.max": str(max_processes), "?memory.swap.max": "0"}
        )
        if folder is not None:
            return Containment("cgroup2", memory_bytes, max_processes, (folder,), folder, folder)
    return None


def _cgroup1(memory_bytes: int, max_processes: int) -> Containment | None:
    mounts, own = _cgroup_mounts(), _own_cgroups()
    if not {"memory", "pids"} <= mounts.keys() or not {"memory", "pids"} <= own.keys():
        return None
    memory = _make(
        mounts["memory"] / own["memory"].lstrip("/"),
        {"memory.limit_in_bytes": str(memory_bytes), "?memory.memsw.limit_in_bytes": str(memory_bytes)},
    )
    if memory is None:
        return None
    pids = _make(mounts["pids"] / own["pids"].lstrip("/"), {"pids.max": str(max_processes)})
    if pids is None:
        memory.rmdir()
        return None
    return Containment("cgroup1", memory_bytes, max_processes, (memory, pids), memory, pids)


def contain(
    memory_bytes: int, max_processes: int, *, prefer: str = "auto", in_memory_dirs: tuple[str, ...] = ()
) -> Containment:
    """Bound one sandbox to ``memory_bytes`` and ``max_processes``, the first way that works here.

    Parameters
    ----------
    memory_bytes : int > 0
        Memory of all the sandbox's processes and in-memory files together, bytes.
    max_processes : int > 0
        Processes (and threads, under cgroups) the sandbox may have at once.
    prefer : {"auto", "cgroup2", "cgroup1", "watchdog"}
        ``auto`` tries :data:`CONTAINMENTS` in order; a name tries that one, then the watchdog.
    in_memory_dirs : tuple of str
        The sandbox's in-memory file systems (paths inside it), which the watchdog adds up.

    Returns
    -------
    Containment

    Raises
    ------
    ValueError
        For a limit below 1 or an unknown ``prefer``.
    """
    memory_bytes = integer("memory_bytes", memory_bytes, min=1)
    max_processes = integer("max_processes", max_processes, min=1)
    prefer = one_of("prefer", prefer, ("auto", *CONTAINMENTS))
    makers = {"cgroup2": _cgroup2, "cgroup1": _cgroup1}
    for kind in CONTAINMENTS[:2] if prefer == "auto" else (prefer,):
        found = makers[kind](memory_bytes, max_processes) if kind in makers else None
        if found is not None:
            return found
    return Containment("watchdog", memory_bytes, max_processes, in_memory_dirs=in_memory_dirs)
