"""Measure requests/s per replica of the churn model at a p99 limit and store it with its environment.

CPU (the course machine):
    OMP_NUM_THREADS=1 python benchmarks/measure_throughput.py
    -> data/measurements/cpu_throughput.json

GPU (a machine with an NVIDIA GPU, xgboost built with CUDA, optionally onnxruntime-gpu):
    OMP_NUM_THREADS=1 python benchmarks/measure_throughput.py --device cuda
    -> data/measurements/gpu_throughput.json   (CPU references are measured in the same run)

Each batch size times all candidates side by side (course_lib.measure.throughput._measure.measure_batch_latency:
9 interleaved rounds, warm-up excluded, threads pinned to 1). The p99 held to the limit is the median
of the per-round p99s, so a scheduler stall that hits a minority of rounds on a shared machine does
not pick the batch size; the pooled p99 of all calls is stored beside it. Only the model call is timed.
On 2 cores the CPU run takes about 15-30 s. Nothing is asserted;
the script prints the tables and the ratios and writes a JSON record (course_lib.measure.throughput._measure) that
Lesson 5 reads. With --device cuda it stops with exit code 2 and a message if there is no CUDA GPU or
a requested runtime cannot use it; it never writes GPU numbers it did not measure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing course_lib
    sys.path.insert(0, str(ROOT))

from course_lib.core.env import env_report  # noqa: E402
from course_lib.measure.throughput import (  # noqa: E402
    MEASUREMENTS_DIR,
    ThroughputRecord,
    churn_candidates,
    measure_batch_latency,
    onnx_node_placement,
    rps_at_p99_limit,
)

DEFAULT_BATCH_SIZES = {"cpu": [1, 4, 16, 64, 256, 1024], "cuda": [1, 16, 256, 1024, 4096, 16384, 65536]}
#: Model-stage limit: the upper end of the 10-30 ms "model forward pass" budget in source lesson 000.
DEFAULT_P99_LIMIT_MS = 30.0


class PreflightError(RuntimeError):
    """The machine cannot run the requested measurement; the message says what is missing."""


def gpu_info() -> dict[str, str]:
    """Name, driver, memory and compute capability of GPU 0 from nvidia-smi, or PreflightError."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise PreflightError("no CUDA GPU: nvidia-smi is not on PATH (is this a machine with an NVIDIA GPU?)")
    query = "name,driver_version,memory.total,compute_cap"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise PreflightError(f"no CUDA GPU: nvidia-smi failed ({exc})") from exc
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise PreflightError("no CUDA GPU: nvidia-smi lists no devices")
    values = [v.strip() for v in lines[0].split(",")]
    info = dict(zip(("name", "driver_version", "memory_total", "compute_cap"), values, strict=False))
    info["count"] = str(len(lines))
    return info


def preflight_cuda(runtimes: list[str]) -> dict[str, object]:
    """Check that every requested runtime can use CUDA here; return what was found for the record."""
    found: dict[str, object] = {"gpu": gpu_info()}
    if "xgboost" in runtimes:
        import xgboost

        build = xgboost.build_info()
        if not build.get("USE_CUDA", False):
            raise PreflightError(
                f"xgboost {xgboost.__version__} has no CUDA support (build_info USE_CUDA=False). Install a "
                "CUDA build, e.g. `pip install xgboost-cu13` (or `xgboost`), not xgboost-cpu; or drop it "
                "with --runtimes onnxruntime"
            )
        found["xgboost_build"] = {k: str(v) for k, v in build.items() if "CUDA" in k or "NCCL" in k}
    if "onnxruntime" in runtimes:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise PreflightError(
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (providers: "
                f"{ort.get_available_providers()}). Install onnxruntime-gpu instead of onnxruntime, "
                "or measure XGBoost alone with --runtimes xgboost"
            )
        found["onnxruntime_device"] = ort.get_device()
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--runtimes",
        default="onnxruntime,xgboost",
        help="comma-separated subset of onnxruntime,xgboost to measure on --device (default: both)",
    )
    parser.add_argument("--batch-sizes", default=None, help="comma-separated; default depends on --device")
    parser.add_argument("--max-cpu-batch", type=int, default=4096, help="largest batch for CPU candidates")
    parser.add_argument("--p99-limit-ms", type=float, default=DEFAULT_P99_LIMIT_MS)
    parser.add_argument("--wait-factor", type=float, default=2.0)
    parser.add_argument(
        "--target-s", type=float, default=0.6, help="timed seconds per candidate and batch size"
    )
    parser.add_argument(
        "--rounds", type=int, default=9, help="interleaved rounds; p99 = median of round p99s"
    )
    parser.add_argument("--time-budget-s", type=float, default=45.0, help="skip batch sizes once exceeded")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default data/measurements/...)")
    args = parser.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    bad = set(args.runtimes) - {"onnxruntime", "xgboost"}
    if bad or not args.runtimes:
        parser.error(f"--runtimes must name onnxruntime and/or xgboost, got {args.runtimes}")
    sizes = args.batch_sizes or ",".join(map(str, DEFAULT_BATCH_SIZES[args.device]))
    try:
        args.batch_sizes = sorted({int(b) for b in sizes.split(",")})
    except ValueError:
        parser.error(f"--batch-sizes must be comma-separated integers, got {sizes!r}")
    if args.batch_sizes[0] < 1:
        parser.error("--batch-sizes must be >= 1")
    if args.out is None:
        name = "cpu_throughput.json" if args.device == "cpu" else "gpu_throughput.json"
        args.out = MEASUREMENTS_DIR / name
    return args


