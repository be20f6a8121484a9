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
* ``http="httptools"``, ``loop="uvloop"``: uvicorn's C parser and event loop;
* ``workers=None``: one worker process per usable core (``os.sched_getaffinity``), all accepting
  from one listening socket.

``/predict`` always goes through a dynamic batcher (``max_batch_size``, ``max_queue_delay_ms``), as in
Lesson 3, so one server can be measured with and without batching.

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
from course_lib.core.checks import integer, number, one_of

if TYPE_CHECKING:
    from course_lib.serving.batching.predict import Runtime

RUNTIMES: tuple[str, ...] = ("onnxruntime", "xgboost")
FORWARD_MODES: tuple[str, ...] = ("auto", "loop", "thread", "batcher")
ENCODERS: tuple[str, ...] = ("orjson", "json")
HTTP_PARSERS: tuple[str, ...] = ("httptools", "h11")
LOOPS: tuple[str, ...] = ("uvloop", "asyncio")
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
    forward : {"auto", "loop", "thread", "batcher"}
        Where ``/score``'s model call runs.
    encoder : {"orjson", "json"}
    http : {"httptools", "h11"}
    loop : {"uvloop", "asyncio"}
    workers : int >= 1 or None
        Worker processes; None = ``usable_cores()`` of the machine that starts the server.
    max_batch_size : int >= 1
        ``/predict``'s batcher (and ``/score``'s with ``forward="batcher"``).
    max_queue_delay_ms : float >= 0
    max_queue_size : int >= 1
        The batcher's bounded queue (503 + ``Retry-After`` when full).

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For a value outside the allowed ones (a ``ValueError`` and ``TypeError``).
    """

    runtime: Runtime = "onnxruntime"
    forward: str = "auto"
    encoder: str = "orjson"
    http: str = "httptools"
    loop: str = "uvloop"
    workers: int | None = None
    max_batch_size: int = 64
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 2048

    def __post_init__(self) -> None:
        one_of("runtime", self.runtime, RUNTIMES)
        one_of("forward", self.forward, FORWARD_MODES)
        one_of("encoder", self.encoder, ENCODERS)
        one_of("http", self.http, HTTP_PARSERS)
        one_of("loop", self.loop, LOOPS)
        if self.workers is not None:
            integer("workers", self.workers, min=1)
        integer("max_batch_size", self.max_batch_size, min=1)
        number("max_queue_delay_ms", self.max_queue_delay_ms, min=0.0)
        integer("max_queue_size", self.max_queue_size, min=1)

    @property
    def n_workers(self) -> int:
        """``workers``, or the usable cores of this machine when it is None."""
        return usable_cores() if self.workers is None else int(self.workers)

    def replace(self, **changes: Any) -> ProductionConfig:
        """A copy with some levers changed (unknown names raise ``TypeError``)."""
        return dataclasses.replace(self, **changes)

    def to_argv(self) -> list[str]:
        """Command-line flags of ``python -m course_lib.serving.production`` for this configuration."""
        argv = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                argv.append(f"--{f.name.replace('_', '-')}={value}")
        return argv

    def describe(self) -> str:
        """One line naming every lever, e.g. ``onnxruntime, forward auto, orjson, httptools + uvloop, 2 workers``."""
        return (
            f"{self.runtime}, forward {self.forward}, {self.encoder}, {self.http} + {self.loop}, "
            f"{self.n_workers} worker{'s' if self.n_workers != 1 else ''}"
        )


#: The production choice: every default above.
PRODUCTION = ProductionConfig()
