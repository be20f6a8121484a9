"""Serving peers on the same work: the production service beside BentoML, LitServe and granian.

The production service (``course_lib.serving.production``, uvicorn with httptools + uvloop, from the
course's environment) and three peers, each with the same number of worker processes and the same work
(the request schema, the cached feature lookup, the feature check, the same ONNX Runtime session:
``ProductionService.score_customer``): BentoML and LitServe parse and encode the request themselves;
granian serves the production FastAPI app instead of uvicorn. The peers run from their own virtual
environment, never the course's (their dependencies would change its pins):

    python3 -m venv .venv-peers && .venv-peers/bin/pip install -r benchmarks/requirements-peers.txt

Two generator processes climb one ladder with the servers taking turns at every rung (four rungs per
doubling, at least ``--min-requests`` requests per rung, a missed rung tried once more, ``--repeats``
climbs); each knee is compared with the production service's, with the interval the ladder and the
repeats allow. A peer that cannot be installed or started is recorded with the reason.
``--pin-server-cores N`` starts every server on the first N usable cores and the generator processes on
the rest (``course_lib.core.affinity``; the record's ``pinned`` field names them).

Run: ``python benchmarks/serving_peers.py --out data/measurements/serving_peers.json`` (about 10
minutes on 2 cores). Lesson 12 shows the recorded file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.affinity import PIN_HELP, pin_option, pinned, sides  # noqa: E402
from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.generators import GeneratorPool  # noqa: E402
from course_lib.measure.ladder import SloRule, climb, geometric_ladder, knees  # noqa: E402
from course_lib.measure.server_probes import wait_idle  # noqa: E402
from course_lib.measure.waterfall import (  # noqa: E402
    PEERS,
    PEERS_VENV,
    WaterfallStep,
    lever_table,
    peer_command,
    rung_duration_s,
    save_peers,
)
from course_lib.serving.feature_store import FeatureStore  # noqa: E402
from course_lib.serving.production import ProductionConfig, production_command  # noqa: E402
from course_lib.serving.server import run_processes  # noqa: E402

PRODUCTION_NAME = "production (uvicorn)"


def peer_versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m\n"
        "for p in ('bentoml', 'litserve', 'granian', 'fastapi', 'uvicorn', 'starlette'):\n"
        "    print(p, m.version(p))\n"
    )
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=1000)
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--python", type=Path, default=PEERS_VENV / "bin" / "python", help="the peers' Python"
    )
    parser.add_argument("--pin-server-cores", type=pin_option, dest="pin", metavar="N", help=PIN_HELP)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    print(env_report())
    pin = args.pin
    if pin is not None:
        print(f"pinned: {pin.text()}")
    server_cores, tool_cores = sides(pin)
    unavailable: dict[str, str] = {}
    versions: dict[str, str] = {}
    if not args.python.is_file():
        unavailable = {
            p.name: f"no peers environment at {args.python} (see this script's docstring)" for p in PEERS
        }
    else:
        versions = peer_versions(args.python)
    ids = FeatureStore.open().sample_ids(2048, seed=2024)
    payloads = [{"customer_id": c} for c in ids]
    limit = args.p99_limit_ms
    env = {"PYTHONPATH": str(ROOT), "PEER_WORKERS": str(args.workers), "BENTOML_DO_NOT_TRACK": "True",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    with contextlib.ExitStack() as stack:
        with pinned(tool_cores):  # the generator processes inherit the tools' cores
            pool = stack.enter_context(GeneratorPool(2))
        with pinned(server_cores):  # every server started in this block inherits the server's cores
            urls = dict(
                stack.enter_context(
                    run_processes(
                        {
                            PRODUCTION_NAME: production_command(
                                ProductionConfig(workers=args.workers).with_server(lifetime_s=3600.0)
                            )
                        },
                        startup_timeout_s=300,
                    )
                )
            )
            paths = {PRODUCTION_NAME: "/score"}
            for spec in PEERS:
                if spec.name in unavailable:
                    continue
                try:
                    started = stack.enter_context(
                        run_processes(
                            {spec.name: peer_command(spec, args.python, workers=args.workers)},
                            ready_path=spec.ready_path,
                            startup_timeout_s=300,
                            env={**os.environ, **env},
                            stop_timeout_s=20,
                        )
                    )
                except RuntimeError as exc:
                    unavailable[spec.name] = f"did not start: {str(exc)[:300]}"
                    continue
                urls[spec.name], paths[spec.name] = started[spec.name], spec.path
        stack.enter_context(pinned(tool_cores))  # this process on the tools' cores while it measures
        names = list(urls)
        for name in names:  # warm-up and a check that every server answers the same work
            pool.run(urls[name] + paths[name], payloads, rate_rps=50, duration_s=0.5)

        def run_step(name: str, rate: float, *, n_min: int = args.min_requests):
            duration = rung_duration_s(rate, min_requests=n_min)
            return pool.run(
                urls[name] + paths[name], payloads, rate_rps=rate, duration_s=duration, seed=int(rate * 7)
            )

        def settle(name: str) -> None:
            wait_idle(
                urls[name], quick_ms=limit, timeout_s=10, strict=False
            ) if name == PRODUCTION_NAME else None

        def show(row: dict) -> None:
            print(f"  repeat {row['repeat']} {row['target']:<28} {row['rate_rps']:>8,.0f} req/s try {row['attempt']} "
                  f"sent {row['sent']:>6,} p99 {row['p99_ms']:8.1f} ms met={row['met_slo']}", flush=True)  # fmt: skip

        ladder = geometric_ladder(50, 12_000)
        prescan = climb(
            lambda n, r: run_step(n, r, n_min=200),
            names,
            ladder[::4],
            rule=SloRule(limit, min_requests=150),
            retries=0,
        )
        starts = {}
        for _, row in knees(prescan).iterrows():
            below = [r for r in ladder if r <= max(row["knee_rps"], ladder[0])]
            starts[row["target"]] = ladder[max(0, len(below) - 4)]
        runs = pd.concat(
            [
                climb(
                    run_step,
                    names,
                    ladder,
                    start_rps=starts,
                    rule=SloRule(limit, min_requests=args.min_requests),
                    repeat=r,
                    settle=settle,
                    on_row=show,
                )
                for r in range(args.repeats)
            ],
            ignore_index=True,
        )
    steps = [
        WaterfallStep(PRODUCTION_NAME, PRODUCTION_NAME, "/score", None, "the course's production service")
    ]
    steps += [WaterfallStep(n, n, paths[n], PRODUCTION_NAME, f"{n} on the same work") for n in names[1:]]
    table = lever_table(steps, knees(runs))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(
            table[
                [
                    "median_knee_rps",
                    "min_knee_rps",
                    "max_knee_rps",
                    "ratio_to_base",
                    "ratio_low",
                    "ratio_high",
                    "verdict",
                ]
            ]
        )
    for name, why in unavailable.items():
        print(f"{name}: not measured ({why})")
    if args.out is not None:
        path = save_peers(
            table,
            args.out,
            versions=versions,
            unavailable=unavailable,
            repeats=args.repeats,
            workers=args.workers,
            min_requests=args.min_requests,
            p99_limit_ms=limit,
            ladder_rps=ladder,
            start_rps=starts,
            generator="course_lib.measure.generators, 2 processes (wire client: httptools + uvloop)",
            production=PRODUCTION_NAME,
            pinned=None if pin is None else pin.describe(),
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