def parity(candidates: list, batch: int) -> dict[str, float]:
    """Largest |p - p_reference| of each candidate against the first one, on one batch."""
    outputs = {c.name: np.asarray(c.make_call(batch)(), dtype=np.float64).ravel() for c in candidates}
    reference = outputs[candidates[0].name]
    return {name: float(np.abs(p - reference).max()) for name, p in outputs.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    found: dict[str, object] = {}
    if args.device == "cuda":
        try:
            found = preflight_cuda(args.runtimes)
        except PreflightError as exc:
            print(f"measure_throughput: cannot measure on CUDA: {exc}", file=sys.stderr)
            return 2

    from course_lib.churn.export import pipeline_to_onnx
    from course_lib.churn.model import load_or_train_churn_model

    report = env_report()
    print(report)
    if found:
        print("gpu            ", found["gpu"])
    model = load_or_train_churn_model()
    onnx_model = pipeline_to_onnx(model.pipeline)
    n_rows = max(args.batch_sizes)
    cpu_batch = min(args.max_cpu_batch, n_rows)
    cpu_runtimes = ["onnxruntime", "xgboost"] if args.device == "cuda" else args.runtimes
    try:
        candidates = churn_candidates(
            model, onnx_model, runtimes=cpu_runtimes, device="cpu", n_rows=n_rows, max_batch_size=cpu_batch
        )
        if args.device == "cuda" and "xgboost" in args.runtimes:
            candidates += churn_candidates(
                model, onnx_model, runtimes=["xgboost"], device="cuda", n_rows=n_rows
            )
        if args.device == "cuda" and "onnxruntime" in args.runtimes:
            # the ai.onnx.ml tree and one-hot operators have no CUDA kernels and fall back to the CPU,
            # so this candidate is capped like the CPU ones
            candidates += churn_candidates(
                model,
                onnx_model,
                runtimes=["onnxruntime"],
                device="cuda",
                n_rows=n_rows,
                max_batch_size=cpu_batch,
            )
    except RuntimeError as exc:
        print(f"measure_throughput: cannot measure on {args.device}: {exc}", file=sys.stderr)
        return 2
    quiet = contextlib.ExitStack()
    if args.device == "cuda" and "xgboost" in args.runtimes:
        import xgboost

        # Host arrays make XGBoost warn on every GPU call that it copies them; a note below says so.
        quiet.enter_context(xgboost.config_context(verbosity=0))

    notes = [
        "Model call only (features prepared): parsing, feature lookup and HTTP come on top.",
        "rps = batch_size / median call time; admissible if wait_factor x p99 call time <= p99 limit.",
        "p99_us = median over rounds of each round's p99 (the replica's own tail; stalls from other "
        "processes that hit a minority of rounds drop out); p99_pooled_us = p99 of all calls pooled.",
    ]
    not_measured: dict[str, str] = {}
    if args.device == "cuda":
        notes.append("GPU inputs start in host memory, so every GPU call includes the host-to-device copy.")
        for runtime in {"onnxruntime", "xgboost"} - set(args.runtimes):
            not_measured[f"{runtime}/cuda"] = f"not requested (--runtimes {','.join(args.runtimes)})"
    check_rows = min(1024, n_rows)
    diffs = parity(candidates, check_rows)
    print(
        f"max |p - p_{candidates[0].name}| on {check_rows} rows:", {k: f"{v:.2e}" for k, v in diffs.items()}
    )

    placement: dict[str, dict[str, int]] = {}
    onnx_cands = [c for c in candidates if c.runtime == "onnxruntime"]
    if onnx_cands:
        from course_lib.churn.data import make_customers
        from course_lib.churn.export import OnnxChurnScorer, make_session
        from course_lib.churn.model import features

        feeds = OnnxChurnScorer(make_session(onnx_model)).feeds(features(make_customers(64, seed=0)))
        for cand in onnx_cands:
            providers = ["CPUExecutionProvider"]
            if cand.device == "cuda":
                providers.insert(0, "CUDAExecutionProvider")
            placement[cand.name] = onnx_node_placement(onnx_model, providers, feeds)
    if placement:
        print("ONNX Runtime node executions per provider:", placement)

    parts = []
    skipped = []
    with quiet:
        for batch in args.batch_sizes:
            if time.perf_counter() - started > args.time_budget_s:
                skipped.append(batch)
                continue
            t0 = time.perf_counter()
            part = measure_batch_latency(candidates, [batch], target_s=args.target_s, rounds=args.rounds)
            parts.append(part)
            print(f"batch {batch:>6}: {time.perf_counter() - t0:5.1f} s")
    if skipped:
        notes.append(f"batch sizes {skipped} skipped: --time-budget-s {args.time_budget_s} reached")
    table = pd.concat(parts, ignore_index=True)
    at_limit = rps_at_p99_limit(table, args.p99_limit_ms, wait_factor=args.wait_factor)
    pooled = rps_at_p99_limit(
        table, args.p99_limit_ms, wait_factor=args.wait_factor, p99_column="p99_pooled_us"
    )
    for name in at_limit.index:
        a, b = at_limit.loc[name, "batch_size"], pooled.loc[name, "batch_size"]
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            notes.append(
                f"{name}: held to the pooled p99 instead, the batch size chosen would be {b:g} (not {a:g})."
            )

    env = report.as_dict()
    env.update(found)
    import onnxruntime as ort
    import xgboost

    # by module, since the distribution names differ (xgboost, xgboost-cpu, xgboost-cu13, onnxruntime-gpu)
    env["runtime_versions"] = {"xgboost": xgboost.__version__, "onnxruntime": ort.__version__}
    env["max_abs_diff_vs_first_candidate"] = diffs
    env["onnx_node_placement"] = placement
    record = ThroughputRecord(
        device=args.device if args.device == "cpu" else f"cuda ({found['gpu']['name']})",  # type: ignore[index]
        created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        command="OMP_NUM_THREADS={} python benchmarks/measure_throughput.py {}".format(
            os.environ.get("OMP_NUM_THREADS", "unset"), shlex.join(argv if argv is not None else sys.argv[1:])
        ).strip(),
        environment=env,
        settings={
            "p99_limit_ms": args.p99_limit_ms,
            "wait_factor": args.wait_factor,
            "batch_sizes": args.batch_sizes,
            "max_cpu_batch": cpu_batch,
            "rounds": args.rounds,
            "target_s": args.target_s,
            "threads": "xgboost nthread=1, onnxruntime intra_op=inter_op=1",
            "model_version": model.model_version,
            "model_params": {k: model.params[k] for k in ("n_estimators", "max_depth") if k in model.params},
        },
        results=table,
        at_p99_limit=at_limit,
        notes=notes,
        not_measured=not_measured,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(record.to_json(), encoding="utf-8")

    with pd.option_context("display.width", 140, "display.max_columns", 20):
        print("\nCall latency and throughput per batch size:")
        print(table.drop(columns=["runtime", "device"]).round(2).to_string(index=False))
        print(
            f"\nRequests/s per replica at p99 limit {args.p99_limit_ms} ms (wait factor {args.wait_factor}):"
        )
        print(at_limit.round(2).to_string())
        wide = table.pivot(index="batch_size", columns="candidate", values="rps_at_full_use")
        base = candidates[0].name
        print(f"\nThroughput relative to {base} at the same batch size (measured side by side):")
        print((wide.div(wide[base], axis=0)).round(2).to_string())
    print(f"\nwrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
