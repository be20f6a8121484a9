"""Server-side levers at the knee: uvicorn's parser and loop, worker processes, the JSON encoder.

Four configurations of the Lesson 3 churn server (``course_lib.load_server``), each in its own process
on 127.0.0.1, all started before measuring: the baseline ``h11`` + ``asyncio`` with one worker and the
standard ``json`` module (what Lessons 2 and 3 use); ``httptools`` + ``uvloop``; two uvicorn worker
processes; ``orjson`` for the answer. The open-loop generator (``course_lib.generators``, two processes
apart from the servers) climbs one ladder of offered rates on ``POST /score``; at every rung the
configurations take turns (A, B, C, D), so drift of a shared machine hits them alike, and each drops
out after its first miss of the SLO (p99 <= limit, errors < 0.1%). The table gives each knee and its
ratio to the baseline, beside the generator's own limit measured on a null server: a knee at or above
that limit is the generator's, not the server's, and is marked so.

Run: ``python benchmarks/server_levers.py`` (about 2 minutes on 2 cores). Absolute rates hold for this
machine only; the ratios are the result, and on 2 cores the two-worker server competes with the
generator for the same cores.
"""

from __future__ import annotations

import argparse
import contextlib

import pandas as pd

from course_lib import env_report
from course_lib.feature_store import FeatureStore
from course_lib.generators import GeneratorPool, generator_limit, serve_null
from course_lib.knee import find_knee, step_row
from course_lib.load_server import serve_churn, wait_idle

CONFIGS: dict[str, dict[str, object]] = {
    "h11 + asyncio, 1 worker, json (baseline)": {},
    "httptools + uvloop": {"http": "httptools", "loop": "uvloop"},
    "2 workers": {"workers": 2},
    "orjson answer": {"json_encoder": "orjson"},
}
LADDER_RPS = (25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--duration-s", type=float, default=1.5, help="seconds per rung")
    parser.add_argument("--generators", type=int, default=2, help="generator processes")
    args = parser.parse_args()
    print(env_report())
    payloads = [{"customer_id": cid} for cid in FeatureStore.open().sample_ids(1024, seed=2024)]
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(GeneratorPool(args.generators))
        with serve_null(lifetime_s=120) as null_url:
            gen_limit, _ = generator_limit(pool, null_url, [250, 500, 1000, 2000, 4000, 8000], duration_s=1.0)
        print(f"generator limit (send-lag p99 <= 1 ms): {gen_limit:,.0f} requests/s")
        urls = {
            name: stack.enter_context(serve_churn(lifetime_s=900, startup_timeout_s=300, **kw)).url
            for name, kw in CONFIGS.items()
        }
        for url in urls.values():  # warm-up, not recorded
            pool.run(url + "/score", payloads, rate_rps=20, duration_s=0.5)
        rows: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        alive = list(CONFIGS)
        for rate in LADDER_RPS:
            for name in list(alive):
                wait_idle(urls[name], quick_ms=args.p99_limit_ms, timeout_s=10, strict=False)
                result = pool.run(
                    urls[name] + "/score", payloads, rate_rps=rate, duration_s=args.duration_s, seed=rate
                )
                row = step_row(result, p99_limit_ms=args.p99_limit_ms)
                rows[name].append(row)
                print(f"{name:<42} {rate:>6} req/s  p99 {row['p99_ms']:8.1f} ms  met_slo={row['met_slo']}")
                if not row["met_slo"]:
                    alive.remove(name)
            if not alive:
                break
    table = pd.DataFrame({name: find_knee(pd.DataFrame(r)) for name, r in rows.items()}).T
    base = table["knee_rps"].iloc[0]
    table["ratio_to_baseline"] = table["knee_rps"] / base if base > 0 else float("nan")
    table["generator_bound"] = table["knee_rps"] >= gen_limit
    table["generator_limit_rps"] = gen_limit
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(2))


if __name__ == "__main__":
    main()
