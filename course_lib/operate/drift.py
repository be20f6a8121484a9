"""Drift: the population stability index (PSI) of scores and features, and slice AUC over time.

PSI compares the share of a reference population (training data, or v1's scores) and of a current
one (this week's traffic, or v2's scores) in the same bins: ``sum((a - e) * ln(a / e))`` over the
bins, where ``e`` and ``a`` are the reference and current shares. Numeric values are binned at the
reference deciles (missing values get a bin of their own); categorical values bin by level. The
usual reading, stated as this course's thresholds: below ``PSI_STABLE`` (0.10) no real shift,
up to ``PSI_ALERT`` (0.25) a moderate shift worth a look, above it a shift that needs action.

References
----------
Siddiqi, N. (2006), "Credit Risk Scorecards", Wiley: the population stability index and its
0.10 / 0.25 rule of thumb. Yurdakul, B. (2018), "Statistical properties of population stability
index", Western Michigan University dissertation: PSI's sampling distribution (small samples
inflate it; hence minimum sample sizes before acting on it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from course_lib.churn.data import load_telco, make_customers
from course_lib.churn.model import tenure_band
from course_lib.core.checks import integer, non_empty, number

__all__ = [
    "PSI_ALERT",
    "PSI_STABLE",
    "psi",
    "psi_table",
    "psi_verdict",
    "shifted_week",
    "slice_auc_over_time",
]

PSI_STABLE = 0.10
PSI_ALERT = 0.25
_EPS = 1e-4  # floor of a bin's share, so an empty bin gives a large but finite term


def _is_categorical(values: pd.Series) -> bool:
    return not pd.api.types.is_numeric_dtype(values) or isinstance(values.dtype, pd.CategoricalDtype)


def _shares(reference: pd.Series, current: pd.Series, bins: int) -> tuple[np.ndarray, np.ndarray]:
    if _is_categorical(reference) or _is_categorical(current):
        ref, cur = reference.astype(str), current.astype(str)
        levels = sorted(set(ref) | set(cur))
        e = ref.value_counts().reindex(levels, fill_value=0).to_numpy(float)
        a = cur.value_counts().reindex(levels, fill_value=0).to_numpy(float)
    else:
        ref_x, cur_x = reference.to_numpy(float), current.to_numpy(float)
        finite = ref_x[~np.isnan(ref_x)]
        edges: np.ndarray | list[float] = (
            np.unique(np.quantile(finite, np.linspace(0, 1, bins + 1)[1:-1])) if finite.size else []
        )
        e = np.append(
            np.bincount(np.searchsorted(edges, finite, side="right"), minlength=len(edges) + 1),
            np.isnan(ref_x).sum(),
        )
        cur_f = cur_x[~np.isnan(cur_x)]
        a = np.append(
            np.bincount(np.searchsorted(edges, cur_f, side="right"), minlength=len(edges) + 1),
            np.isnan(cur_x).sum(),
        )
    return e / e.sum(), a / a.sum()


def psi(
    reference: Sequence | np.ndarray | pd.Series,
    current: Sequence | np.ndarray | pd.Series,
    *,
    bins: int = 10,
) -> float:
    """Population stability index of ``current`` against ``reference``.

    Parameters
    ----------
    reference, current : 1-D values (numbers, with NaN as missing, or category labels), n >= 1 each.
    bins : int
        Numeric values: number of reference-quantile bins (>= 2; ties merge bins).

    Returns
    -------
    float >= 0; 0 when both populations fill the bins alike. Shares are floored at 1e-4.

    Raises
    ------
    ValueError
        If either input is empty or ``bins`` < 2.
    """
    ref = non_empty("reference", pd.Series(reference))
    cur = non_empty("current", pd.Series(current))
    bins = integer("bins", bins, min=2)
    e, a = _shares(ref, cur, bins)
    e, a = np.maximum(e, _EPS), np.maximum(a, _EPS)
    return float(np.sum((a - e) * np.log(a / e)))


def psi_verdict(value: float) -> str:
    """``"stable"`` (< 0.10), ``"moderate shift"`` (< 0.25) or ``"major shift"``."""
    return "stable" if value < PSI_STABLE else "moderate shift" if value < PSI_ALERT else "major shift"


def psi_table(reference: pd.DataFrame, current: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """PSI and verdict of every column in ``columns`` (current against reference), worst first.

    Raises
    ------
    KeyError
        If a column is missing from either frame.
    """
    rows = [{"column": c, "psi": psi(reference[c], current[c])} for c in columns]
    table = pd.DataFrame(rows).set_index("column").sort_values("psi", ascending=False)
    table["verdict"] = table["psi"].map(psi_verdict)
    return table


def shifted_week(
    n_per_day: int = 2000,
    *,
    days: int = 7,
    month_to_month_start: float | None = None,
    month_to_month_end: float = 0.80,
    seed: int = 9,
    source: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """A synthetic week of scored customers whose contract mix drifts toward month-to-month.

    Each day draws ``n_per_day`` customers from a ``make_customers`` population, choosing
    month-to-month customers with a probability that moves linearly from ``month_to_month_start``
    (default: the real data's share) on day 0 to ``month_to_month_end`` on the last day; a
    marketing campaign that signs up many short-contract customers would look like this.

    Pass the test split as ``source`` when the week is scored by a model trained on the rest:
    resampling customers the model was trained on would flatter its AUC.

    Returns
    -------
    DataFrame with the ``load_telco`` columns plus ``day`` (0..days-1).

    Raises
    ------
    ValueError
        If a share is outside (0, 1), or ``days`` or ``n_per_day`` < 1.
    """
    days = integer("days", days, min=1)
    n_per_day = integer("n_per_day", n_per_day, min=1)
    real = load_telco()
    start = (
        float((real["contract"] == "Month-to-month").mean())
        if month_to_month_start is None
        else month_to_month_start
    )
    for name, value in (("month_to_month_start", start), ("month_to_month_end", month_to_month_end)):
        number(name, value, min=0, max=1, min_open=True, max_open=True)
    pool = make_customers(n_per_day * days * 4, seed=seed, source=real)
    m2m = pool[pool["contract"] == "Month-to-month"]
    other = pool[pool["contract"] != "Month-to-month"]
    rng = np.random.default_rng(seed)
    parts, used_m, used_o = [], 0, 0
    for day in range(days):
        share = start + (month_to_month_end - start) * (day / max(days - 1, 1))
        k = int(rng.binomial(n_per_day, share))
        part = pd.concat([m2m.iloc[used_m : used_m + k], other.iloc[used_o : used_o + n_per_day - k]])
        used_m, used_o = used_m + k, used_o + n_per_day - k
        parts.append(part.assign(day=day))
    return pd.concat(parts, ignore_index=True)


def slice_auc_over_time(
    frame: pd.DataFrame,
    score: str,
    *,
    time_col: str = "day",
    slice_col: str = "tenure_band",
    min_rows: int = 50,
) -> pd.DataFrame:
    """ROC AUC per time step and slice level, from the rows whose labels have arrived.

    Parameters
    ----------
    frame : DataFrame with ``churn`` (labels; NaN = not arrived yet), ``score``, ``time_col`` and
        ``slice_col`` (``tenure_band`` is derived from ``tenure`` when absent).
    min_rows : int
        A cell with fewer labelled rows, or only one class, gets NaN (an AUC from a handful of rows is noise).

    Returns
    -------
    DataFrame indexed by ``time_col`` with one column per slice level plus ``all``, and the labelled
    row counts in columns ``n_<level>``.
    """
    data = frame if slice_col in frame else frame.assign(tenure_band=tenure_band(frame["tenure"]))
    data = data[data["churn"].notna()]
    rows = []
    for t, part in data.groupby(time_col, sort=True):
        row = {time_col: t}
        groups = [("all", part), *((str(k), g) for k, g in part.groupby(slice_col, observed=True, sort=True))]
        for level, g in groups:
            y = g["churn"].astype(int).to_numpy()
            ok = len(g) >= min_rows and len(np.unique(y)) == 2
            row[level] = float(roc_auc_score(y, g[score])) if ok else np.nan
            row[f"n_{level}"] = len(g)
        rows.append(row)
    return pd.DataFrame(rows).set_index(time_col)
