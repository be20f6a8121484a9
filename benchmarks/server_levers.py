"""Server-side levers at the knee: uvicorn's parser and loop, worker processes, the JSON encoder.

Four configurations of the Lesson 3 churn server (``course_lib.measure.server_levers.LEVER_CONFIGS``), each in
its own process on 127.0.0.1, all started before measuring: the baseline ``h11`` + ``asyncio`` with one
worker and the standard ``json`` module (what Lessons 2 and 3 use); ``httptools`` + ``uvloop``; two
uvicorn worker processes; ``orjson`` for the answer. The open-loop generator (``course_lib.measure.generators``,
processes apart from the servers) first measures its own limit on a null server, then climbs one ladder
of offered rates on ``POST /score``; at every rung the configurations take turns, and each drops out
after its first miss of the SLO (p99 <= limit, errors < 0.1%). The table gives each knee and its ratio to
the baseline beside the generator's limit: a knee at or above that limit is the generator's, not the
server's, and is marked so.

Run: ``python benchmarks/server_levers.py [--out data/measurements/server_levers.json]`` (about 3 minutes
on 2 cores). Absolute rates hold for this machine only; the ratios are the result, and on 2 cores the
two-worker server competes with the generator for the same cores. Lesson 6 shows the recorded file.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pandas as pd

from course_lib import env_report
from course_lib.measure.generators import GeneratorPool, generator_limit, serve_null
from course_lib.measure.load_server import serve_churn, wait_idle
from course_lib.measure.server_levers import LEVER_CONFIGS, interleaved_knees, knee_ratios, save_lever_record
from course_lib.serving.feature_store import FeatureStore

# Steps of about 1.4x: a knee is only known to lie between two rungs, so coarse rungs blur the ratios.
LADDER_RPS = (25, 35, 50, 70, 100, 140, 200, 280, 400, 560, 800, 1100, 1600, 2200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--duration-s", type=float, default=1.5, help="seconds per rung")
    parser.add_argument("--generators", type=int, default=2, help="generator processes (as in Lesson 6)")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args()
    print(env_report())
    payloads = [{"customer_id": cid} for cid in FeatureStore.open().sample_ids(1024, seed=2024)]
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(GeneratorPool(args.generators))
        with serve_null(lifetime_s=120) as null_url:
            gen_limit, _ = generator_limit(pool, null_url, [100, 250, 500, 1000, 2000, 4000], duration_s=1.0)
        print(f"generator limit (send-lag p99 <= 1 ms): {gen_limit:,.0f} requests/s")
        urls = {
            name: stack.enter_context(serve_churn(lifetime_s=900, startup_timeout_s=300, **kw)).url
            for name, kw in LEVER_CONFIGS.items()
        }
        for url in urls.values():  # warm-up, not recorded
            pool.run(url + "/score", payloads, rate_rps=20, duration_s=0.5)

        def step(name: str, rate: float):
            return pool.run(
                urls[name] + "/score", payloads, rate_rps=rate, duration_s=args.duration_s, seed=int(rate)
            )

        def show(name: str, row: dict) -> None:
            print(
                f"{name:<42} {row['rate_rps']:>6.0f} req/s  p99 {row['p99_ms']:8.1f} ms  met_slo={row['met_slo']}"
            )

        tables = interleaved_knees(
            step,
            LEVER_CONFIGS,
            LADDER_RPS,
            p99_limit_ms=args.p99_limit_ms,
            settle=lambda name: wait_idle(urls[name], quick_ms=args.p99_limit_ms, timeout_s=10, strict=False),
            on_row=show,
        )
    knees = knee_ratios(tables, generator_limit_rps=gen_limit)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(knees.round(2))
    if args.out is not None:
        path = save_lever_record(
            knees,
            args.out,
            generator_limit_rps=gen_limit,
            p99_limit_ms=args.p99_limit_ms,
            ladder_rps=LADDER_RPS,
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
