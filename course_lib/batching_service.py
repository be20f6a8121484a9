"""The churn model behind ``POST /predict`` with dynamic batching: FastAPI + uvicorn on 127.0.0.1.

Each request body carries one customer's 19 features (validated by pydantic; a bad body gets a 422
that names the field). The handler hands the features to a ``course_lib.batcher.DynamicBatcher``,
whose model call scores the whole batch with native XGBoost (the scikit-learn pipeline) or ONNX
Runtime, and answers with the churn probability plus how the request was served: its queue wait,
the model call's duration, the batch size, and whether it was de-duplicated. A full queue answers
503 with ``Retry-After``; the server keeps serving.

Run it with ``python -m course_lib.batching_service --runtime xgboost --port 8000`` or, from code
and lessons, with the ``run_server`` context manager, which starts it in a subprocess with a bounded
lifetime and stops it on exit.

References
----------
FastAPI documentation, "Lifespan Events" and "Handling Errors"; uvicorn documentation, "Settings".
Source lesson 004 ("Serving Models at Scale"): FastAPI batching server and request de-duplication.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field, create_model

from course_lib.batcher import BatcherClosedError, BatchScoringError, DynamicBatcher, QueueFullError
from course_lib.data import BINARY_COLUMNS, CATEGORICAL_LEVELS, FEATURE_COLUMNS, NUMERIC_COLUMNS

__all__ = [
    "RUNTIMES",
    "CustomerFeatures",
    "PredictResponse",
    "create_batching_app",
    "customer_key",
    "make_record_scorer",
    "run_server",
    "to_payload",
]

RUNTIMES: tuple[str, ...] = ("xgboost", "onnxruntime")
Runtime = Literal["xgboost", "onnxruntime"]


def _feature_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in FEATURE_COLUMNS:
        if name in CATEGORICAL_LEVELS:
            fields[name] = (Literal[CATEGORICAL_LEVELS[name]], ...)
        elif name in BINARY_COLUMNS:
            fields[name] = (Annotated[int, Field(ge=0, le=1, strict=True)], ...)
        elif name == "tenure":
            fields[name] = (Annotated[int, Field(ge=0, le=1200)], ...)
        else:  # charges in US dollars; null = unknown (new customers have no total yet)
            fields[name] = (Annotated[float, Field(ge=0, allow_inf_nan=False)] | None, ...)
    return fields


#: The request body: one customer's 19 model features, unknown fields rejected.
CustomerFeatures = create_model(
    "CustomerFeatures",
    __config__=ConfigDict(extra="forbid"),
    __doc__="One customer's 19 churn-model features (course_lib.data.FEATURE_COLUMNS).",
    **_feature_fields(),
)


class PredictResponse(BaseModel):
    """The answer: a churn probability and how the batcher served this request."""

    churn_probability: float
    runtime: str
    model_version: str
    queue_wait_ms: float
    service_ms: float
    batch_size: int
    batch_requests: int
    deduplicated: bool
    trigger: str


def to_payload(features: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of a features DataFrame as JSON-ready request bodies (NaN -> None, numpy -> Python types).

    Parameters
    ----------
    features : DataFrame with the 19 ``FEATURE_COLUMNS`` (e.g. ``course_lib.model.features(df)``).

    Returns
    -------
    list of dict, one per row, key order ``FEATURE_COLUMNS``.

    Raises
    ------
    ValueError
        If a feature column is missing.
    """
    missing = [c for c in FEATURE_COLUMNS if c not in features.columns]
    if missing:
        raise ValueError(f"features is missing columns {missing}")
    out = []
    for row in features[list(FEATURE_COLUMNS)].astype(object).itertuples(index=False, name=None):
        record = {}
        for name, value in zip(FEATURE_COLUMNS, row, strict=True):
            if isinstance(value, float) and math.isnan(value):
                value = None
            elif isinstance(value, np.integer):
                value = int(value)
            elif isinstance(value, np.floating):
                value = None if np.isnan(value) else float(value)
            record[name] = value
        out.append(record)
    return out


