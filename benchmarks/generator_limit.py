"""How fast can the load generator itself go? httpx in one process vs the course generator (its wire client on uvloop) in 1 and 2 processes.

Every client offers the same Poisson schedules to a null HTTP server (``course_lib.measure.generators.serve_null``,
a separate process that answers ``{}`` at once) on 127.0.0.1. Per client and offered rate the table gives
the send-lag p99 and maximum (actual minus intended send time) and whether every request was answered;
the limit of a client is the highest rate whose send-lag p99 stayed within 1 ms. Clients take turns at
each rate (A, B, C), so drift of a shared machine hits them alike. A generator past its limit reports its
own lateness as latency: this is the number to print beside any load test.

Run: ``python benchmarks/generator_limit.py`` (about a minute on 2 cores). Absolute rates hold for this
machine only.
"""

from __future__ import annotations

import argparse
import asyncio

import pandas as pd

from course_lib import env_report
from course_lib.measure.generators import GeneratorPool, serve_null
from course_lib.measure.loadgen import SEND_LAG_BOUND_MS, run_open_loop
from course_lib.measure.targets import http_client_target

RATES_RPS = (100, 260, 520, 1000, 2000, 4000)


async def _httpx_run(url: str, rate: float, duration_s: float, seed: int):
    async with http_client_target(url, [{}], fields=())() as send:
        return await run_open_loop(send, rate_rps=rate, n_requests=int(rate * duration_s * 2) + 50,
                                   max_duration_s=duration_s, seed=seed)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=1.5)
    args = parser.parse_args()
    print(env_report())
    rows = []
    alive = [
        "httpx, 1 process (asyncio)",
        "wire client + uvloop, 1 process",
        "wire client + uvloop, 2 processes",
    ]
    with GeneratorPool(2) as pool:
        for rate in RATES_RPS:
            for name in list(alive):
                with serve_null(lifetime_s=120) as url:  # a fresh null server: no backlog from the last run
                    if name.startswith("httpx"):
                        result = asyncio.run(_httpx_run(url, rate, args.duration_s, rate))
                    else:
                        k = 1 if "1 process" in name else 2
                        result = pool.run(
                            url, [{}], rate_rps=rate, duration_s=args.duration_s, seed=rate, n_processes=k
                        )
                s = result.summary()
                rows.append(
                    {
                        "client": name,
                        **{
                            k: s[k]
                            for k in (
                                "rate_rps",
                                "sent",
                                "errors",
                                "lag_p99_ms",
                                "max_lag_ms",
                                "generator_ok",
                            )
                        },
                    }
                )
                print(rows[-1])
                if (
                    s["errors"] or s["lag_p99_ms"] > 100 * SEND_LAG_BOUND_MS
                ):  # far past its limit: stop climbing
                    alive.remove(name)
    table = pd.DataFrame(rows)
    ok = table[table["generator_ok"] & (table["errors"] == 0)]
    limits = ok.groupby("client")["rate_rps"].max().reindex(table["client"].unique()).fillna(0.0)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.pivot(index="rate_rps", columns="client", values="max_lag_ms").round(1))
        print(f"limit (send-lag p99 <= {SEND_LAG_BOUND_MS:g} ms), requests/s:")
        print(limits)


if __name__ == "__main__":
    main()
