"""The course's vocabulary: the one list of each set of names that several layers use.

A runtime, an HTTP parser, an event loop, an answer encoder, an outcome or a latency bucket is named in
configs, command-line options, records, metrics and lessons. Each set is listed here once, in one order
(the first name is the default where a default is meant), and every module imports it from here:

* :data:`SERVING_RUNTIMES`: what scores a request (native XGBoost, or ONNX Runtime on the exported
  graph); :data:`BATCH_RUNTIMES` adds Treelite's compiled trees, which only the batch job uses;
* :data:`HTTP_PARSERS` and :data:`EVENT_LOOPS`: uvicorn's ``--http`` and ``--loop`` choices that the
  course's servers offer;
* :data:`ANSWER_ENCODERS`: how an answer becomes bytes (the standard library's ``json`` or ``orjson``);
* :data:`SERVER_OUTCOMES`: what became of a request at the server's door, as the server counts it;
  :data:`CLIENT_OUTCOMES`: what a load generator's client saw, as the client counts it (the two are
  different questions: a request the server dropped as abandoned is a timeout at the client);
* :data:`LATENCY_BUCKETS_S`: the upper bounds of every request-latency histogram a course server
  exports (Prometheus ``le`` labels), fine below a millisecond, where the production service's answers
  are, and up to the seconds a shed or timed-out request takes.

References
----------
uvicorn documentation, "Settings" (``--http {auto,h11,httptools}``, ``--loop {auto,asyncio,uvloop}``);
Prometheus documentation, "Histograms and summaries" (choose buckets around the values you care about).
"""

from __future__ import annotations

__all__ = [
    "ANSWER_ENCODERS",
    "BATCH_RUNTIMES",
    "CLIENT_OUTCOMES",
    "EVENT_LOOPS",
    "HTTP_PARSERS",
    "LATENCY_BUCKETS_S",
    "SERVER_OUTCOMES",
    "SERVING_RUNTIMES",
]

#: What scores a request: native XGBoost (the model as trained) or ONNX Runtime on the exported graph.
SERVING_RUNTIMES: tuple[str, ...] = ("xgboost", "onnxruntime")
#: What scores a batch job's chunk: the serving runtimes and Treelite's compiled trees (Lesson 11).
BATCH_RUNTIMES: tuple[str, ...] = (*SERVING_RUNTIMES, "treelite")
#: uvicorn's HTTP/1.1 parsers: the pure-Python h11 and the C httptools (llhttp).
HTTP_PARSERS: tuple[str, ...] = ("h11", "httptools")
#: uvicorn's event loops: the standard library's asyncio loop and uvloop (libuv).
EVENT_LOOPS: tuple[str, ...] = ("asyncio", "uvloop")
#: How an answer's dict becomes bytes: ``json.dumps(...).encode()`` or ``orjson.dumps(...)``.
ANSWER_ENCODERS: tuple[str, ...] = ("json", "orjson")
#: What became of a request at the server's door (``DoorCounters``, the ``/metrics`` outcome label).
SERVER_OUTCOMES: tuple[str, ...] = ("ok", "shed", "expired", "client_errors", "server_errors", "abandoned")
#: What a load generator's client saw for a request it sent (``LoadResult``'s outcome column).
CLIENT_OUTCOMES: tuple[str, ...] = ("ok", "shed", "timeout", "error")
#: Upper bounds (seconds) of every request-latency histogram a course server exports; ``+Inf`` is implied.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
