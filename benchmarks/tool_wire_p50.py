"""k6 and the course generator below the knee: their wire p50s, with the generator's spin and without it.

Starts the production service (``course_lib.serving.production.PRODUCTION``, its own processes on
127.0.0.1) and runs ``course_lib.measure.waterfall.spin_comparison`` on its ``/score`` at ``--rates``
(below its knee): the course generator and k6 taking turns at each rate, once with the generator's 2 ms
spin before each send (``SPIN_WINDOW_S``, as every course measurement runs it) and once without it
(``spin_s=0``: it sleeps on its loop's timer until the send, as k6's goroutines sleep between
iterations, and yields only for what an early wake-up leaves), the two settings taking turns, and the
tool that goes first alternating, ``--repeats`` times. Prints each setting's p50 ratio (course generator / k6, both
timed from the request's write to its answer's last byte) with its range over the repeats. Nothing is
asserted. Lesson 6 reads the record.

Run: ``python benchmarks/tool_wire_p50.py --out data/measurements/tool_wire_p50.json`` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.generators import GeneratorPool  # noqa: E402
from course_lib.measure.load_server import wait_idle  # noqa: E402
from course_lib.measure.waterfall import k6_version, save_tool_wire_p50, spin_comparison, spin_table  # noqa: E402
from course_lib.serving.feature_store import FeatureStore  # noqa: E402
from course_lib.serving.production import PRODUCTION, production_command  # noqa: E402
from course_lib.serving.server import DEFAULTS, run_processes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[500.0, 905.0, 1280.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=1000)
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args(argv)
    print(env_report())
    ids = FeatureStore.open().sample_ids(2048, seed=2024)
    with (
        GeneratorPool(2) as pool,
        run_processes(
            {"production": production_command(PRODUCTION, DEFAULTS.replace(lifetime_s=1800))},
            startup_timeout_s=300,
        ) as urls,  # fmt: skip
    ):
        base = dict(urls)["production"]
        pool.run(base + "/score", [{"customer_id": c} for c in ids], rate_rps=50, duration_s=0.5)  # warm-up
        rows = spin_comparison(
            pool, base + "/score", ids, args.rates, p99_limit_ms=args.p99_limit_ms, repeats=args.repeats,
            min_requests=args.min_requests, settle=lambda: wait_idle(base, quick_ms=args.p99_limit_ms, timeout_s=10, strict=False),
        )  # fmt: skip
    if args.out is not None:
        path = save_tool_wire_p50(
            rows, args.out, repeats=args.repeats, min_requests=args.min_requests, p99_limit_ms=args.p99_limit_ms,
            rates_rps=list(args.rates), server=f"the production service ({PRODUCTION.describe()})",
            generator="course_lib.measure.generators, 2 processes (wire client: httptools + uvloop)", k6=k6_version(),
        )  # fmt: skip
        print(f"wrote {path}")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(spin_table(rows).round(3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