def customer_key(record: Mapping[str, Any]) -> Hashable:
    """De-duplication key: the 19 feature values in column order (two equal keys, one model row)."""
    return tuple(record[name] for name in FEATURE_COLUMNS)


def make_record_scorer(
    runtime: Runtime, *, pipeline: Any = None, onnx_scorer: Any = None
) -> Callable[[Sequence[Mapping[str, Any]]], np.ndarray]:
    """A batch score function over request records (dicts of the 19 features) for one runtime.

    Parameters
    ----------
    runtime : {"xgboost", "onnxruntime"}
        ``xgboost``: build a DataFrame from the records and call the scikit-learn pipeline's
        ``predict_proba`` (one-hot encoding + native XGBoost). ``onnxruntime``: build feeds with
        ``OnnxChurnScorer.feeds_from_records`` and run the session.
    pipeline : fitted sklearn Pipeline, required for ``xgboost``.
    onnx_scorer : course_lib.export.OnnxChurnScorer, required for ``onnxruntime``.

    Returns
    -------
    callable records -> float array of churn probabilities, shape (len(records),)

    Raises
    ------
    ValueError
        Unknown runtime, or the model object it needs is missing.
    """
    if runtime == "xgboost":
        if pipeline is None:
            raise ValueError("runtime 'xgboost' needs pipeline= (e.g. ChurnModel.pipeline)")
        columns = list(FEATURE_COLUMNS)

        def score_native(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
            frame = pd.DataFrame.from_records(list(records), columns=columns)
            for name in NUMERIC_COLUMNS:
                frame[name] = pd.to_numeric(frame[name], errors="raise").astype(float)
            return pipeline.predict_proba(frame)[:, 1]

        return score_native
    if runtime == "onnxruntime":
        if onnx_scorer is None:
            raise ValueError("runtime 'onnxruntime' needs onnx_scorer= (an OnnxChurnScorer)")

        def score_onnx(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
            return onnx_scorer.run(onnx_scorer.feeds_from_records(list(records)))

        return score_onnx
    raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")


def create_batching_app(
    runtime: Runtime = "xgboost",
    *,
    churn_model: Any = None,
    onnx_scorer: Any = None,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_size: int = 2048,
    dedup: bool = True,
    instances: int = 1,
    run_in_thread: bool = True,
) -> FastAPI:
    """A FastAPI app whose ``POST /predict`` goes through a dynamic batcher.

    Parameters
    ----------
    runtime : {"xgboost", "onnxruntime"}
    churn_model : course_lib.model.ChurnModel, optional
        Defaults to ``load_or_train_churn_model()``; the ONNX session is built from it when needed.
    onnx_scorer : OnnxChurnScorer, optional
        Reused if given (runtime ``onnxruntime``).
    max_batch_size, max_queue_delay_ms, preferred_batch_sizes, max_queue_size, instances
        The batcher's knobs (``course_lib.batcher.DynamicBatcher``). ``max_batch_size=1`` turns
        batching off: one model call per request, through the same queue.
    dedup : bool
        Score identical queued customers once.
    run_in_thread : bool
        Run the model call in a worker thread (default) or on the event loop; see
        ``course_lib.batcher`` for the trade-off.

    Returns
    -------
    FastAPI app with ``POST /predict`` (body: ``CustomerFeatures``; answer: ``PredictResponse``;
    422 for a bad body, 503 + ``Retry-After`` when the queue is full or the server is stopping, 500
    if the model call failed), ``GET /healthz`` (runtime, model version, knobs) and ``GET /stats``
    (the batcher's counters).

    Raises
    ------
    ValueError
        Unknown runtime or a batcher knob out of range (raised here, before serving starts).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if churn_model is None:
        from course_lib.model import load_or_train_churn_model

        churn_model = load_or_train_churn_model()
    if runtime == "onnxruntime" and onnx_scorer is None:
        from course_lib.export import OnnxChurnScorer, make_session, pipeline_to_onnx

        onnx_scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(churn_model.pipeline)))
    score = make_record_scorer(runtime, pipeline=churn_model.pipeline, onnx_scorer=onnx_scorer)
    batcher: DynamicBatcher = DynamicBatcher(
        score,
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        preferred_batch_sizes=preferred_batch_sizes,
        max_queue_size=max_queue_size,
        dedup_key=customer_key if dedup else None,
        instances=instances,
        run_in_thread=run_in_thread,
    )
    knobs = {
        "max_batch_size": batcher.max_batch_size,
        "max_queue_delay_ms": batcher.max_queue_delay_ms,
        "preferred_batch_sizes": list(batcher.preferred_batch_sizes),
        "max_queue_size": batcher.max_queue_size,
        "dedup": dedup,
        "instances": batcher.instances,
        "run_in_thread": batcher.run_in_thread,
    }
    model_version = str(churn_model.model_version)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop(drain=False)

    app = FastAPI(title="Churn scoring with dynamic batching", lifespan=lifespan)
    app.state.batcher = batcher

    @app.post("/predict", response_model=PredictResponse)
    async def predict(customer: CustomerFeatures) -> dict[str, Any]:  # type: ignore[valid-type]
        try:
            result = await batcher.submit(customer.model_dump())
        except QueueFullError as exc:
            raise HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": "1"}) from None
        except BatcherClosedError as exc:
            raise HTTPException(status_code=503, detail=str(exc)) from None
        except BatchScoringError as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from None
        return {
            "churn_probability": float(result.value),
            "runtime": runtime,
            "model_version": model_version,
            "queue_wait_ms": result.queue_wait_ms,
            "service_ms": result.service_ms,
            "batch_size": result.batch_size,
            "batch_requests": result.batch_requests,
            "deduplicated": result.deduplicated,
            "trigger": result.trigger,
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "runtime": runtime, "model_version": model_version, **knobs}

    @app.get("/stats")
    async def stats() -> dict[str, int]:
        return batcher.stats.as_dict()

    return app


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def run_server(
    runtime: Runtime = "xgboost",
    *,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    max_queue_size: int = 2048,
    dedup: bool = True,
    run_in_thread: bool = True,
    lifetime_s: float = 300.0,
    startup_timeout_s: float = 60.0,
) -> Iterator[str]:
    """Start the batching server in a subprocess on 127.0.0.1 and yield its base URL.

    The keyword arguments are those of ``create_batching_app``.

    The server exits by itself after ``lifetime_s`` seconds even if this process dies, and is
    stopped (SIGTERM, then SIGKILL after 10 s) when the ``with`` block ends.

    Raises
    ------
    RuntimeError
        If the server exits or does not answer ``/healthz`` within ``startup_timeout_s``; the message
        holds the end of its stderr.
    """
    import httpx

    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "course_lib.batching_service",
        f"--runtime={runtime}",
        f"--port={port}",
        f"--max-batch-size={max_batch_size}",
        f"--max-queue-delay-ms={max_queue_delay_ms}",
        f"--max-queue-size={max_queue_size}",
        f"--lifetime-s={lifetime_s}",
    ]
    cmd += [] if dedup else ["--no-dedup"]
    cmd += [] if run_in_thread else ["--model-on-event-loop"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(base_url + "/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer /healthz within {startup_timeout_s:g} s")
            time.sleep(0.1)
        yield base_url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve the batching app with uvicorn on 127.0.0.1 for a bounded time."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=RUNTIMES, default="xgboost")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--max-queue-size", type=int, default=2048)
    parser.add_argument("--no-dedup", action="store_true")
    parser.add_argument("--model-on-event-loop", action="store_true", help="no worker thread for the model")
    parser.add_argument("--lifetime-s", type=float, default=3600.0, help="exit by itself after this long")
    args = parser.parse_args(argv)
    app = create_batching_app(
        args.runtime,
        max_batch_size=args.max_batch_size,
        max_queue_delay_ms=args.max_queue_delay_ms,
        max_queue_size=args.max_queue_size,
        dedup=not args.no_dedup,
        run_in_thread=not args.model_on_event_loop,
    )
    watchdog = threading.Timer(args.lifetime_s, lambda: os.kill(os.getpid(), signal.SIGTERM))
    watchdog.daemon = True
    watchdog.start()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        http="h11",
        loop="asyncio",
    )


if __name__ == "__main__":
    main()
