"""The production churn service: every lever the course measured, in one server (Lesson 12).

* ``_config``: ``ProductionConfig`` (runtime, where the model call runs, encoder, workers, and the
  ``ServerConfig`` every worker runs with: HTTP parser and loop, batcher knobs, limits) and
  ``PRODUCTION``, the production choice;
* ``_service``: ``ProductionService`` (Lesson 2's stages, the answer encoded once) and ``build_service``;
* ``_app``: ``create_production_app`` (``/score``, ``/predict``, ``/null``, ``/healthz``, ``/stats``,
  ``/metrics``; injectable middleware);
* ``_workers``: ``python -m course_lib.serving.production``: one worker process per usable core on one
  listening socket;
* ``_serve``: ``serve_production`` starts it from Python and yields its URL.
* ``core`` (public): ``create_core_app``, the same service small (one app, one ONNX Runtime session, one
  encode, N workers through ``run_processes``), the core the production app hardens.

The prototype it replaces is ``course_lib.serving.prototype.serve_churn`` (native model on the event
loop, pure-Python parser and loop, one process); ``course_lib.measure.waterfall`` measures one lever at
a time from one to the other.
"""

from __future__ import annotations

from course_lib.serving.production._app import NULL_ANSWER, READY_DIR_ENV, create_production_app
from course_lib.serving.production._config import (
    FORWARD_MODES,
    FORWARD_PROBE_CALLS,
    OFF_LOOP_ABOVE_MS,
    PRODUCTION,
    PRODUCTION_SERVER,
    ProductionConfig,
)
from course_lib.serving.production._serve import ProductionServer, production_command, serve_production
from course_lib.serving.production._service import ProductionService, build_service, forward_cost_ms

__all__ = [
    "FORWARD_MODES",
    "FORWARD_PROBE_CALLS",
    "NULL_ANSWER",
    "OFF_LOOP_ABOVE_MS",
    "PRODUCTION",
    "PRODUCTION_SERVER",
    "READY_DIR_ENV",
    "ProductionConfig",
    "ProductionServer",
    "ProductionService",
    "build_service",
    "create_production_app",
    "forward_cost_ms",
    "production_command",
    "serve_production",
]
