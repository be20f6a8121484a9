"""Dynamic batching in the Lesson 2 churn server: ``POST /predict`` through a ``DynamicBatcher``.

``create_batched_app`` takes the Lesson 2 app (``course_lib.service.create_app``: ``POST /score`` one
model call per request, ``GET /healthz``) and adds ``POST /predict``. Its request body is the same
(``{"customer_id": "SC-0000042"}``) and it runs the same stages (parse, feature lookup, forward,
format, each timed into ``Server-Timing``), except that the forward stage submits the customer's
features to a dynamic batcher, which scores many concurrent requests in one model call. The answer
is the Lesson 2 answer plus how the request was served: ``queue_wait_ms``, ``service_ms`` (the
model call for the whole batch), ``batch_size``, ``batch_requests``, ``deduplicated`` and ``trigger``.
A full queue answers 503 with ``Retry-After``; the server keeps serving.

``run_server`` (one) and ``run_servers`` (several, started together) run such servers in
subprocesses on 127.0.0.1 with a bounded lifetime, so a load generator in the calling process does not
share their GIL; ``python -m course_lib.batching_service`` does the same from a shell.

References
----------
NVIDIA Triton Inference Server documentation, "Dynamic Batcher". FastAPI documentation, "Lifespan
Events". Source lesson 004 ("Serving Models at Scale"): a FastAPI batching server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import Response

from course_lib.batcher import (
    BatchedResult,
    BatcherClosedError,
    BatchScoringError,
    DynamicBatcher,
    QueueFullError,
)
from course_lib.data import FEATURE_COLUMNS
from course_lib.feature_store import (
    DEFAULT_N_CUSTOMERS,
    DEFAULT_SEED,
    FeatureStore,
    build_feature_store,
    make_lookup,
)
from course_lib.service import (
    ChurnService,
    RequestError,
    create_app,
    native_forward,
    onnx_forward,
    read_json_body,
)

__all__ = [
    "RUNTIMES",
    "churn_service",
    "create_batched_app",
    "customer_key",
    "run_server",
    "run_servers",
]

#: The two model runtimes: the native scikit-learn + XGBoost pipeline, and ONNX Runtime.
RUNTIMES: tuple[str, ...] = ("xgboost", "onnxruntime")
Runtime = Literal["xgboost", "onnxruntime"]


def customer_key(record: Mapping[str, Any]) -> Hashable:
    """De-duplication key: the 19 feature values in column order (equal keys share one model row)."""
    return tuple(record[name] for name in FEATURE_COLUMNS)


def churn_service(
    runtime: Runtime = "xgboost",
    *,
    lookup_mode: str = "cached",
    n_customers: int = DEFAULT_N_CUSTOMERS,
    seed: int = DEFAULT_SEED,
    store_folder: str | Path | None = None,
    churn_model: Any = None,
    onnx_scorer: Any = None,
) -> ChurnService:
    """The Lesson 2 ``ChurnService`` for one runtime, over the (built-or-reused) feature store.

    Parameters
    ----------
    runtime : {"xgboost", "onnxruntime"}
        Model-forward stage: ``course_lib.service.native_forward`` or ``onnx_forward``.
    lookup_mode : {"indexed", "unindexed", "cached"}
        Feature lookup (``course_lib.feature_store.make_lookup``).
    n_customers, seed, store_folder
        Population of the feature store (``FeatureStore.open``; built on first use).
    churn_model : course_lib.model.ChurnModel, optional
        Default ``load_or_train_churn_model()``.
    onnx_scorer : OnnxChurnScorer, optional
        Reused for ``onnxruntime`` if given, else built from ``churn_model``.

    Raises
    ------
    ValueError
        Unknown runtime or lookup mode.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if churn_model is None:
        from course_lib.model import load_or_train_churn_model

        churn_model = load_or_train_churn_model()
    if runtime == "xgboost":
        forward = native_forward(churn_model.pipeline)
    else:
        if onnx_scorer is None:
            from course_lib.export import OnnxChurnScorer, make_session, pipeline_to_onnx

            onnx_scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(churn_model.pipeline)))
        forward = onnx_forward(onnx_scorer)
    store = FeatureStore.open(n_customers, seed, folder=store_folder)
    return ChurnService(
        make_lookup(store, lookup_mode),
        forward,
        model_version=str(churn_model.model_version),
        lookup_mode=lookup_mode,
        runtime=runtime,
    )


