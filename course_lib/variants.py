"""The reviewer's table for model variants: file size, latency at two batch sizes, accuracy against a budget.

Every variant (FP32, FP16, INT8 dynamic, INT8 static with each calibration method...) is an ONNX file
served through the same ``OnnxChurnScorer``. ``variant_scorecard`` scores all of them on the same
evaluation customers, checks each against an ``AccuracyBudget`` declared beforehand, and times them
side by side (interleaved rounds, one batch size at a time) so that the latency ratios come from
one run on one machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from course_lib.accuracy_budget import AccuracyBudget, budget_verdicts
from course_lib.bench import compare_latency
from course_lib.export import OnnxChurnScorer, make_session
from course_lib.model import features

__all__ = ["load_scorers", "variant_latency", "variant_scorecard"]


def load_scorers(paths: Mapping[str, str | Path]) -> dict[str, OnnxChurnScorer]:
    """One ``OnnxChurnScorer`` (one thread, all graph optimisations) per variant file.

    Raises
    ------
    ValueError
        If ``paths`` is empty.
    FileNotFoundError
        If a file does not exist (the message names the variant).
    """
    if not paths:
        raise ValueError("paths must map at least one variant name to an .onnx file")
    scorers = {}
    for name, path in paths.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"variant {name!r}: ONNX file not found: {path}")
        scorers[name] = OnnxChurnScorer(make_session(path))
    return scorers


def variant_latency(
    scorers: Mapping[str, OnnxChurnScorer],
    X: pd.DataFrame,
    *,
    batch_sizes: Sequence[int] = (1, 1024),
    n_calls: Mapping[int, int] | None = None,
    rounds: int = 3,
    warmup_calls: int = 5,
) -> pd.DataFrame:
    """Median latency of every variant at every batch size, all variants timed side by side.

    Parameters
    ----------
    scorers : mapping of variant name -> OnnxChurnScorer; the first is the baseline of ``speedup``.
    X : DataFrame of feature rows, at least ``max(batch_sizes)`` of them; each batch is its first rows.
    batch_sizes : batch sizes to time.
    n_calls : mapping of batch size -> timed calls per round, optional
        A batch size it does not name gets the harness's rule (:func:`course_lib.bench.calls_per_round`:
        about 1 s timed per variant, 20 to 1,000 calls per round).
    rounds, warmup_calls : as in ``course_lib.bench.compare_latency``.

    Returns
    -------
    DataFrame indexed by variant with ``median_us_b{B}`` and ``speedup_b{B}`` for each batch size B
    (speedup = baseline median / variant median, measured in the same run).

    Raises
    ------
    ValueError
        If ``X`` has fewer rows than the largest batch size or a batch size is below 1.
    """
    if min(batch_sizes) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if len(X) < max(batch_sizes):
        raise ValueError(f"X has {len(X)} rows; the largest batch size needs {max(batch_sizes)}")
    columns = {}
    for batch in batch_sizes:
        rows = X.iloc[:batch]
        candidates = {}
        for name, scorer in scorers.items():
            feeds = scorer.feeds(rows)
            candidates[name] = lambda s=scorer, f=feeds: s.run(f)
        calls = (n_calls or {}).get(batch)  # None: the harness's rule, course_lib.bench.calls_per_round
        table = compare_latency(candidates, n_calls=calls, rounds=rounds, warmup_calls=warmup_calls)
        columns[f"median_us_b{batch}"] = table["median_us"]
        columns[f"speedup_b{batch}"] = table["speedup"]
    out = pd.DataFrame(columns)
    out.index.name = "variant"
    return out


def variant_scorecard(
    paths: Mapping[str, str | Path],
    df: pd.DataFrame,
    budget: AccuracyBudget,
    *,
    reference: str | None = None,
    batch_sizes: Sequence[int] | None = (1, 1024),
    **latency_options: object,
) -> pd.DataFrame:
    """Size, accuracy-versus-budget and (optionally) latency of every variant in one table.

    Parameters
    ----------
    paths : mapping of variant name -> ``.onnx`` file.
    df : evaluation customers (labels and slice columns), e.g. the test split.
    budget : AccuracyBudget declared before this call.
    reference : variant the others are compared with; defaults to the first.
    batch_sizes : batch sizes to time, or None to skip timing.
    **latency_options : passed to ``variant_latency`` (``n_calls``, ``rounds``, ``warmup_calls``).

    Returns
    -------
    DataFrame indexed by variant with ``file_bytes``, ``size_vs_reference``, the columns of
    ``budget_verdicts`` (``roc_auc``, ``log_loss``, ``max_slice_auc_drop``, ``worst_slice``,
    ``passes``...), ``max_abs_diff`` (largest |p_variant - p_reference|) and, when timed, the columns
    of ``variant_latency``.

    Raises
    ------
    ValueError
        If ``reference`` is not one of the variants; see also ``load_scorers``.
    """
    scorers = load_scorers(paths)
    ref = reference if reference is not None else next(iter(paths))
    if ref not in scorers:
        raise ValueError(f"reference {ref!r} is not one of the variants {list(paths)}")
    X = features(df)
    probs = {name: s.predict_proba(X).astype(np.float64) for name, s in scorers.items()}
    table = pd.DataFrame(
        {
            "file_bytes": {n: Path(p).stat().st_size for n, p in paths.items()},
        }
    )
    table["size_vs_reference"] = table["file_bytes"] / table.loc[ref, "file_bytes"]
    verdicts = budget_verdicts(df, probs[ref], probs, budget)
    table = table.join(verdicts)
    table["max_abs_diff"] = {n: float(np.max(np.abs(p - probs[ref]))) for n, p in probs.items()}
    if batch_sizes:
        ordered = {ref: scorers[ref], **{n: s for n, s in scorers.items() if n != ref}}
        table = table.join(variant_latency(ordered, X, batch_sizes=batch_sizes, **latency_options))
    table.index.name = "variant"
    return table
