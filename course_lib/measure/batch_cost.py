"""What one model call costs as a function of batch size: measure it, fit a line, tabulate the trade.

A model call pays a fixed overhead (Python dispatch, input checks, building the input tensor or
DataFrame, starting the kernel) plus a cost per item. The linear model

    call_ms = overhead_ms + per_item_ms x batch_size

is the whole story of why batching raises throughput: the overhead is paid once per call, so
``batch_size / call_ms`` items per millisecond grows with the batch until the per-item term dominates.
The ceiling is ``1 / per_item_ms`` items per millisecond.

References
----------
Source lesson 001 ("Inference Optimisation and Scaling"), batching table built from
``call = 5 + 0.2 x batch`` ms. NVIDIA Triton Inference Server documentation, "Dynamic Batcher".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from course_lib.core.bench import interleaved_rounds_ns
from course_lib.core.checks import integer, integers, positive_number
from course_lib.core.percentiles import percentile

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "CostModelFit",
    "LinearCostModel",
    "cost_table",
    "fit_linear_cost",
    "forward_call_factory",
    "measure_call_ms",
]

#: Batch sizes the lesson measures: powers of two from 1 to 1024.
DEFAULT_BATCH_SIZES: tuple[int, ...] = tuple(2**k for k in range(11))


@dataclass(frozen=True)
class LinearCostModel:
    """``call_ms = overhead_ms + per_item_ms x batch_size`` for one model call.

    Callable: ``model(batch_size)`` returns the call time in ms, so a fitted model can be passed
    straight to ``course_lib.simulate.batching.simulate_dynamic_batching(service_time_ms=model)``.

    Parameters
    ----------
    overhead_ms : float
        Fixed cost of one call, ms (>= 0).
    per_item_ms : float
        Extra cost of each item in the call, ms (>= 0).

    Raises
    ------
    ValueError
        If either parameter is negative or not finite.
    """

    overhead_ms: float
    per_item_ms: float

    def __post_init__(self) -> None:
        positive_number("overhead_ms", self.overhead_ms, allow_zero=True)
        positive_number("per_item_ms", self.per_item_ms, allow_zero=True)

    def __call__(self, batch_size: int) -> float:
        """Call time in ms for ``batch_size`` items (an integer >= 1)."""
        batch_size = integer("batch_size", batch_size, min=1)
        return float(self.overhead_ms + self.per_item_ms * batch_size)

    @property
    def max_items_per_s(self) -> float:
        """Throughput ceiling as the batch grows without bound: 1000 / per_item_ms (inf if 0)."""
        return math.inf if self.per_item_ms == 0 else 1000.0 / self.per_item_ms

    def __str__(self) -> str:
        return f"call_ms = {self.overhead_ms:.4g} + {self.per_item_ms:.4g} x batch_size"


@dataclass(frozen=True)
class CostModelFit:
    """A least-squares fit of ``LinearCostModel`` to measured call times, with its quality.

    Attributes
    ----------
    model : LinearCostModel
        The fitted line (intercept and slope clipped at 0 only if the raw fit was negative, which is
        flagged by ``raw_overhead_ms`` / ``raw_per_item_ms`` differing from the model's values).
    raw_overhead_ms, raw_per_item_ms : float
        The unconstrained least-squares intercept and slope.
    r_squared : float
        Coefficient of determination of the raw fit on milliseconds, 1 - SS_res / SS_tot
        (1.0 = perfect line), whichever weighting was fitted.
    batch_sizes : ndarray of int, shape (k,)
    call_ms : ndarray of float, shape (k,)
        The measurements that were fitted.
    residuals_ms : ndarray of float, shape (k,)
        ``call_ms - raw fit``; a curve in them (not noise) means the cost is not linear.
    """

    model: LinearCostModel
    raw_overhead_ms: float
    raw_per_item_ms: float
    r_squared: float
    batch_sizes: np.ndarray
    call_ms: np.ndarray
    residuals_ms: np.ndarray

    @property
    def max_abs_residual_ms(self) -> float:
        return float(np.max(np.abs(self.residuals_ms)))

    @property
    def max_rel_residual(self) -> float:
        """Largest |residual| / measured time: how far off the line is at its worst, as a fraction."""
        return float(np.max(np.abs(self.residuals_ms) / self.call_ms))

    def residual_table(self) -> pd.DataFrame:
        """Per batch size: measured ms, fitted ms, residual ms and residual as % of the measurement."""
        fitted = self.call_ms - self.residuals_ms
        return pd.DataFrame(
            {
                "batch_size": self.batch_sizes,
                "measured_ms": self.call_ms,
                "fitted_ms": fitted,
                "residual_ms": self.residuals_ms,
                "residual_pct": 100.0 * self.residuals_ms / self.call_ms,
            }
        )


def fit_linear_cost(
    batch_sizes: Sequence[int] | np.ndarray, call_ms: Sequence[float] | np.ndarray, *, relative: bool = False
) -> CostModelFit:
    """Fit ``call_ms = overhead_ms + per_item_ms x batch_size`` by least squares.

    Parameters
    ----------
    batch_sizes : array-like of int >= 1, shape (k,), k >= 2 with at least two distinct sizes.
    call_ms : array-like of float > 0, shape (k,)
        Measured time of one call at each batch size (e.g. the median of many calls), ms.
    relative : bool
        False (default): ordinary least squares on milliseconds, so the large batches, whose times
        are largest, dominate the fit. True: weighted least squares on relative error (each
        residual divided by its measurement), so a batch of 1 counts as much as a batch of 1024;
        use it when the overhead is what you want to read off.

    Returns
    -------
    CostModelFit

    Raises
    ------
    ValueError
        Mismatched lengths, fewer than two distinct batch sizes, or non-finite / non-positive times.
    """
    sizes = np.asarray(integers("batch_sizes", batch_sizes, min=1), dtype=float)
    y = np.asarray(call_ms, dtype=float).ravel()
    if y.shape != sizes.shape:
        raise ValueError(f"batch_sizes and call_ms must have the same length, got {sizes.size} and {y.size}")
    if np.unique(sizes).size < 2:
        raise ValueError("a line needs call times at two or more distinct batch sizes")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"call_ms must be finite and > 0 ms, got {y.tolist()}")
    design = np.column_stack([np.ones_like(sizes), sizes])
    weights = 1.0 / y if relative else np.ones_like(y)
    (intercept, slope), *_ = np.linalg.lstsq(design * weights[:, None], y * weights, rcond=None)
    fitted = intercept + slope * sizes
    residuals = y - fitted
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residuals**2)) / ss_tot if ss_tot > 0 else 1.0
    model = LinearCostModel(max(float(intercept), 0.0), max(float(slope), 0.0))
    return CostModelFit(
        model=model,
        raw_overhead_ms=float(intercept),
        raw_per_item_ms=float(slope),
        r_squared=r2,
        batch_sizes=sizes.astype(int),
        call_ms=y,
        residuals_ms=residuals,
    )


def cost_table(model: Callable[[int], float], batch_sizes: Iterable[int] = (1, 8, 32, 128)) -> pd.DataFrame:
    """Tabulate a cost model: call time, items per second and speed-up over batches of 1.

    Parameters
    ----------
    model : callable batch_size -> call time in ms
        A ``LinearCostModel`` or any function of the batch size.
    batch_sizes : iterable of int >= 1
        Rows of the table.

    Returns
    -------
    DataFrame with columns ``batch_size``, ``call_ms``, ``items_per_s`` (= 1000 x batch / call_ms) and
    ``speedup_vs_batch1`` (items per second relative to one item per call). Values are not rounded.

    Raises
    ------
    ValueError
        For a batch size below 1, or a model returning a time that is not finite and > 0.

    References
    ----------
    Source lesson 001, table for ``5 + 0.2 x batch``: 1 -> 5.2 ms, 192/s; 8 -> 6.6 ms, 1,212/s, 6.3x;
    32 -> 11.4 ms, 2,807/s, 14.6x; 128 -> 30.6 ms, 4,183/s, 21.8x.
    """
    sizes = integers("batch_sizes", batch_sizes, min=1)
    call_ms = []
    for b in [1, *sizes]:
        call_ms.append(positive_number(f"model({b})", model(b), unit="a call time in ms"))
    single_rate = 1000.0 / call_ms[0]
    table = pd.DataFrame({"batch_size": sizes, "call_ms": call_ms[1:]})
    table["items_per_s"] = 1000.0 * table["batch_size"] / table["call_ms"]
    table["speedup_vs_batch1"] = table["items_per_s"] / single_rate
    return table


def measure_call_ms(
    make_call: Callable[[int], Callable[[], object]],
    batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
    *,
    n_calls: int = 20,
    rounds: int = 3,
    warmup_calls: int = 3,
) -> pd.DataFrame:
    """Time one model call at each batch size; interleaved rounds, warm-up excluded.

    The batch sizes are the candidates of :func:`course_lib.core.bench.interleaved_rounds_ns`, so drift on
    the machine spreads over every size alike.

    Parameters
    ----------
    make_call : callable batch_size -> zero-argument callable
        Prepares the input for ``batch_size`` items up front (feeds, DataFrame) and returns a function
        that runs only the model call, so that preparation is not timed.
    batch_sizes : iterable of int >= 1
    n_calls : int
        Timed calls per batch size in each round (>= 1).
    rounds : int
        Rounds over all batch sizes (>= 1); interleaving spreads machine drift over every size.
    warmup_calls : int
        Untimed calls per batch size before the first round.

    Returns
    -------
    DataFrame with one row per batch size: ``batch_size``, ``median_ms``, ``p99_ms`` (nearest rank),
    ``min_ms``, ``n_calls`` (= n_calls x rounds) and ``us_per_item`` (median / batch size).

    Raises
    ------
    ValueError
        For a batch size below 1 or ``n_calls`` / ``rounds`` below 1.
    """
    sizes = integers("batch_sizes", batch_sizes, min=1)
    rounds = integer("rounds", rounds, min=1)
    n_calls = integer("n_calls", n_calls, min=1)
    samples = interleaved_rounds_ns(
        {b: make_call(b) for b in sizes}, n_calls=n_calls, rounds=rounds, warmup_calls=warmup_calls
    )
    rows = []
    for b in sizes:
        ms = samples[b].ravel() / 1e6
        median = float(np.median(ms))
        rows.append(
            {
                "batch_size": b,
                "median_ms": median,
                "p99_ms": percentile(ms, 99),
                "min_ms": float(ms.min()),
                "n_calls": int(ms.size),
                "us_per_item": 1000.0 * median / b,
            }
        )
    return pd.DataFrame(rows)


def forward_call_factory(
    forward: Callable[[list[dict[str, object]]], object], records: Sequence[dict[str, object]]
) -> Callable[[int], Callable[[], object]]:
    """A ``make_call`` for ``measure_call_ms`` that times a model-forward function on request records.

    Parameters
    ----------
    forward : callable list of feature dicts -> probabilities
        E.g. ``course_lib.serving.service.native_forward(pipeline)`` or ``onnx_forward(scorer)``: exactly the
        function a dynamic batcher calls in the server, so the fitted cost model is the batcher's.
    records : sequence of dict, one customer's 19 features each (e.g. ``FeatureStore.get`` results)
        At least as many as the largest batch size measured.

    Returns
    -------
    callable batch_size -> zero-argument callable running ``forward(records[:batch_size])``.
    It raises ``ValueError`` if asked for more records than were given.
    """
    pool = list(records)

    def make_call(batch_size: int) -> Callable[[], object]:
        if batch_size > len(pool):
            raise ValueError(f"batch size {batch_size} needs at least {batch_size} records, got {len(pool)}")
        batch = pool[:batch_size]
        return lambda: forward(batch)

    return make_call