def _refuse(err: RequestError, headers: Mapping[str, str] | None = None) -> Response:
    return Response(err.body(), status_code=err.status_code, media_type="application/json", headers=headers)


def create_batched_app(
    service: ChurnService,
    *,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_size: int = 2048,
    dedup: bool = True,
    instances: int = 1,
    run_in_thread: bool = True,
) -> FastAPI:
    """The Lesson 2 app plus ``POST /predict``, whose model-forward stage goes through a dynamic batcher.

    Parameters
    ----------
    service : course_lib.service.ChurnService
        Its ``forward`` (records -> probabilities) is the batcher's batch score function.
    max_batch_size, max_queue_delay_ms, preferred_batch_sizes, max_queue_size, instances, run_in_thread
        Knobs of ``course_lib.batcher.DynamicBatcher``. ``max_batch_size=1`` turns batching off: one
        model call per request, through the same queue and thread.
    dedup : bool
        Score identical customers waiting in the queue together once.

    Returns
    -------
    FastAPI app with the Lesson 2 routes (``POST /score``, ``GET /healthz``) and
    ``POST /predict``: 200 with the Lesson 2 answer plus ``queue_wait_ms``, ``service_ms``,
    ``batch_size``, ``batch_requests``, ``deduplicated``, ``trigger``; the Lesson 2 4xx for a bad
    body or unknown customer (400, 404, 413, 415, 422); 503 + ``Retry-After: 1`` when the queue is
    full or the server is stopping; 500 naming the error if the model call failed.
    ``GET /batcher`` reports the knobs and the batcher's counters.

    Raises
    ------
    ValueError
        A batcher knob out of range (raised here, before serving starts).
    """
    batcher: DynamicBatcher = DynamicBatcher(
        service.forward,
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
    app = create_app(service)
    app.state.batcher = batcher
    inner_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: FastAPI):
        async with inner_lifespan(app_) as state:
            await batcher.start()
            try:
                yield state
            finally:
                await batcher.stop(drain=False)

    app.router.lifespan_context = lifespan

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        try:
            body = await read_json_body(request)
        except RequestError as err:
            return _refuse(err, {"connection": "close"})
        served: list[BatchedResult] = []

        async def batched_forward(records: list[dict[str, object]]) -> list[object]:
            result = await batcher.submit(records[0])
            served.append(result)
            return [result.value]

        try:
            out = await service.handle_async(body, forward=batched_forward)
        except QueueFullError as exc:
            return _refuse(RequestError(503, "queue_full", str(exc)), {"retry-after": "1"})
        except BatcherClosedError as exc:
            return _refuse(RequestError(503, "shutting_down", str(exc)), {"retry-after": "1"})
        except BatchScoringError as exc:
            return _refuse(RequestError(500, "model_error", str(exc)))
        except Exception as exc:  # a failing stage must not take the server down
            return _refuse(RequestError(500, "internal_error", f"{type(exc).__name__}: {exc}"))
        if out.status_code != 200 or not served:
            return Response(out.body, status_code=out.status_code, headers=out.headers)
        result = served[0]
        answer = json.loads(out.body)
        answer.update(
            queue_wait_ms=round(result.queue_wait_ms, 4),
            service_ms=round(result.service_ms, 4),
            batch_size=result.batch_size,
            batch_requests=result.batch_requests,
            deduplicated=result.deduplicated,
            trigger=result.trigger,
        )
        return Response(json.dumps(answer).encode(), status_code=200, headers=out.headers)

    @app.get("/batcher")
    async def batcher_state() -> dict[str, Any]:
        return {**knobs, "queue_len": batcher.queue_len, "stats": batcher.stats.as_dict()}

    return app


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_command(
    port: int,
    runtime: Runtime = "xgboost",
    *,
    lookup_mode: str = "cached",
    n_customers: int = DEFAULT_N_CUSTOMERS,
    seed: int = DEFAULT_SEED,
    store_folder: str | Path | None = None,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    max_queue_size: int = 2048,
    dedup: bool = True,
    run_in_thread: bool = True,
    lifetime_s: float = 300.0,
) -> list[str]:
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    store = build_feature_store(n_customers, seed, folder=store_folder)  # once, here, not in every server
    cmd = [
        sys.executable,
        "-m",
        "course_lib.batching_service",
        f"--runtime={runtime}",
        f"--port={port}",
        f"--lookup={lookup_mode}",
        f"--n-customers={n_customers}",
        f"--seed={seed}",
        f"--store-folder={store.path.parent}",
        f"--max-batch-size={max_batch_size}",
        f"--max-queue-delay-ms={max_queue_delay_ms}",
        f"--max-queue-size={max_queue_size}",
        f"--lifetime-s={lifetime_s}",
    ]
    cmd += [] if dedup else ["--no-dedup"]
    cmd += [] if run_in_thread else ["--model-on-event-loop"]
    return cmd


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


