"""The service waterfall: prototype to production one lever at a time, against the framework's floor.

Every server of ``course_lib.measure.waterfall.WATERFALL`` runs in its own processes on 127.0.0.1
(the prototype is Lesson 6's ``serve_churn``; the others are ``course_lib.serving.production``
configurations; the floor is the production stack's ``POST /null``). Two generator processes
(``course_lib.measure.generators``) first measure their own limit on a null server, then every step's
in-process ceiling is read from ``Server-Timing``, a short pre-scan finds where each knee roughly is, and
the ladder (four rungs per doubling) is climbed ``--repeats`` times with the steps taking turns at every
rung, each rung holding at least ``--min-requests`` requests (1,000 resolve a p99), a missed rung tried
once more, and a step whose start rung (from the pre-scan) misses tries the rungs below it. With
``--k6`` the production step is also climbed by k6 (``loadtests/churn.js``) beside the course
generator at the same rates, the two taking turns, ``--repeats`` times, a missed rate tried once
more. ``--pin-server-cores N`` gives every server the first N usable cores (the production service
then runs one worker per core of those) and the generator processes, k6 and this process the rest
(``course_lib.core.affinity``): on a machine with cores to spare, neither side then waits for the
other's work; the record's ``pinned`` field names the cores. Nothing is asserted; the table prints every knee, its range over the repeats, its ratio to its
base with the interval, and the verdict (gain / loss / not resolved).

Run: ``python benchmarks/service_waterfall.py --k6 --out data/measurements/service_waterfall.json``
(a full run takes about 30 minutes on 2 cores: the prototype's rungs need 1,000 requests each at
a few dozen requests/s). ``--quick`` is a short run with coarse rungs (one repeat, 200 requests per rung,
four steps), as Lesson 12 does. Lessons 5, 6 and 12 read the recorded file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.affinity import PIN_HELP, pin_option  # noqa: E402
from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.generators import generator_limit_text  # noqa: E402
from course_lib.measure.load_tools import k6_version  # noqa: E402
from course_lib.measure.waterfall import (  # noqa: E402
    AGREEMENT_TOLERANCE,
    FLOOR_STEP,
    PRODUCTION_STEP,
    PROTOTYPE_STEP,
    WATERFALL,
    run_waterfall,
    save_waterfall,
    tool_agreement,
)

QUICK_STEPS = (PROTOTYPE_STEP, "ONNX Runtime", PRODUCTION_STEP, FLOOR_STEP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--min-requests", type=int, default=1000, help="requests per rung (1,000 resolve a p99)"
    )
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--k6", action="store_true", help="also climb the production step with k6")
    parser.add_argument("--quick", action="store_true", help="one repeat, 200 requests per rung, four steps")
    parser.add_argument("--steps", nargs="*", default=None, help="names of the steps to run (default all)")
    parser.add_argument("--pin-server-cores", type=pin_option, dest="pin", metavar="N", help=PIN_HELP)
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args(argv)
    print(env_report())
    pin = args.pin
    if pin is not None:
        print(f"pinned: {pin.text()}")
    names = args.steps or (list(QUICK_STEPS) if args.quick else [s.name for s in WATERFALL])
    steps = [s for s in WATERFALL if s.name in names]
    unknown = sorted(set(names) - {s.name for s in WATERFALL})
    if unknown:
        parser.error(f"--steps: unknown step(s) {unknown}; the steps are {[s.name for s in WATERFALL]}")
    needed = {PROTOTYPE_STEP, PRODUCTION_STEP, FLOOR_STEP}
    if args.out is not None and not needed <= set(names):
        parser.error(
            f"--out needs the steps {sorted(needed)} (the record's ratios are to them); "
            f"missing {sorted(needed - set(names))}. Drop --out to climb other steps alone."
        )
    repeats, min_requests = (1, 200) if args.quick else (args.repeats, args.min_requests)

    def show(row: dict) -> None:
        print(
            f"  repeat {row['repeat']} {row['target']:<32} {row['rate_rps']:>8,.0f} req/s  try {row['attempt']}  "
            f"sent {row['sent']:>6,}  p99 {row['p99_ms']:8.1f} ms  lag p99 {row['lag_p99_ms']:5.2f} ms  met={row['met_slo']}",
            flush=True,
        )

    run = run_waterfall(
        steps,
        repeats=repeats,
        min_requests=min_requests,
        p99_limit_ms=args.p99_limit_ms,
        k6_step=PRODUCTION_STEP if args.k6 else None,
        on_row=show,
        pin=pin,
        step_down=True,  # a start from the short pre-scan can lie above the knee: try the rungs below it
    )
    columns = [
        "median_knee_rps",
        "min_knee_rps",
        "max_knee_rps",
        "ratio_to_base",
        "ratio_low",
        "ratio_high",
        "verdict",
        "handle_ms",
        "ceiling_rps",
    ]
    with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_colwidth", 40):
        print(run.table[columns].round(3))
        if len(run.tools):
            print(run.tools.round(2))
            a = tool_agreement(run.tools)
            print(
                f"k6 beside the course generator, {a['repeats']} repeats: median knees {a['knee_rps']}, ranges "
                f"{a['knee_range_rps']} (ratio {a['knee_ratio']:.2f}, "
                f"{'agree' if a['knee_agrees'] else 'do not agree'} within {AGREEMENT_TOLERANCE:.0%}); "
                f"p50 on the wire (write to read), course generator / k6, furthest from 1: {a['worst_p50_ratio']:.2f} "
                f"({'agree' if a['p50_agrees'] else 'do not agree'} at every rate both met)"
            )
    lowest, highest = run.settings["generator_lowest_rps"], run.settings["generator_highest_rps"]
    gen_text = generator_limit_text(run.generator_limit_rps, lowest, highest)
    print(f"generator limit (send-lag p99 <= 1 ms): {gen_text}")
    if args.out is not None:
        generator = f"course_lib.measure.generators, {run.settings['n_generators']} processes (wire client: httptools + uvloop)"
        path = save_waterfall(
            run.table,
            args.out,
            floor_step=FLOOR_STEP,
            prototype_step=PROTOTYPE_STEP,
            production_step=PRODUCTION_STEP,
            generator=generator,
            k6=k6_version() if args.k6 else None,
            quick=bool(args.quick),
            tools=run.tools.to_dict(orient="records"),
            stages_ms=run.stages_ms,
            server_stats={
                k: {f: v.get(f) for f in ("forward", "forward_cost_ms", "workers", "config")}
                for k, v in run.server_stats.items()
            },
            **run.settings,
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
