"""Load-generator processes: several generator processes, apart from the server, and their own limit.

A load generator is a program like any other: on a busy machine it falls behind its schedule, and
then the "latency" it reports is its own lateness. Two tools here keep it honest, and a third measures
how far it can be trusted:

* every process sends with ``course_lib.measure.targets.wire_target`` (the wire client of
  ``course_lib.measure.targets.wire_client``: httptools' C parser on asyncio protocols, a keep-alive
  connection pool warmed before the run, each request timed on the wire as k6 times it) under uvloop:
  several times cheaper per request than httpx, about a third of aiohttp's CPU per request
  (``benchmarks/client_cpu.py``);
* ``run_generators``: the same offered load split over ``n_processes`` generator processes (independent
  Poisson streams at rate / n add up to a Poisson stream at the full rate), started at one common
  instant, their per-request rows merged into one ``LoadResult`` (exact samples, never averaged
  percentiles), each process separate from the server under test;
* ``generator_limit``: the same generators against a null HTTP server (``serve_null``, an answer of two
  bytes and no work, on the course's server runtime with its C parser and loop), climbing rates until
  the send lag's p99 exceeds its bound, each try holding the 1,000 requests a p99 needs, so every load
  test can print the highest rate its own generator keeps up with.

Modules: ``_pool`` (``GeneratorPool``, ``merge_results``, ``run_generators``) and ``_null`` (``serve_null``,
``generator_limit``, ``generator_limit_text``); ``python -m course_lib.measure.generators --port P`` serves the
null server.

Every generator process exits within a fraction of a second of the process that started the pool
(``course_lib.core.process.exit_with_parent``), even if that one is killed.

References
----------
Gil Tene, "How NOT to measure latency" (coordinated omission, generator lag).
httptools and uvloop documentation; k6 documentation, "Built-in metrics" (``http_req_duration``).
Python ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn`` start method.
"""

from __future__ import annotations

from course_lib.measure.generators._null import NULL_SERVER, generator_limit, generator_limit_text, serve_null
from course_lib.measure.generators._pool import GeneratorPool, merge_results, run_generators

__all__ = [
    "NULL_SERVER",
    "GeneratorPool",
    "generator_limit",
    "generator_limit_text",
    "merge_results",
    "run_generators",
    "serve_null",
]
