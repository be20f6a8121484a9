"""Dynamic batching vs one model call per request, in process: the ratio table for ``make bench``.

Concurrent asyncio callers send Poisson traffic (open loop) to a ``DynamicBatcher`` in this process,
no HTTP. For each runtime, two configurations run side by side at every rung of a ladder of offered
rates: ``max_batch_size=1`` (one call per request, same queue and thread) and dynamic batching. Each
configuration climbs until it first misses the p99 limit; the table shows the highest rate it
sustained and the gain over one call per request. ``--http`` repeats the comparison through the real
uvicorn server on 127.0.0.1, where per-request HTTP and JSON work does not batch (Amdahl's law).

Run: ``python benchmarks/batching.py`` (about a minute; ``--http`` adds about a minute).
Absolute rates are for this machine only; the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import pandas as pd

from course_lib import env_report
from course_lib.batching_service import make_record_scorer, run_server, to_payload
from course_lib.data import make_customers
from course_lib.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.loadgen import batcher_target, capacity_table, http_client_target, sweep_rates
from course_lib.model import features, load_or_train_churn_model

BASELINE = "one call per request"
LADDER_RPS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200, 4800)
HTTP_LADDER_RPS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200)


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
    payloads = to_payload(features(make_customers(4096, seed=2024)))
    batched = f"dynamic batching (max {args.max_batch_size}, {args.max_queue_delay_ms:g} ms)"
    knobs = {"max_batch_size": args.max_batch_size, "max_queue_delay_ms": args.max_queue_delay_ms}
    pd.set_option("display.width", 140)
    tables = {}
    for runtime in ("xgboost", "onnxruntime"):
        score = make_record_scorer(runtime, pipeline=model.pipeline, onnx_scorer=onnx_scorer)
        targets = {
            BASELINE: batcher_target(
                score, payloads, max_batch_size=1, max_queue_delay_ms=0.0, max_queue_size=4096
            ),
            batched: batcher_target(score, payloads, max_queue_size=4096, **knobs),
        }
        sweep = asyncio.run(
            sweep_rates(
                targets, LADDER_RPS, p99_limit_ms=args.p99_limit_ms, duration_s=args.duration_s, seed=1
            )
        )
        tables[f"in-process, {runtime}"] = capacity_table(sweep, baseline=BASELINE)
    if args.http:
        for runtime in ("xgboost", "onnxruntime"):
            with contextlib.ExitStack() as stack:
                one = stack.enter_context(
                    run_server(runtime, max_batch_size=1, max_queue_delay_ms=0.0, lifetime_s=600)
                )
                many = stack.enter_context(run_server(runtime, lifetime_s=600, **knobs))
                targets = {
                    BASELINE: http_client_target(one + "/predict", payloads),
                    batched: http_client_target(many + "/predict", payloads),
                }
                sweep = asyncio.run(
                    sweep_rates(
                        targets,
                        HTTP_LADDER_RPS,
                        p99_limit_ms=args.p99_limit_ms,
                        duration_s=args.duration_s,
                        seed=1,
                    )
                )
            tables[f"HTTP, {runtime}"] = capacity_table(sweep, baseline=BASELINE)
    print(
        f"\nHighest offered rate (Poisson, open loop) sustained with p99 <= {args.p99_limit_ms:g} ms, no errors:"
    )
    for title, table in tables.items():
        print(f"\n{title}")
        print(
            table.round({"sustained_rps": 0, "achieved_rps": 0, "p99_ms": 1, "mean_batch_size": 1, "gain": 2})
        )
    print(
        "\nsustained_rps is the highest rung met; the limit lies below first_failed_rps. A target that met every "
        f"rung (first_failed_rps = NaN) is capped by the ladder's top ({LADDER_RPS[-1]} req/s in process)."
    )


if __name__ == "__main__":
    main()
