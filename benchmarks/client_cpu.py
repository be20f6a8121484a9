"""CPU per request of the two generator clients: aiohttp (``aiohttp_target``) and the wire client (``wire_target``).

Each client sends ``--requests`` POSTs, ``--concurrency`` in flight, to the course's null server
(``course_lib.measure.generators.serve_null``) on 127.0.0.1 under uvloop, after 64 untimed ones; the
figure is this process's CPU time (``time.process_time``) per request, in microseconds, with the
clients taking turns ``--repeats`` times. The generator's own CPU is taken from the server under test on
a 2-core machine, so the cheaper client leaves more of the machine to what is measured.

Run: ``python benchmarks/client_cpu.py`` (about 20 s).
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
from course_lib.measure.generators import serve_null  # noqa: E402
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
    args = parser.parse_args()
    print(env_report())
    results: dict[str, list[float]] = {name: [] for name in CLIENTS}
    with serve_null(lifetime_s=300) as url:
        for repeat in range(args.repeats):
            for name, factory in CLIENTS.items():
                us = uvloop.run(cpu_us_per_request(factory, url, args.requests, args.concurrency))
                results[name].append(us)
                print(f"repeat {repeat}: {name:<12} {us:6.0f} us CPU per request")
    for name, values in results.items():
        print(
            f"{name:<12} median {sorted(values)[len(values) // 2]:6.0f} us, range {min(values):.0f}-{max(values):.0f}"
        )


if __name__ == "__main__":
    main()
