"""The null server, and the load generator's own limit measured against it.

A load generator that falls behind its schedule reports its own lateness as the server's latency. So
before any load test the course measures how fast its generators (``GeneratorPool``) can send on
time, against a server that does no work at all:

* ``serve_null``: a null HTTP server (an answer of two bytes, ``{}``, and no work) in a subprocess, on
  the course's server runtime with its C parser and loop (``NULL_SERVER``);
* ``generator_limit``: the generators climb rates against it until the send lag's p99 exceeds its
  bound (``course_lib.measure.loadgen.SEND_LAG_BOUND_MS``), each try holding enough requests to judge
  that p99 (``MIN_REQUESTS_P99``, the 10 / (1 - q) rule); ``generator_limit_text`` words the answer.

References
----------
Gil Tene, "How NOT to measure latency" (coordinated omission, generator lag).
The 10 / (1 - q) rule: ``course_lib.core.percentiles.samples_needed``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import pandas as pd

from course_lib.core.checks import (
    InvalidArgumentError,
    callable_,
    distinct,
    instance_of,
    integer,
    non_empty,
    number,
    positive_number,
)
from course_lib.measure.generators._pool import GeneratorPool
from course_lib.measure.loadgen import MIN_REQUESTS_P99, SEND_LAG_BOUND_MS, rung_duration_s
from course_lib.serving.server import (
    DEFAULTS,
    add_arguments,
    from_arguments,
    port_number,
    run_processes,
    serve_app,
    to_argv,
)

_NULL_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]
#: Offered rates above this are refused: far beyond what a generator process on one machine sends (req/s).
MAX_RATE_RPS = 1_000_000.0
#: The null server: the C parser and loop, and a door wide enough never to refuse a generator's load.
NULL_SERVER = DEFAULTS.replace(http="httptools", loop="uvloop", max_in_flight=100_000, max_connections=4096)


async def _null_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI app answering every HTTP request with 200 ``{}`` and doing nothing else."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _NULL_HEADERS})
    await send({"type": "http.response.body", "body": b"{}"})


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m course_lib.measure.generators --port P [ServerConfig flags]``: the null server."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.measure.generators",
        description="Null HTTP server on 127.0.0.1 (200 {} to everything); its defaults are NULL_SERVER's",
    )
    parser.add_argument("--port", type=port_number, required=True)
    add_arguments(parser)
    parser.set_defaults(**{f.name: getattr(NULL_SERVER, f.name) for f in fields(NULL_SERVER)})
    args = parser.parse_args(argv)
    serve_app(_null_app, port=args.port, config=from_arguments(args))


@contextmanager
def serve_null(*, lifetime_s: float = 120.0) -> Iterator[str]:
    """A null HTTP server in a subprocess on 127.0.0.1 (answers 200 ``{}`` at once); yields its URL.

    It runs on the course's server runtime (``NULL_SERVER``: httptools + uvloop, every guard and
    limit of the other servers) and exits when the ``with`` block ends, after ``lifetime_s`` seconds,
    or when this process dies.

    Raises
    ------
    RuntimeError
        If it is not ready within 20 s (with the end of its log).
    """
    config = NULL_SERVER.replace(lifetime_s=lifetime_s)
    command = [sys.executable, "-m", "course_lib.measure.generators", *to_argv(config)]
    with run_processes({"null": command}, startup_timeout_s=20.0) as urls:
        yield urls["null"]


def _ladder_rates(rates_rps: Sequence[float]) -> list[float]:
    """``rates_rps`` checked (a list, tuple or range of distinct rates in (0, ``MAX_RATE_RPS``]), sorted."""
    listed: list[object] = list(
        non_empty("rates_rps", instance_of("rates_rps", rates_rps, (list, tuple, range)))
    )
    return distinct("rates_rps", sorted(
        number(f"rates_rps[{i}]", r, min=0, min_open=True, max=MAX_RATE_RPS, unit="req/s") for i, r in enumerate(listed)
    ))  # fmt: skip


def generator_limit(
    pool: GeneratorPool,
    null_url: str,
    rates_rps: Sequence[float],
    *,
    duration_s: float = 1.0,
    min_requests: int = MIN_REQUESTS_P99,
    lag_bound_ms: float = SEND_LAG_BOUND_MS,
    retries: int = 1,
    max_try_s: float = 60.0,
    on_run: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[float, pd.DataFrame]:
    """Climb ``rates_rps`` against the null server until the generator's send-lag p99 exceeds the bound.

    A rate that misses is tried again (``retries`` times, next seed): one descheduling of a process on
    a busy laptop should not end the climb, but a rate that misses every try does. Each try lasts
    ``rung_duration_s(rate, min_requests=min_requests, min_duration_s=duration_s)``: with fewer than
    1,000 requests a p99 is the maximum or near it, and one hiccup fails the try.

    Parameters
    ----------
    rates_rps : list, tuple or range of distinct offered rates (req/s) in (0, 1,000,000], at least one; climbed from
        the lowest.
    duration_s : float > 0, the shortest try (s).
    min_requests : int >= 1, the requests a try holds at least (1,000 judge a p99: 10 / (1 - 0.99)).
    lag_bound_ms : float > 0, the send-lag p99 bound (ms).
    retries : int >= 0, more tries of a rate that missed.
    max_try_s : float > 0, the longest try allowed (s): the arguments are refused, before anything is
        sent, when the lowest rate's try would last longer (60 s: 1,000 requests at 17 req/s).
    on_run : callable, optional, called with each try's row as it ends.

    Returns
    -------
    (limit_rps, table)
        ``limit_rps``: the highest offered rate with a try whose send-lag p99 was within
        ``lag_bound_ms`` and whose every request succeeded, every lower rate having had one too (0.0 if
        none). ``table``: one ``LoadResult.summary()`` row per try (``attempt`` 1, 2, ...), stopping at
        the first rate whose every try missed.

    Raises
    ------
    InvalidArgumentError (a ValueError)
        For any argument outside what is allowed above, before anything is sent.
    """
    rates = _ladder_rates(rates_rps)
    retries = integer("retries", retries, min=0)
    min_requests = integer("min_requests", min_requests, min=1)
    duration_s = positive_number("duration_s", duration_s, unit="s")
    lag_bound_ms = positive_number("lag_bound_ms", lag_bound_ms, unit="ms")
    max_try_s = positive_number("max_try_s", max_try_s, unit="s")
    if on_run is not None:
        callable_("on_run", on_run)
    longest_s = rung_duration_s(rates[0], min_requests=min_requests, min_duration_s=duration_s)
    if longest_s > max_try_s:
        raise InvalidArgumentError(
            f"a try at {rates[0]:g} req/s (the lowest of rates_rps) with min_requests={min_requests} and "
            f"duration_s={duration_s:g} would last {longest_s:,.0f} s, over max_try_s={max_try_s:g}: start at a "
            "higher rate, or ask for fewer requests or a shorter duration_s"
        )
    rows = []
    limit = 0.0
    for rate in rates:
        for attempt in range(1, retries + 2):
            seed = int(rate) + 7919 * (attempt - 1)
            seconds = rung_duration_s(rate, min_requests=min_requests, min_duration_s=duration_s)
            result = pool.run(null_url, [{}], rate_rps=rate, duration_s=seconds, seed=seed)
            row = {"attempt": attempt, **result.summary(lag_bound_ms=lag_bound_ms)}
            rows.append(row)
            if on_run is not None:
                on_run(row)
            if row["generator_ok"] and row["errors"] == 0:
                limit = rate
                break
        else:
            break
    return limit, pd.DataFrame(rows)


def generator_limit_text(limit_rps: float, lowest_rps: float, highest_rps: float | None = None) -> str:
    """``generator_limit``'s answer in words: the rate, or that no rate tried met the bound.

    Parameters
    ----------
    limit_rps : float >= 0
        The limit :func:`generator_limit` returned (0.0 when even its lowest rate missed).
    lowest_rps : float > 0
        The lowest rate that climb tried.
    highest_rps : float > 0, optional
        The highest rate it tried: a limit that reaches it is a lower bound, and the text says so.

    Raises
    ------
    InvalidArgumentError
        For a negative limit, a lowest or highest rate that is not a finite number > 0, a highest rate below the
        lowest, or a limit that no climb over them returns (> 0 but below the lowest, or above the highest).

    Examples
    --------
    >>> generator_limit_text(2000.0, 250.0)
    '2,000 req/s'
    >>> generator_limit_text(4000.0, 250.0, 4000.0)
    '4,000 req/s (the highest rate tried: at least that)'
    >>> generator_limit_text(0.0, 250.0)
    'not measured: no rate tried met the bound (the lowest was 250 req/s)'
    """
    limit_rps = positive_number("limit_rps", limit_rps, allow_zero=True)
    lowest_rps = positive_number("lowest_rps", lowest_rps)
    highest = math.inf if highest_rps is None else number("highest_rps", highest_rps, min=lowest_rps)
    if 0 < limit_rps < lowest_rps or limit_rps > highest:
        raise InvalidArgumentError(
            f"limit_rps must be 0 or a rate tried, in [{lowest_rps:g}, {highest:g}] req/s, got {limit_rps:g}"
        )
    top = limit_rps == highest
    if limit_rps > 0:
        return f"{limit_rps:,.0f} req/s" + (" (the highest rate tried: at least that)" if top else "")
    return f"not measured: no rate tried met the bound (the lowest was {lowest_rps:,.0f} req/s)"