@contextlib.contextmanager
def run_servers(
    configs: Mapping[Hashable, Mapping[str, Any]], *, startup_timeout_s: float = 90.0
) -> Iterator[dict[Hashable, str]]:
    """Start several batched churn servers in subprocesses on 127.0.0.1 at once; yield their base URLs.

    Parameters
    ----------
    configs : mapping name -> keyword arguments
        Each server's ``runtime`` and the keyword arguments of ``churn_service`` and
        ``create_batched_app`` (``lookup_mode``, ``max_batch_size``, ...), plus ``lifetime_s``
        (default 300): the server exits by itself after that long even if this process dies.
    startup_timeout_s : float
        How long to wait for every server to answer ``/healthz``.

    Yields
    ------
    dict name -> base URL such as ``http://127.0.0.1:8123``. Every server is stopped (SIGTERM, then
    SIGKILL after 10 s) when the ``with`` block ends.

    Raises
    ------
    RuntimeError
        If a server exits or does not answer ``/healthz`` in time; the message holds the end of its
        stderr.
    ValueError
        For an unknown runtime.
    """
    import httpx

    procs: dict[Hashable, subprocess.Popen] = {}
    urls: dict[Hashable, str] = {}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        for name, kwargs in configs.items():
            port = _free_port()
            cmd = _server_command(port, **kwargs)
            procs[name] = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
            )
            urls[name] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + startup_timeout_s
        waiting = dict(urls)
        while waiting:
            for name, url in list(waiting.items()):
                proc = procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"server {name!r} exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}"
                    )
                try:
                    if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                        del waiting[name]
                except httpx.TransportError:
                    pass
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(
                    f"servers {list(waiting)} did not answer /healthz within {startup_timeout_s:g} s"
                )
            if waiting:
                time.sleep(0.1)
        yield urls
    finally:
        for proc in procs.values():
            _stop(proc)


@contextlib.contextmanager
def run_server(
    runtime: Runtime = "xgboost", *, startup_timeout_s: float = 90.0, **kwargs: Any
) -> Iterator[str]:
    """Start one batched churn server in a subprocess on 127.0.0.1 and yield its base URL.

    Same as ``run_servers({"server": {"runtime": runtime, **kwargs}})``; see there.
    """
    with run_servers({"server": {"runtime": runtime, **kwargs}}, startup_timeout_s=startup_timeout_s) as urls:
        yield urls["server"]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve the batched churn app with uvicorn on 127.0.0.1 for a bounded time."""
    import uvicorn

    parser = argparse.ArgumentParser(description="Churn scoring with dynamic batching on 127.0.0.1")
    parser.add_argument("--runtime", choices=RUNTIMES, default="xgboost")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--lookup", default="cached", help="indexed, unindexed or cached")
    parser.add_argument("--n-customers", type=int, default=DEFAULT_N_CUSTOMERS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--store-folder", default=None)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--max-queue-size", type=int, default=2048)
    parser.add_argument("--no-dedup", action="store_true")
    parser.add_argument("--model-on-event-loop", action="store_true", help="no worker thread for the model")
    parser.add_argument("--lifetime-s", type=float, default=3600.0, help="exit by itself after this long")
    args = parser.parse_args(argv)
    service = churn_service(
        args.runtime,
        lookup_mode=args.lookup,
        n_customers=args.n_customers,
        seed=args.seed,
        store_folder=args.store_folder,
    )
    app = create_batched_app(
        service,
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
