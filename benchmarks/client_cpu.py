"""CPU per request of the load tools: the generator's two clients, then the course generator beside k6.

Part 1, the clients: aiohttp (``aiohttp_target``) and the wire client (``wire_target``). Each sends ``--requests`` POSTs, ``--concurrency`` in flight, to the course's null server
(``course_lib.measure.generators.serve_null``) on 127.0.0.1 under uvloop, after 64 untimed ones; the
figure is this process's CPU time (``time.process_time``) per request, in microseconds, with the
clients taking turns ``--repeats`` times. The generator's own CPU is taken from the server under test on
a 2-core machine, so the cheaper client leaves more of the machine to what is measured.

Part 2, the tools: the course generator (``GeneratorPool``, 2 processes, the wire client, its 2 ms
spin before each send included, and reported apart) and k6 (``loadtests/churn.js``), open loop at each of ``--rates`` for
``--duration-s``, taking turns ``--repeats`` times, against the same null server
(``course_lib.measure.load_tools.client_cpu_table``: k6's cost by the difference of a run and one twice
as long, so its start-up cancels). ``--out`` writes the table to
``data/measurements/client_cpu.json``, which Lessons 6 and 12 read.

Run: ``python benchmarks/client_cpu.py --out data/measurements/client_cpu.json`` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.generators import GeneratorPool, serve_null  # noqa: E402
from course_lib.measure.load_tools import client_cpu_table, k6_version, save_client_cpu  # noqa: E402
from course_lib.measure.targets import WIRE_FIELD, aiohttp_target, wire_target  # noqa: E402

CLIENTS = {"aiohttp": aiohttp_target, "wire client": wire_target}


async def cpu_us_per_request(factory, url: str, n_requests: int, concurrency: int) -> float:
    """This process's CPU time per request (us) while ``factory``'s client sends ``n_requests``."""
    async with factory(url, [{"customer_id": "SC-0000042"}], fields=(WIRE_FIELD,))() as send:
        await asyncio.gather(*(send(i) for i in range(64)))  # connections open, code paths warm
        slots = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with slots:
                await send(i)

        start = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n_requests)))
        return 1e6 * (time.process_time() - start) / n_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[500.0, 1000.0, 2000.0], help="req/s (part 2)"
    )
    parser.add_argument(
        "--duration-s", type=float, default=3.0, help="seconds per run (part 2; k6 also runs twice as long)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write part 2's table here (JSON)")
    args = parser.parse_args()
    print(env_report())
    results: dict[str, list[float]] = {name: [] for name in CLIENTS}
    with serve_null(lifetime_s=900) as url:
        for repeat in range(args.repeats):
            for name, factory in CLIENTS.items():
                us = uvloop.run(cpu_us_per_request(factory, url, args.requests, args.concurrency))
                results[name].append(us)
                print(f"repeat {repeat}: {name:<12} {us:6.0f} us CPU per request")
        for name, values in results.items():
            print(
                f"{name:<12} median {sorted(values)[len(values) // 2]:6.0f} us, range {min(values):.0f}-{max(values):.0f}"
            )
        ids = [f"SC-{i:07d}" for i in range(64)]  # the null server answers {} whatever is asked
        with GeneratorPool(2) as pool:
            table = client_cpu_table(
                pool, url, ids, args.rates, duration_s=args.duration_s, repeats=args.repeats
            )
    print(table.round(3).to_string(index=False))
    summary = table.groupby(["tool", "rate_rps"]).agg(
        median=("cpu_us_per_request", "median"), low=("cpu_us_per_request", "min"),
        high=("cpu_us_per_request", "max"), spin_median=("spin_us_per_request", "median"),
    )  # fmt: skip
    print("open loop against the null server, CPU per request (us; spin: the generator's before its sends):")
    print(summary.round(0).to_string())
    if args.out is not None:
        path = save_client_cpu(table, args.out, repeats=args.repeats, duration_s=args.duration_s,
                               rates_rps=list(args.rates), generator="course_lib.measure.generators, 2 processes (wire client)",
                               k6=k6_version())  # fmt: skip
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
