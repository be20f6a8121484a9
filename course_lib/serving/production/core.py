"""The production service, small: one FastAPI app, one ONNX Runtime session, one encode, N worker processes.

:func:`create_core_app` is the whole idea of Lesson 12's server in a few lines, built from the pieces
the course already has: ``churn_service("onnxruntime", ...)`` loads the model and its ONNX Runtime session
once, when the app is built (not per request); ``ChurnService.handle_async`` validates the request
(strict JSON, the request schema), looks the customer up, checks the features, calls the session once
and encodes the answer once (``encode_answer``, orjson); ``answer_request`` turns any failure into a
4xx/5xx that says why. :func:`main` serves it with ``serve_app`` in one process; started with
``course_lib.serving.server.run_processes({"core": core_command()}, workers=N)`` (the one way course
servers start), N processes share one listening socket, each with its own copy of the app.

What the production app (``create_production_app``) adds over this core is listed in
:mod:`course_lib.serving.production._app`; on the same requests both answer the same scores and the
same refusals (``tests/test_production_core.py``).

References
----------
FastAPI documentation, "First Steps"; ONNX Runtime documentation, "InferenceSession" (create once, run
many); uvicorn documentation, "Deployment" (worker processes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import Response

from course_lib.serving.production._config import PRODUCTION
from course_lib.serving.server import add_arguments, from_arguments, port_number, serve_app
from course_lib.serving.service import AppCounters, ChurnService, answer_request, churn_service

__all__ = ["core_command", "core_service", "create_core_app", "main"]


def core_service() -> ChurnService:
    """The core's service: ONNX Runtime (one session, loaded here), cached lookup, orjson, as ``PRODUCTION``."""
    return churn_service("onnxruntime", lookup_mode="cached", encoder=PRODUCTION.encoder)


def create_core_app(service: ChurnService) -> FastAPI:
    """``POST /score`` and ``GET /healthz`` over ``service``, with nothing else.

    Parameters
    ----------
    service : ChurnService
        Built once, before the app (e.g. :func:`core_service`): its model session serves every request.

    Returns
    -------
    fastapi.FastAPI
        ``POST /score`` with ``{"customer_id": "SC-..."}`` answers 200 ``{"customer_id",
        "churn_probability", "model_version", "runtime", "lookup"}``, or the 4xx of the stage that
        refused (400 bad JSON, 404 unknown customer, 413 too large, 415 not JSON, 422 wrong schema).
    """
    app = FastAPI(title="churn scoring (core)", docs_url=None, redoc_url=None, openapi_url=None)
    counters = AppCounters()

    async def score_body(body: bytes) -> Response:
        out = await service.handle_async(body)  # validate, look up, one model call, one encode
        return Response(out.body, status_code=out.status_code, headers=out.headers)

    @app.post("/score")
    async def score(request: Request) -> Response:
        return await answer_request(request, score_body, counters, cancellable=False)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "model_version": service.model_version}

    return app


def core_command() -> list[str]:
    """The argv (without ``--port``) that serves the core app: ``python -m course_lib.serving.production.core``."""
    return [sys.executable, "-m", "course_lib.serving.production.core"]


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the core app on 127.0.0.1 ``--port`` (and the ``ServerConfig`` flags) in this process."""
    parser = argparse.ArgumentParser(description="The core churn app on 127.0.0.1")
    parser.add_argument("--port", type=port_number, required=True)
    add_arguments(parser, PRODUCTION.server)
    args = parser.parse_args(argv)
    app = create_core_app(core_service())  # the model and its session load once, before the first request
    serve_app(app, port=args.port, config=from_arguments(args))


if __name__ == "__main__":
    main()
