"""The stage timer's core: run a request's stages in order and time each one with ``perf_counter_ns``.

A request is a chain of stages (parse, lookup, forward, format), each taking the previous stage's
output. The core reads the clock before and after every stage and keeps the differences, in order.
:meth:`course_lib.serving.service.ChurnService.handle_async` is this core plus what a server needs
(an awaitable forward stage, errors turned into 4xx answers with the stages timed so far, the
``Server-Timing`` header), using :class:`course_lib.serving.profiling.RequestProfile` to hold the times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

__all__ = ["time_stages"]


def time_stages(
    stages: Mapping[str, Callable[[object], object]], request: object
) -> tuple[object, dict[str, int]]:
    """Run ``stages`` in order on ``request`` and return the answer and each stage's duration.

    Parameters
    ----------
    stages : mapping of str -> callable
        Stage name -> function; each receives the previous stage's output (the first one gets
        ``request``). Run in the mapping's order.
    request : object
        The input of the first stage (e.g. the request body, bytes).

    Returns
    -------
    answer : object
        The last stage's output.
    durations_ns : dict of str -> int
        Stage name -> wall time in nanoseconds (``time.perf_counter_ns`` differences), in the order
        the stages ran. Their sum is the end-to-end time of the stages.

    References
    ----------
    MLOps course lesson 19, "Inference Engineering Basics" (source 000): time every stage of a
    request before optimising any of them.
    Python documentation, ``time.perf_counter_ns``: a monotonic clock in integer nanoseconds.

    Examples
    --------
    >>> answer, durations_ns = time_stages({"parse": int, "double": lambda x: 2 * x}, "21")
    >>> answer, list(durations_ns)
    (42, ['parse', 'double'])
    """
    durations_ns: dict[str, int] = {}
    value = request
    for name, stage in stages.items():
        start_ns = time.perf_counter_ns()
        value = stage(value)
        durations_ns[name] = time.perf_counter_ns() - start_ns
    return value, durations_ns
