"""k6 and the course generator below the knee: their wire p50s, with the generator's spin and without it.

Starts the production service (``course_lib.serving.production.PRODUCTION``, its own processes on
127.0.0.1) and runs ``course_lib.measure.waterfall.spin_comparison`` on its ``/score`` at ``--rates``
(below its knee): the course generator and k6 taking turns at each rate, once with the generator's 2 ms
spin before each send (``SPIN_WINDOW_S``, as every course measurement runs it) and once without it
(``spin_s=0``: it sleeps on its loop's timer until the send, as k6's goroutines sleep between
iterations, and yields only for what an early wake-up leaves), the two settings taking turns, and the
tool that goes first alternating, ``--repeats`` times. Prints each setting's p50 ratio (course generator / k6, both
timed from the request's write to its answer's last byte) with its range over the repeats. Nothing is
asserted. Lesson 6 reads the record. ``--pin-server-cores N`` puts the server on the first N usable
cores and both tools (and this process) on the rest (``course_lib.core.affinity``), so that neither
tool's p50 holds a wait for the server's workers; the record's ``pinned`` field names the cores.

Run: ``python benchmarks/tool_wire_p50.py --out data/measurements/tool_wire_p50.json`` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.affinity import PIN_HELP, pin_option, pinned, sides  # noqa: E402
from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.generators import GeneratorPool  # noqa: E402
from course_lib.measure.load_tools import k6_version  # noqa: E402
from course_lib.measure.server_probes import wait_idle  # noqa: E402
from course_lib.measure.waterfall import save_tool_wire_p50, spin_comparison, spin_table  # noqa: E402
from course_lib.serving.feature_store import FeatureStore  # noqa: E402
from course_lib.serving.production import PRODUCTION, production_command  # noqa: E402
from course_lib.serving.server import run_processes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[500.0, 905.0, 1280.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=1000)
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--pin-server-cores", type=pin_option, dest="pin", metavar="N", help=PIN_HELP)
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args(argv)
    print(env_report())
    pin = args.pin
    if pin is not None:
        print(f"pinned: {pin.text()}")
    server_cores, tool_cores = sides(pin)
    ids = FeatureStore.open().sample_ids(2048, seed=2024)
    with contextlib.ExitStack() as stack:
        with pinned(tool_cores):  # the generator processes inherit the tools' cores
            pool = stack.enter_context(GeneratorPool(2))
        with pinned(server_cores):  # the server's workers: one per core it may use
            described = PRODUCTION.describe()
            command = production_command(PRODUCTION.with_server(lifetime_s=1800))
            urls = stack.enter_context(run_processes({"production": command}, startup_timeout_s=300))
        stack.enter_context(pinned(tool_cores))  # this process, and k6 started from it
        base = dict(urls)["production"]
        pool.run(base + "/score", [{"customer_id": c} for c in ids], rate_rps=50, duration_s=0.5)  # warm-up
        rows = spin_comparison(
            pool, base + "/score", ids, args.rates, p99_limit_ms=args.p99_limit_ms, repeats=args.repeats,
            min_requests=args.min_requests, settle=lambda: wait_idle(base, quick_ms=args.p99_limit_ms, timeout_s=10, strict=False),
        )  # fmt: skip
    if args.out is not None:
        path = save_tool_wire_p50(
            rows, args.out, repeats=args.repeats, min_requests=args.min_requests, p99_limit_ms=args.p99_limit_ms,
            rates_rps=list(args.rates), server=f"the production service ({described})",
            pinned=None if pin is None else pin.describe(),
            generator="course_lib.measure.generators, 2 processes (wire client: httptools + uvloop)", k6=k6_version(),
        )  # fmt: skip
        print(f"wrote {path}")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(spin_table(rows).round(3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
