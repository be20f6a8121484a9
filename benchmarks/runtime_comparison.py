"""Runtime comparison for the README: one churn prediction (and a batch of 1,000) scored four ways.

Run with ``make bench``. Prints the environment, then for each thread setting (1 = the course's pinning;
all cores = XGBoost ``n_jobs`` = usable cores and ONNX Runtime's default pool) a table of median and p99 latency and the speed-up relative to
scikit-learn's ``predict_proba``. Candidates are timed in interleaved rounds in one process, so the
ratios are comparable even on a noisy machine; absolute times are for your machine only.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from course_lib import env_report
from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import features, train_churn_model
from course_lib.churn.pruning import served_rounds
from course_lib.core.bench import compare_latency, usable_cores


def _tables(threads: int, n_calls: int, rounds: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """threads = 0 means all cores: XGBoost gets n_jobs = usable cores explicitly (so the Makefile's
    OMP_NUM_THREADS=1 does not cap it) and ONNX Runtime its default pool (one thread per physical core)."""
    model = train_churn_model(nthread=threads if threads > 0 else usable_cores())
    scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(model.pipeline), intra_op_num_threads=threads))
    encoder = model.pipeline.named_steps["preprocess"]
    booster = model.pipeline.named_steps["xgb"].get_booster()
    served = (0, served_rounds(model.pipeline.named_steps["xgb"]))  # the trees predict_proba uses
    row = features(model.split.test.iloc[[0]])
    record = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.iloc[0].to_dict().items()}
    row_enc, row_feeds = encoder.transform(row).astype(np.float32), scorer.feeds(row)
    batch = features(model.split.test.iloc[:1000])
    batch_enc, batch_feeds = encoder.transform(batch).astype(np.float32), scorer.feeds(batch)
    single = compare_latency(
        {
            "sklearn predict_proba": lambda: model.pipeline.predict_proba(row),
            "xgboost inplace_predict": lambda: booster.inplace_predict(row_enc, iteration_range=served),
            "onnxruntime from dict": lambda: scorer.run(scorer.feeds_from_records([record])),
            "onnxruntime": lambda: scorer.run(row_feeds),
        },
        n_calls=n_calls,
        rounds=rounds,
    )
    batched = compare_latency(
        {
            "sklearn predict_proba": lambda: model.pipeline.predict_proba(batch),
            "xgboost inplace_predict": lambda: booster.inplace_predict(batch_enc, iteration_range=served),
            "onnxruntime": lambda: scorer.run(batch_feeds),
        },
        n_calls=max(3, n_calls // 20),
        rounds=rounds,
        items_per_call=len(batch),
    )
    return single, batched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-calls", type=int, default=200, help="timed calls per candidate per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(env_report(), "\n")
    pd.set_option("display.width", 120)
    for threads in (1, 0):
        label = "1 thread (course pinning)" if threads else f"all {usable_cores()} cores"
        single, batched = _tables(threads, args.n_calls, args.rounds)
        print(f"== one row, {label} ==")
        print(single.round(2).to_string(), "\n")
        print(f"== batch of 1,000 rows, {label} ==")
        print(batched.round(3).to_string(), "\n")
        ratio = single.loc["onnxruntime", "speedup"]
        print(f"ONNX Runtime single-row speed-up over sklearn predict_proba ({label}): {ratio:.0f}x\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
