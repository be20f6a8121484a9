"""The production configuration: every lever the course measured, as one frozen record.

Each field is a lever a lesson measured; the defaults are the production choice and where it came from:

* ``runtime="onnxruntime"``: the fastest runtime Lesson 1 and Lesson 4 measured for one customer (a
  prepared ONNX Runtime session, one intra-op thread), tens of microseconds against milliseconds for
  the native scikit-learn + XGBoost pipeline (Lesson 2's forward stage);
* ``forward="auto"``: the model call stays on the event loop only if it costs at most
  ``OFF_LOOP_ABOVE_MS`` (measured at start-up, median of ``FORWARD_PROBE_CALLS`` calls); a costlier
  call runs in a worker thread, so it cannot block the loop that parses every other request
  (Lessons 3 and 6). ``"loop"``, ``"thread"`` and ``"batcher"`` force one way;
* ``lookup="cached"``: the indexed SQLite lookup behind the in-process TTL cache (Lessons 2 and 8);
* ``encoder="orjson"``: the answer built as a dict and encoded once (the standard ``json`` module is
  the other choice);
* ``workers=None``: one worker process per usable core (``os.sched_getaffinity``), all accepting
  from one listening socket;
* ``server=PRODUCTION_SERVER``: the runtime's :class:`~course_lib.serving.server.ServerConfig` (every
  HTTP limit and the batcher knobs, each default stated there once) with uvicorn's C parser and
  event loop, ``http="httptools"`` and ``loop="uvloop"`` (Lesson 6), instead of the prototype's
  h11 + asyncio.

``/predict`` always goes through a dynamic batcher (``server.max_batch_size``,
``server.max_queue_delay_ms``, ``server.max_queue_size``), as in Lesson 3, so one server can be
measured with and without batching.

References
----------
uvicorn documentation, "Settings" (``--http``, ``--loop``, ``--workers``). ONNX Runtime documentation,
"Thread management". orjson README. NVIDIA Triton documentation, "Dynamic Batcher".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from course_lib.core.bench import usable_cores
from course_lib.core.checks import instance_of, integer, one_of
from course_lib.core.vocabulary import ANSWER_ENCODERS, SERVING_RUNTIMES
from course_lib.serving.server import DEFAULTS, ServerConfig, to_argv

if TYPE_CHECKING:
    from course_lib.serving.batching.predict import Runtime

FORWARD_MODES: tuple[str, ...] = ("auto", "loop", "thread", "batcher")
#: The runtime's limits and batcher knobs of the production service: ``DEFAULTS`` with uvicorn's C
#: parser and event loop (Lesson 6's levers).
PRODUCTION_SERVER = DEFAULTS.replace(http="httptools", loop="uvloop")
#: ``forward="auto"`` keeps a model call on the event loop only up to this median cost (ms): a quarter
#: of a millisecond of blocking per request is small next to the HTTP work every request costs
#: (Lesson 6 measures the framework's floor); the native pipeline's call costs tens of times more.
OFF_LOOP_ABOVE_MS = 0.25
#: Calls timed at start-up to decide ``forward="auto"`` (after as many warm-up calls).
FORWARD_PROBE_CALLS = 50


@dataclass(frozen=True)
class ProductionConfig:
    """One configuration of the churn service (see the module docstring for each default's source).

    Parameters
    ----------
    runtime : {"onnxruntime", "xgboost"}
        One of ``course_lib.core.vocabulary.SERVING_RUNTIMES``.
    forward : {"auto", "loop", "thread", "batcher"}
        Where ``/score``'s model call runs.
    encoder : {"orjson", "json"}
        One of ``course_lib.core.vocabulary.ANSWER_ENCODERS``.
    workers : int >= 1 or None
        Worker processes; None = ``usable_cores()`` of the machine that starts the server.
    server : course_lib.serving.server.ServerConfig
        Every worker's runtime: ``http`` and ``loop`` (uvicorn's parser and event loop), the batcher
        of ``/predict`` (and of ``/score`` with ``forward="batcher"``: ``max_batch_size``,
        ``max_queue_delay_ms``, ``max_queue_size``, a bounded queue answering 503 +
        ``Retry-After`` when full), timeouts, limits and lifetime. Default ``PRODUCTION_SERVER``.

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For a value outside the allowed ones (a ``ValueError`` and ``TypeError``), or a ``server``
        that is not a ``ServerConfig``.
    """

    runtime: Runtime = "onnxruntime"
    forward: str = "auto"
    encoder: str = "orjson"
    workers: int | None = None
    server: ServerConfig = PRODUCTION_SERVER

    def __post_init__(self) -> None:
        one_of("runtime", self.runtime, SERVING_RUNTIMES)
        one_of("forward", self.forward, FORWARD_MODES)
        one_of("encoder", self.encoder, ANSWER_ENCODERS)
        if self.workers is not None:
            integer("workers", self.workers, min=1)
        instance_of("server", self.server, ServerConfig)

    @property
    def n_workers(self) -> int:
        """``workers``, or the usable cores of this machine when it is None."""
        return usable_cores() if self.workers is None else int(self.workers)

    def replace(self, **changes: Any) -> ProductionConfig:
        """A copy with some levers changed (unknown names raise ``TypeError``)."""
        return dataclasses.replace(self, **changes)

    def with_server(self, **changes: Any) -> ProductionConfig:
        """A copy whose ``server`` has some fields changed, e.g. ``with_server(http="h11", lifetime_s=60)``.

        Raises
        ------
        TypeError
            For a name that is not a ``ServerConfig`` field.
        """
        return dataclasses.replace(self, server=self.server.replace(**changes))

    def to_argv(self) -> list[str]:
        """Command-line flags of ``python -m course_lib.serving.production`` for this configuration.

        One flag per lever (``--runtime=...``; none for ``workers=None``), then one per ``server`` field
        (``course_lib.serving.server.to_argv``); ``parse_arguments`` turns them back into this config.
        """
        levers = [f for f in dataclasses.fields(self) if f.name != "server"]
        argv = [f"--{f.name}={getattr(self, f.name)}" for f in levers if getattr(self, f.name) is not None]
        return [*argv, *to_argv(self.server)]

    def describe(self) -> str:
        """One line naming every lever, e.g. ``onnxruntime, forward auto, orjson, httptools + uvloop, 2 workers``."""
        parser_and_loop = f"{self.server.http} + {self.server.loop}"
        return (
            f"{self.runtime}, forward {self.forward}, {self.encoder}, {parser_and_loop}, "
            f"{self.n_workers} worker{'s' if self.n_workers != 1 else ''}"
        )


#: The production choice: every default above.
PRODUCTION = ProductionConfig()
