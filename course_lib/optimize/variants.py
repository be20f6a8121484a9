"""The reviewer's table for model variants: file size, latency at two batch sizes, accuracy against a budget.

Every variant (FP32, FP16, INT8 dynamic, INT8 static with each calibration method...) is an ONNX file
served through the same ``OnnxChurnScorer``. ``variant_scorecard`` scores all of them on the same
evaluation customers, checks each against an ``AccuracyBudget`` declared beforehand, checks that a
customer's score does not depend on the other customers in the same call (``batch_dependence``), and
times them side by side (interleaved rounds, one batch size at a time) so that the latency ratios come
from one run on one machine. ``choose_variant`` applies the rule: the smallest file that passes the
budget, and, for a batched service, is batch-independent.

Why batch independence: ONNX Runtime's dynamic quantization measures each activation's range on every
call, over the whole batch. A customer's INT8-dynamic score therefore depends on who else is in the
batch: a batching server (Lesson 3) would give the same customer different answers depending on the
traffic. FP32, FP16 and INT8-static (ranges fixed at calibration) compute each row on its own.

References
----------
ONNX Runtime documentation, "Quantize ONNX models" (dynamic vs static quantization: "the scale and
zero point of activations are calculated dynamically" per run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict, Unpack, cast

import numpy as np
import pandas as pd

from course_lib.churn.export import PARITY_ATOL, OnnxChurnScorer, make_session
from course_lib.churn.model import features
from course_lib.churn.schema import NUMERIC_SCHEMA
from course_lib.core.bench import compare_latency_by_batch
from course_lib.core.checks import InvalidArgumentError, integer, integers, non_empty, one_of
from course_lib.optimize.accuracy_budget import AccuracyBudget, budget_verdicts

__all__ = [
    "BATCH_INDEPENDENCE_ATOL",
    "batch_dependence",
    "choose_variant",
    "extreme_mates",
    "load_scorers",
    "variant_latency",
    "variant_scorecard",
]

#: Largest allowed |score alone - score in a batch| for a variant that a batching server may use.
#: Rationale: the same bound as ONNX parity (``course_lib.churn.export._onnx.PARITY_ATOL`` = 1e-5): a score
#: may depend on its batch mates no more than on the runtime that computes it. Row-wise kernels (FP32,
#: FP16, INT8-static) move by 0 to ~1e-7 (float32 summation order); INT8-dynamic moves by ~1e-3 on
#: ordinary batches, and far more next to an extreme customer.
BATCH_INDEPENDENCE_ATOL = PARITY_ATOL


def load_scorers(paths: Mapping[str, str | Path]) -> dict[str, OnnxChurnScorer]:
    """One ``OnnxChurnScorer`` (one thread, all graph optimisations) per variant file.

    Raises
    ------
    ValueError
        If ``paths`` is empty.
    FileNotFoundError
        If a file does not exist (the message names the variant).
    """
    non_empty("paths", paths)
    scorers = {}
    for name, path in paths.items():
        if not Path(path).is_file():
            raise FileNotFoundError(f"variant {name!r}: ONNX file not found: {path}")
        scorers[name] = OnnxChurnScorer(make_session(path))
    return scorers


class _LatencyOptions(TypedDict, total=False):
    """The timing options ``variant_scorecard`` passes on to ``variant_latency``."""

    n_calls: Mapping[int, int] | None
    rounds: int
    warmup_calls: int
    confidence: float | None


def variant_latency(
    scorers: Mapping[str, OnnxChurnScorer],
    X: pd.DataFrame,
    *,
    batch_sizes: Sequence[int] = (1, 1024),
    n_calls: Mapping[int, int] | None = None,
    rounds: int = 6,
    warmup_calls: int = 5,
    confidence: float | None = None,
) -> pd.DataFrame:
    """Median latency of every variant at every batch size, all variants timed side by side.

    Parameters
    ----------
    scorers : mapping of variant name -> OnnxChurnScorer; the first is the baseline of ``speedup``.
    X : DataFrame of feature rows, at least ``max(batch_sizes)`` of them; each batch is its first rows.
    batch_sizes : batch sizes to time.
    n_calls, rounds, warmup_calls, confidence : as in :func:`course_lib.core.bench.compare_latency_by_batch`
        (each variant is a candidate).

    Returns
    -------
    DataFrame indexed by variant with ``median_us_b{B}`` and ``speedup_b{B}`` for each batch size B
    (speedup = baseline median / variant median, measured in the same run). With ``confidence``, also
    ``speedup_low_b{B}``, ``speedup_high_b{B}`` and ``resolved_b{B}`` (+1 faster, -1 slower, 0 not
    resolved), and ``.attrs["intervals"]`` = {B: {variant: RatioInterval of its time over the baseline's}}.

    Raises
    ------
    ValueError
        If ``X`` has fewer rows than the largest batch size or a batch size is below 1.
    """
    batch_sizes = integers("batch_sizes", batch_sizes, min=1)
    if len(X) < max(batch_sizes):
        raise InvalidArgumentError(f"X has {len(X)} rows; the largest batch size needs {max(batch_sizes)}")
    columns = {}
    intervals: dict[int, dict[str, object]] = {}

    def candidates_at(batch: int) -> dict[str, Callable[..., object]]:
        rows = X.iloc[:batch]
        candidates: dict[str, Callable[..., object]] = {}
        for name, scorer in scorers.items():
            feeds = scorer.feeds(rows)
            candidates[name] = lambda s=scorer, f=feeds: s.run(f)
        return candidates

    tables = compare_latency_by_batch(
        candidates_at,
        batch_sizes,
        n_calls=n_calls,
        rounds=rounds,
        warmup_calls=warmup_calls,
        confidence=confidence,
    )
    for batch, table in tables.items():
        columns[f"median_us_b{batch}"] = table["median_us"]
        columns[f"speedup_b{batch}"] = table["speedup"]
        if confidence is not None:
            columns[f"speedup_low_b{batch}"] = table["speedup_low"]
            columns[f"speedup_high_b{batch}"] = table["speedup_high"]
            columns[f"resolved_b{batch}"] = table["resolved"]
            intervals[batch] = table.attrs["intervals"]
    out = pd.DataFrame(columns)
    out.index.name = "variant"
    if confidence is not None:
        out.attrs["intervals"] = intervals
    return out


def extreme_mates(X: pd.DataFrame) -> pd.DataFrame:
    """Two customers at the corners of the feature schema: every numeric input at its allowed maximum,
    then at its allowed minimum (categoricals copied from ``X``'s first row). Still valid inputs, so a
    service admits them as batch mates of anyone.

    Raises
    ------
    ValueError
        If ``X`` is empty.
    """
    non_empty("X", X)
    high, low = X.iloc[[0]].copy(), X.iloc[[0]].copy()
    for name, spec in NUMERIC_SCHEMA.items():
        dtype = cast(np.dtype, X[name].dtype)  # a numeric feature: a NumPy dtype, not an ExtensionDtype
        high[name] = np.asarray([spec.high]).astype(dtype)
        low[name] = np.asarray([spec.low]).astype(dtype)
    return pd.concat([high, low], ignore_index=True)


def batch_dependence(
    scorer: OnnxChurnScorer,
    X: pd.DataFrame,
    *,
    n_batches: int = 3,
    batch_size: int = 32,
    seed: int = 0,
) -> float:
    """Largest |score alone - score in a batch| over fixed, seeded batches of ``X``'s customers.

    Each batch holds ``batch_size`` customers drawn with ``seed``; every one is scored alone (batch of
    1), in the batch (ordinary mates), and in the batch plus ``extreme_mates(X)``.

    Parameters
    ----------
    scorer : OnnxChurnScorer
    X : DataFrame of the 19 features (e.g. the test split).
    n_batches, batch_size : int >= 1
    seed : int
        Seed of the draw (the same seed gives the same batches for every variant).

    Returns
    -------
    float
        Max absolute difference in churn probability; 0.0 for a row-wise model.

    Raises
    ------
    ValueError
        If ``X`` is empty or a count is below 1.
    """
    non_empty("X", X)
    n_batches = integer("n_batches", n_batches, min=1)
    batch_size = integer("batch_size", batch_size, min=1)
    rng = np.random.default_rng(seed)
    n = n_batches * batch_size
    rows = rng.choice(len(X), size=n, replace=n > len(X))
    feeds = scorer.feeds(X.iloc[rows])
    extreme = scorer.feeds(extreme_mates(X))
    alone = np.array([scorer.run({k: v[i : i + 1] for k, v in feeds.items()})[0] for i in range(n)])
    worst = 0.0
    for b in range(n_batches):
        part = {k: v[b * batch_size : (b + 1) * batch_size] for k, v in feeds.items()}
        mixed = {k: np.concatenate([extreme[k][:1], v, extreme[k][1:]]) for k, v in part.items()}
        expected = alone[b * batch_size : (b + 1) * batch_size]
        in_batch = scorer.run(part)
        with_extremes = scorer.run(mixed)[1:-1]
        worst = max(
            worst, float(np.max(np.abs(in_batch - expected))), float(np.max(np.abs(with_extremes - expected)))
        )
    return worst


def choose_variant(card: pd.DataFrame, *, batched: bool = True) -> str:
    """The rule fixed in advance: the smallest file that passes the accuracy budget and, for a batched
    service, is batch-independent (``batch_independent`` column of ``variant_scorecard``).

    Parameters
    ----------
    card : DataFrame from ``variant_scorecard`` (``file_bytes``, ``passes``, ``batch_independent``).
    batched : bool
        True (default) for a service that scores several customers per call (Lesson 3's batcher).

    Returns
    -------
    str
        The chosen variant's name (ties: the first in ``card``'s order).

    Raises
    ------
    ValueError
        If no variant qualifies (the message says which rule removed which variants), or ``card`` lacks
        a needed column.
    """
    needed = ["file_bytes", "passes"] + (["batch_independent"] if batched else [])
    missing = [c for c in needed if c not in card.columns]
    if missing:
        raise ValueError(f"card lacks columns {missing}; build it with variant_scorecard")
    ok = card["passes"].astype(bool)
    if batched:
        ok &= card["batch_independent"].astype(bool)
    if not ok.any():
        failed_budget = list(card.index[~card["passes"].astype(bool)])
        dependent = list(card.index[~card["batch_independent"].astype(bool)]) if batched else []
        raise ValueError(
            f"no variant qualifies: over the accuracy budget {failed_budget}, batch-dependent {dependent}"
        )
    return str(card.loc[ok, "file_bytes"].idxmin())


def variant_scorecard(
    paths: Mapping[str, str | Path],
    df: pd.DataFrame,
    budget: AccuracyBudget,
    *,
    reference: str | None = None,
    batch_sizes: Sequence[int] | None = (1, 1024),
    batch_check_seed: int = 0,
    **latency_options: Unpack[_LatencyOptions],
) -> pd.DataFrame:
    """Size, accuracy-versus-budget, batch independence and (optionally) latency of each variant in one table.

    Parameters
    ----------
    paths : mapping of variant name -> ``.onnx`` file.
    df : evaluation customers (labels and slice columns), e.g. the test split.
    budget : AccuracyBudget declared before this call.
    reference : variant the others are compared with; defaults to the first.
    batch_sizes : batch sizes to time, or None to skip timing.
    batch_check_seed : int
        Seed of ``batch_dependence``'s batches (the same batches for every variant).
    **latency_options : passed to ``variant_latency`` (``n_calls``, ``rounds``, ``warmup_calls``).

    Returns
    -------
    DataFrame indexed by variant with ``file_bytes``, ``size_vs_reference``, the columns of
    ``budget_verdicts`` (``roc_auc``, ``log_loss``, ``max_slice_auc_drop``, ``worst_slice``,
    ``passes``...), ``max_abs_diff`` (largest |p_variant - p_reference|), ``batch_max_abs_diff``
    (``batch_dependence``: largest |score alone - score in a batch with ordinary and extreme mates|),
    ``batch_independent`` (``batch_max_abs_diff <= BATCH_INDEPENDENCE_ATOL``) and, when timed, the
    columns of ``variant_latency``.

    Raises
    ------
    ValueError
        If ``reference`` is not one of the variants; see also ``load_scorers``.
    """
    scorers = load_scorers(paths)
    ref = reference if reference is not None else next(iter(paths))
    one_of("reference", ref, scorers)
    X = features(df)
    probs = {name: s.predict_proba(X).astype(np.float64) for name, s in scorers.items()}
    table = pd.DataFrame(
        {
            "file_bytes": {n: Path(p).stat().st_size for n, p in paths.items()},
        }
    )
    table["size_vs_reference"] = table["file_bytes"] / table["file_bytes"].loc[ref]
    verdicts = budget_verdicts(df, probs[ref], probs, budget)
    table = table.join(verdicts)
    table["max_abs_diff"] = {n: float(np.max(np.abs(p - probs[ref]))) for n, p in probs.items()}
    table["batch_max_abs_diff"] = {
        n: batch_dependence(s, X, seed=batch_check_seed) for n, s in scorers.items()
    }
    table["batch_independent"] = table["batch_max_abs_diff"] <= BATCH_INDEPENDENCE_ATOL
    if batch_sizes:
        ordered = {ref: scorers[ref], **{n: s for n, s in scorers.items() if n != ref}}
        table = table.join(variant_latency(ordered, X, batch_sizes=batch_sizes, **latency_options))
    table.index.name = "variant"
    return table
