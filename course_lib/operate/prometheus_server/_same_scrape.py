"""Prometheus's own ``histogram_quantile`` of a rate next to the course's port, on the same stored samples.

:func:`same_scrape_comparison` evaluates ``histogram_quantile(q, sum by (le) (rate(<histogram>_bucket[range])))``
on a running server at a fixed time, reads the bucket samples that expression reads (the range vector
at the same time), and applies the port (:mod:`course_lib.operate.prom_quantile`) to them.

References
----------
Prometheus documentation, "HTTP API" (``/api/v1/query``, range vectors in an instant query) and
"Query functions" (``rate``, ``histogram_quantile``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from course_lib.operate.prom_quantile import extrapolated_rate, histogram_quantile, rate_rules
from course_lib.operate.prometheus_server._server import PrometheusServer


def same_scrape_comparison(
    prom: PrometheusServer,
    histogram: str,
    *,
    q: float,
    range_s: float,
    at_s: float,
    matchers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Prometheus's ``histogram_quantile`` of a rate, and the course's port on the same stored samples.

    Evaluates, at ``at_s``, ``histogram_quantile(q, sum by (le) (rate(<histogram>_bucket{matchers}[range])))``
    on the server, then reads the raw bucket samples of ``<histogram>_bucket{matchers}[range]`` at the same
    ``at_s`` (the range vector that expression reads), computes every bucket's rate with
    :func:`course_lib.operate.prom_quantile.extrapolated_rate` under the server's version's rules
    (:func:`course_lib.operate.prom_quantile.rate_rules`), sums by ``le`` and applies the port's
    :func:`course_lib.operate.prom_quantile.histogram_quantile`.

    Parameters
    ----------
    prom : a running :class:`PrometheusServer`.
    histogram : the histogram's name without ``_bucket``.
    q : float in [0, 1], e.g. 0.95.
    range_s : float > 0, the rate's range (it must hold at least two scrapes).
    at_s : float, the evaluation time in Unix seconds (after the scrapes of interest).
    matchers : label equalities that select the series (e.g. ``{"version": "v1"}``).

    Returns
    -------
    dict with ``promql`` (the expression), ``prometheus`` (its answer, NaN if it returned none), ``port``
    (the course's answer), ``rate_by_le`` (DataFrame ``le``, ``samples``, ``rate_per_s``: the port's
    per-bucket rates and how many stored samples each used), ``rules`` (the rate rules applied) and
    ``version`` (the server's).
    """
    sel = "{" + ",".join(f'{k}="{v}"' for k, v in sorted((matchers or {}).items())) + "}"
    window = f"{max(1, round(range_s * 1000))}ms"
    promql = f"histogram_quantile({q:g}, sum by (le) (rate({histogram}_bucket{sel}[{window}])))"
    answer = prom.instant(promql, at_s)
    theirs = next(iter(answer.values())) if answer else math.nan
    rules = rate_rules(prom.version)
    at_ms = round(at_s * 1000)
    by_le: dict[float, float] = {}
    used: dict[float, int] = {}
    for labels, frame in prom.samples(f"{histogram}_bucket{sel}", range_s, at_s).items():
        le = float(dict(labels)["le"])
        times = ((frame["t_ms"] - at_ms) / 1000.0).tolist()  # relative to the evaluation time: exact in ms
        rate = extrapolated_rate(times, frame["value"].tolist(), 0.0, range_s, **rules)
        if not math.isnan(rate):
            by_le[le] = by_le.get(le, 0.0) + rate
            used[le] = used.get(le, 0) + len(frame)
    ours = histogram_quantile(q, sorted(by_le.items())) if by_le else math.nan
    rates = pd.DataFrame(
        {"le": list(by_le), "samples": [used[le] for le in by_le], "rate_per_s": list(by_le.values())}
    )
    return {
        "promql": promql,
        "prometheus": theirs,
        "port": ours,
        "rate_by_le": rates.sort_values("le").reset_index(drop=True),
        "rules": rules,
        "version": prom.version,
    }
