"""Giving a server and its load tools their own CPU cores on one machine.

A load test on one machine shares its cores between the server under test and the tools that drive
it (the course's generator processes, k6). Each side then waits for the other's work: the server's
capacity falls, and every tool's latency holds its own scheduling delay, which at sub-millisecond
latencies is a large part of what it measures. The usual advice is to run the load generator on
another machine (k6 documentation, "Running large tests"); on one machine the nearest thing is to
give each side its own cores. :func:`split_cores` divides the cores this process may use between
the two, and :func:`pinned` runs a block with the calling thread on a set of cores, so that every
process started inside it inherits that set (Linux ``sched_setaffinity(2)``: "A child created via fork(2)
inherits its parent's CPU affinity mask. The affinity mask is preserved across an execve(2).").

References
----------
Linux man-pages, ``sched_setaffinity(2)``. Python documentation, ``os.sched_setaffinity``. k6
documentation, "Running large tests" (load generator and system under test on separate machines).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from course_lib.core.checks import InvalidArgumentError, integer, integers

#: ``--pin-server-cores``'s help in the benchmarks that run a server and its load tools side by side.
PIN_HELP = (
    "give the servers the first N usable cores and the load tools (generator processes, k6, this "
    "script's main thread) the rest, each side on its own cores (0, the default: no pinning)"
)


def _affinity_supported() -> bool:
    return hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


@dataclass(frozen=True)
class CoreSplit:
    """Disjoint sets of CPU core ids: ``server`` for the server under test, ``tools`` for the load tools."""

    server: tuple[int, ...]
    tools: tuple[int, ...]

    def __post_init__(self) -> None:
        """Checks: each side is a non-empty list of distinct core ids >= 0, and no core is on both sides.

        Raises ``InvalidArgumentError`` (a ``ValueError``) naming the side and the value.
        """
        server = tuple(integers("server", self.server, min=0))
        tools = tuple(integers("tools", self.tools, min=0))
        for name, side in (("server", server), ("tools", tools)):
            if len(set(side)) != len(side):
                raise InvalidArgumentError(f"{name}={list(side)} names a core twice: give each core once")
        shared = sorted(set(server) & set(tools))
        if shared:
            raise InvalidArgumentError(
                f"server={list(server)} and tools={list(tools)} share core(s) {shared}: "
                "each core goes to one side"
            )
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "tools", tools)

    def describe(self) -> dict[str, list[int]]:
        """``{"server_cores": [...], "tool_cores": [...]}``, as a record stores it."""
        return {"server_cores": list(self.server), "tool_cores": list(self.tools)}

    @classmethod
    def from_record(cls, fields: dict[str, list[int]]) -> CoreSplit:
        """The split :meth:`describe` wrote (``KeyError`` if a field is missing)."""
        return cls(server=tuple(fields["server_cores"]), tools=tuple(fields["tool_cores"]))

    def text(self) -> str:
        """One line for a report, e.g. ``server on cores 0-1, load tools on cores 2-3``."""
        return f"server on cores {_ranges(self.server)}, load tools on cores {_ranges(self.tools)}"


def _ranges(cores: Iterable[int]) -> str:
    ids = sorted(cores)
    parts: list[str] = []
    start = prev = ids[0]
    for core in [*ids[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def split_cores(server_cores: int, cores: Iterable[int] | None = None) -> CoreSplit:
    """The first ``server_cores`` of ``cores`` (sorted) for the server, the rest for the load tools.

    Parameters
    ----------
    server_cores : int >= 1
        How many cores the server gets; at least one must be left for the tools.
    cores : the core ids to divide; default the cores this process may run on (``os.sched_getaffinity``).

    Returns
    -------
    CoreSplit

    Raises
    ------
    ValueError
        If ``server_cores`` is below 1 or leaves no core for the tools (the message names the cores).
    NotImplementedError
        Where the operating system does not let a process choose its cores (macOS, Windows).
    """
    n = integer("server_cores", server_cores, min=1)
    if cores is None:
        if not _affinity_supported():
            raise NotImplementedError("this operating system does not let a process choose its CPU cores")
        cores = os.sched_getaffinity(0)
    ids = tuple(sorted(set(integers("cores", cores, min=0, allow_empty=True))))
    if len(ids) < 2:
        raise ValueError(
            f"server_cores={n}: pinning needs at least 2 usable cores (one for the server, one for the load "
            f"tools), and this process may use {len(ids)}: {list(ids)}"
        )
    if n >= len(ids):
        raise ValueError(
            f"server_cores={n} leaves no core for the load tools: this process may use {len(ids)} "
            f"cores {list(ids)}; allowed 1 to {len(ids) - 1}"
        )
    return CoreSplit(server=ids[:n], tools=ids[n:])


def sides(pin: CoreSplit | None) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """``(server cores, tool cores)`` of ``pin``, or ``(None, None)`` (what :func:`pinned` leaves alone)."""
    return (None, None) if pin is None else (pin.server, pin.tools)


def pin_option(text: str) -> CoreSplit | None:
    """``argparse`` type of ``--pin-server-cores N``: :func:`split_cores` of ``N``, or None for 0 (no pins).

    Raises
    ------
    argparse.ArgumentTypeError
        If ``text`` is not a whole number, or :func:`split_cores` refuses it (the message says why).
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of cores") from None
    if n == 0:
        return None
    try:
        return split_cores(n)
    except (ValueError, NotImplementedError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@contextmanager
def pinned(cores: Iterable[int] | None) -> Iterator[None]:
    """Run the block with this process (its calling thread) on ``cores``; restore the old set after.

    Processes started inside the block inherit ``cores``, and keep them after it ends. ``None`` changes
    nothing (so callers can pass an optional split through).

    Only the calling thread moves: threads this process started before the block (a BLAS pool, say)
    keep their cores; threads and processes started inside inherit ``cores``.

    Raises
    ------
    ValueError
        If ``cores`` is empty, holds something other than core ids >= 0, or a core this process may not
        use now (the message names the cores it may use; a block inside a pinned block can only narrow).
    NotImplementedError
        Where the operating system does not let a process choose its cores.
    """
    if cores is None:
        yield
        return
    wanted = set(integers("cores", cores, min=0, allow_empty=True))
    if not wanted:
        raise ValueError(
            "cores=[] is empty: give at least one core id, or None to leave the cores as they are"
        )
    if not _affinity_supported():
        raise NotImplementedError("this operating system does not let a process choose its CPU cores")
    before = os.sched_getaffinity(0)
    if not wanted <= before:
        raise ValueError(
            f"cores={sorted(wanted)}: this process may use only cores {sorted(before)}, "
            f"not {sorted(wanted - before)}"
        )
    os.sched_setaffinity(0, wanted)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pinned_text(fields: object) -> str:
    """``", pinned: <split>"`` for a record's ``pinned`` field (:meth:`CoreSplit.describe`), ``""`` for None.

    A field that is not such a split (a record edited by hand) is quoted as it is, rather than raising.
    """
    if not fields:
        return ""
    try:
        return f", pinned: {CoreSplit.from_record(fields).text()}"  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return f", pinned: {fields!r} (not a core split)"
