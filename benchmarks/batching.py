"""Dynamic batching vs one model call per request, in process: the ratio table for ``make bench``.

Concurrent asyncio callers send Poisson traffic (open loop) to a ``DynamicBatcher`` in this process,
no HTTP; each request carries one customer's features from the Lesson 2 feature store, and the batch
score function is Lesson 2's forward stage. For each runtime, configurations run side by side at
every rung of a ladder of offered rates: ``max_batch_size=1`` (one call per request, model in a
worker thread like the batcher's), the same with the model on the event loop, and dynamic batching.
Each climbs until it first misses the p99 limit; the table shows the highest rate it sustained and
the gain over the better one-call-per-request baseline. ``--http`` repeats the comparison through
the real server (``course_lib.serving.batching.predict``, ``POST /predict``) on 127.0.0.1, where per-request
HTTP, JSON and lookup work does not batch (Amdahl's law).

Run: ``python benchmarks/batching.py`` (about 2 minutes on 2 cores; ``--http`` adds about 1.5 minutes).
Absolute rates are for this machine only; the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import pandas as pd

from course_lib import env_report
from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import load_or_train_churn_model
from course_lib.core.vocabulary import SERVING_RUNTIMES
from course_lib.measure.batching_gain import capacity_table
from course_lib.measure.ladder import SloRule, climb_async, open_loop_runs
from course_lib.measure.targets import batcher_target, http_client_target
from course_lib.serving.batching.predict import run_server
from course_lib.serving.feature_store import FeatureStore
from course_lib.serving.service import native_forward, onnx_forward

BASELINE = "one call per request"
BASELINE_ON_LOOP = "one call per request, model on the event loop"
LADDER_RPS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200, 4800, 6400, 9600)
HTTP_LADDER_RPS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200)


def _sweep(
    targets: dict, ladder_rps: tuple[int, ...], *, p99_limit_ms: float, duration_s: float
) -> pd.DataFrame:
    """The targets taking turns on the ladder; a rung is met with no error and the p99 within the limit."""
    run = open_loop_runs(
        targets, duration_s=duration_s, request_timeout_s=max(0.5, 5 * p99_limit_ms / 1000), seed=1
    )
    return asyncio.run(climb_async(run, list(targets), ladder_rps, rule=SloRule.without_errors(p99_limit_ms)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--duration-s", type=float, default=1.5, help="seconds per rung")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    parser.add_argument("--http", action="store_true", help="also measure through the HTTP server")
    args = parser.parse_args()
    print(env_report())
    model = load_or_train_churn_model()
    onnx_scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(model.pipeline)))
    store = FeatureStore.open()
    ids = store.sample_ids(4096, seed=2024)
    records = [store.get(cid) for cid in ids]
    payloads = [{"customer_id": cid} for cid in ids]
    batched = f"dynamic batching (max {args.max_batch_size}, {args.max_queue_delay_ms:g} ms)"
    knobs = {"max_batch_size": args.max_batch_size, "max_queue_delay_ms": args.max_queue_delay_ms}
    one_call = {"max_batch_size": 1, "max_queue_delay_ms": 0.0, "max_queue_size": 4096}
    sweep_kwargs = {"p99_limit_ms": args.p99_limit_ms, "duration_s": args.duration_s}
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    tables = {}
    for runtime, forward in (
        ("xgboost", native_forward(model.pipeline)),
        ("onnxruntime", onnx_forward(onnx_scorer)),
    ):
        targets = {
            BASELINE: batcher_target(forward, records, **one_call),
            BASELINE_ON_LOOP: batcher_target(forward, records, run_in_thread=False, **one_call),
            batched: batcher_target(forward, records, max_queue_size=4096, **knobs),
        }
        sweep = _sweep(targets, LADDER_RPS, **sweep_kwargs)
        tables[f"in process, {runtime}"] = capacity_table(sweep, baseline=[BASELINE, BASELINE_ON_LOOP])
    if args.http:
        for runtime in SERVING_RUNTIMES:  # native XGBoost and ONNX Runtime, as in process above
            with contextlib.ExitStack() as stack:
                one = stack.enter_context(
                    run_server(runtime, max_batch_size=1, max_queue_delay_ms=0.0, lifetime_s=600)
                )
                many = stack.enter_context(run_server(runtime, lifetime_s=600, **knobs))
                targets = {
                    BASELINE: http_client_target(one + "/predict", payloads),
                    batched: http_client_target(many + "/predict", payloads),
                }
                sweep = _sweep(targets, HTTP_LADDER_RPS, **sweep_kwargs)
            tables[f"HTTP /predict, {runtime}"] = capacity_table(sweep, baseline=BASELINE)
    print(
        f"\nHighest offered rate (Poisson, open loop) sustained with p99 <= {args.p99_limit_ms:g} ms, no errors:"
    )
    for title, table in tables.items():
        print(f"\n{title}")
        print(
            table.round({"sustained_rps": 0, "achieved_rps": 0, "p99_ms": 1, "mean_batch_size": 1, "gain": 2})
        )
    print(
        "\ngain = sustained_rps / the better one-call-per-request row. sustained_rps is the highest rung met; the "
        "limit lies below first_failed_rps. A row that met every rung (first_failed_rps = NaN) is capped by the "
        f"ladder's top ({LADDER_RPS[-1]} req/s in process), so its gain is a lower bound."
    )


if __name__ == "__main__":
    main()
