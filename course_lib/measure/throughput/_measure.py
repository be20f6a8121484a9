"""Requests per second one replica of the churn model serves within a p99 limit, measured, with provenance.

A replica here is one worker making one model call at a time, with its threads pinned (XGBoost
``nthread=1``, ONNX Runtime ``intra_op_num_threads=1``; a GPU replica is one GPU driven by one such
worker). For each batch size the candidates are timed side by side in interleaved rounds (the course
harness, :func:`course_lib.core.bench.interleaved_rounds_ns`), warm-up excluded. Each round gives its own p99
(nearest rank) of the call time; the table keeps the median over all calls, the **median of the
per-round p99s** (``p99_us``) and, for honesty, the p99 of all calls pooled (``p99_pooled_us``).

Why the median of per-round p99s: on a shared machine the scheduler now and then takes the core away
for several milliseconds (another process's time slice). Such a stall lands in whichever call is
running, so a pooled p99 over a few thousand 20 µs calls can be a single 8 ms stall, and the batch size
chosen under a p99 limit is then picked by noise. A stall confined to a minority of the rounds does not
move the median of the per-round p99s; a slow tail that the replica itself produces (garbage
collection, cache misses, a large batch) shows up in most rounds and does. The rule therefore measures
the replica's own tail. It does *not* promise that a replica sharing its cores will meet that p99: that
is what ``p99_pooled_us`` shows, and :func:`rps_at_p99_limit` can be run on either column. From the
table:

* throughput at a batch size = ``batch_size / median call time`` (what a saturated replica sustains);
* a batch size is admissible under a p99 limit if ``wait_factor x p99 call time <= p99_limit_ms``.
  With a dynamic batcher at full load a request can arrive just after a call has started: it waits
  for that call, then rides the next one, so it sees up to two call times (``wait_factor=2``). Queueing
  beyond that is what ``target_utilization < 1`` in :mod:`course_lib.cost` leaves room for;
* requests/s per replica at the limit = the highest throughput among admissible batch sizes.

Only the model call is timed (features already built, as in ``OnnxChurnScorer.run``): parsing, feature
lookup and the HTTP round trip (Lesson 2) come on top, so these numbers are an upper bound on a serving
replica's capacity. A measurement is stored as JSON (schema :data:`SCHEMA`) with the environment that
produced it, and read back with :func:`load_measurement`.

References
----------
ONNX Runtime documentation, "Profiling tools" (``SessionOptions.enable_profiling``: per-node events
carry the execution provider that ran them). XGBoost documentation, "Prediction" (``inplace_predict``,
``device`` parameter).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.bench import calls_per_round, interleaved_rounds_ns, p99_median_of_rounds_us
from course_lib.core.checks import (
    distinct,
    integer,
    integers,
    non_empty,
    number,
    positive_number,
)
from course_lib.core.percentiles import percentile

if TYPE_CHECKING:
    import onnx

SCHEMA = "course_lib.measure.throughput._measure/1"
#: Recorded measurements: ``cpu_throughput.json`` (measured on the course machine) and, once recorded on a
#: machine with a CUDA GPU, ``gpu_throughput.json``.
MEASUREMENTS_DIR = DATA_DIR / "measurements"
_TABLE_COLUMNS = (
    "candidate",
    "batch_size",
    "n_calls",
    "median_us",
    "p99_us",
    "us_per_item",
    "rps_at_full_use",
)


@dataclass(frozen=True)
class Candidate:
    """A way to score a batch: ``make_call(batch_size)`` returns a zero-argument callable doing one call.

    ``max_batch_size`` skips batch sizes that would make the run too long (e.g. 65,536 rows on one CPU
    thread); ``runtime`` and ``device`` label the result (``"onnxruntime"``/``"xgboost"``,
    ``"cpu"``/``"cuda"``).
    """

    name: str
    runtime: str
    device: str
    make_call: Callable[[int], Callable[[], object]]
    max_batch_size: int | None = None


def measure_batch_latency(
    candidates: Sequence[Candidate],
    batch_sizes: Sequence[int],
    *,
    target_s: float = 1.0,
    rounds: int = 9,
    warmup_calls: int = 10,
    min_calls: int = 20,
    max_calls: int = 1000,
) -> pd.DataFrame:
    """Time every candidate at every batch size, side by side in interleaved rounds.

    Parameters
    ----------
    candidates : sequence of Candidate
        Timed together (interleaved round by round) at each batch size, so machine noise hits them alike.
    batch_sizes : sequence of int >= 1
    target_s : float > 0
        Rough timed seconds per candidate and batch size; sets the calls per round from one probe call,
        clipped to ``[min_calls, max_calls]`` (the harness's rule,
        :func:`course_lib.core.bench.calls_per_round`).
    rounds : int >= 1, default 9
        Interleaved rounds; each gives its own p99. An odd count makes the median one round's value.
    warmup_calls : int >= 0
        Untimed calls per candidate before the first round.
    min_calls, max_calls : int >= 1
        Bounds on calls per round. With fewer than 100 calls a round's p99 (nearest rank) is its slowest
        call.

    Returns
    -------
    DataFrame, one row per (candidate, batch size), columns ``candidate``, ``runtime``, ``device``,
    ``batch_size``, ``rounds``, ``n_calls`` (timed calls in all rounds), ``median_us`` (all calls),
    ``p99_us`` (median of the per-round p99s, :func:`p99_median_of_rounds_us`), ``p99_pooled_us``
    (nearest-rank p99 of all calls, stalls included), ``us_per_item`` and ``rps_at_full_use``
    (= batch_size / median call time).

    Raises
    ------
    ValueError
        For no candidates, duplicate names, bad batch sizes or bad counts.
    """
    non_empty("candidates", candidates)
    distinct("candidate names", [c.name for c in candidates])
    sizes = sorted(distinct("batch_sizes", integers("batch_sizes", batch_sizes, min=1)))
    warmup_calls = integer("warmup_calls", warmup_calls, min=0)
    # the harness's call-count rule checks target_s, rounds and the bounds before anything runs
    calls_per_round(0.0, target_s=target_s, rounds=rounds, min_calls=min_calls, max_calls=max_calls)
    rows = []
    for batch in sizes:
        active = [c for c in candidates if c.max_batch_size is None or batch <= c.max_batch_size]
        if not active:
            continue
        samples = interleaved_rounds_ns(
            {c.name: c.make_call(batch) for c in active},
            rounds=rounds,
            warmup_calls=warmup_calls,
            target_s=target_s,
            min_calls=min_calls,
            max_calls=max_calls,
        )
        for cand in active:
            pooled_us = samples[cand.name].ravel() / 1e3
            median_us = float(np.median(pooled_us))
            rows.append(
                {
                    "candidate": cand.name,
                    "runtime": cand.runtime,
                    "device": cand.device,
                    "batch_size": batch,
                    "rounds": rounds,
                    "n_calls": int(pooled_us.size),
                    "median_us": median_us,
                    "p99_us": p99_median_of_rounds_us(samples[cand.name]),
                    "p99_pooled_us": percentile(pooled_us, 99),
                    "us_per_item": median_us / batch,
                    "rps_at_full_use": batch / (median_us / 1e6),
                }
            )
    return pd.DataFrame(rows)


def rps_at_p99_limit(
    table: pd.DataFrame, p99_limit_ms: float, *, wait_factor: float = 2.0, p99_column: str = "p99_us"
) -> pd.DataFrame:
    """Best requests/s per replica for each candidate among batch sizes that keep p99 within the limit.

    Parameters
    ----------
    table : DataFrame
        From :func:`measure_batch_latency` (needs ``candidate``, ``batch_size``, ``p99_us``,
        ``rps_at_full_use``).
    p99_limit_ms : float > 0
        Latency limit for the model stage, milliseconds.
    wait_factor : float >= 1, default 2
        Multiplies the p99 call time to bound a request's latency (wait for the call in flight, then
        its own call).
    p99_column : str, default "p99_us"
        Which p99 to hold to the limit: ``"p99_us"`` (median of per-round p99s, the replica's own tail)
        or ``"p99_pooled_us"`` (all calls pooled, stalls from other processes included).

    Returns
    -------
    DataFrame indexed by candidate: ``batch_size``, ``p99_call_ms``, ``p99_bound_ms``
    (= wait_factor x p99_call_ms), ``rps`` and ``rps_batch_1`` (throughput without batching). A candidate
    with no admissible batch size gets NaN in ``rps`` and ``batch_size``.

    Raises
    ------
    ValueError
        For a non-positive limit, ``wait_factor`` < 1, or a table missing a column.
    """
    p99_limit_ms = positive_number("p99_limit_ms", p99_limit_ms)
    wait_factor = number("wait_factor", wait_factor, min=1)
    missing = {"candidate", "batch_size", p99_column, "rps_at_full_use"} - set(table.columns)
    if missing:
        raise ValueError(f"table is missing columns {sorted(missing)}; build it with measure_batch_latency")
    rows = {}
    for name, part in table.groupby("candidate", sort=False):
        bound_ms = wait_factor * part[p99_column] / 1e3
        ok = part[bound_ms <= p99_limit_ms]
        single = part.loc[part["batch_size"] == 1, "rps_at_full_use"]
        best = ok.iloc[ok["rps_at_full_use"].argmax()] if len(ok) else None
        rows[name] = {
            "batch_size": float(best["batch_size"]) if best is not None else math.nan,
            "p99_call_ms": float(best[p99_column]) / 1e3 if best is not None else math.nan,
            "p99_bound_ms": wait_factor * float(best[p99_column]) / 1e3 if best is not None else math.nan,
            "rps": float(best["rps_at_full_use"]) if best is not None else math.nan,
            "rps_batch_1": float(single.iloc[0]) if len(single) else math.nan,
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "candidate"
    return out


def onnx_node_placement(
    model: onnx.ModelProto | bytes, providers: Sequence[str], feeds: dict[str, np.ndarray]
) -> dict[str, int]:
    """How many graph nodes each execution provider ran, from one profiled ``InferenceSession.run``.

    ONNX Runtime silently runs a node on the CPU when the preferred provider has no kernel for it
    (the ``ai.onnx.ml`` tree and one-hot operators have none on CUDA), so "CUDAExecutionProvider" in
    the provider list does not mean the model ran on the GPU. The profile says what did.

    Parameters
    ----------
    model : onnx.ModelProto or bytes
    providers : sequence of str, in priority order.
    feeds : dict of input name -> array, one batch.

    Returns
    -------
    dict of provider -> number of node executions in the profiled run.
    """
    source = model if isinstance(model, bytes) else model.SerializeToString()
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "placement")
        session = ort.InferenceSession(source, sess_options=opts, providers=list(providers))
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    counts: dict[str, int] = {}
    for event in events:
        provider = event.get("args", {}).get("provider") if event.get("cat") == "Node" else None
        if provider and str(event.get("name", "")).endswith("_kernel_time"):
            counts[provider] = counts.get(provider, 0) + 1
    return counts


@dataclass
class ThroughputRecord:
    """A stored measurement: the timing table, the p99-limit summary and the environment behind them."""

    device: str
    created_utc: str
    command: str
    environment: dict[str, object]
    settings: dict[str, object]
    results: pd.DataFrame
    at_p99_limit: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The record as indented JSON (schema :data:`SCHEMA`)."""
        payload = {
            "schema": SCHEMA,
            "device": self.device,
            "created_utc": self.created_utc,
            "command": self.command,
            "environment": self.environment,
            "settings": self.settings,
            "results": self.results.to_dict(orient="records"),
            "at_p99_limit": self.at_p99_limit.reset_index().to_dict(orient="records"),
            "notes": self.notes,
            "not_measured": self.not_measured,
        }
        return json.dumps(payload, indent=1, default=_json_default, allow_nan=True) + "\n"

    def provenance(self) -> str:
        """Short text: where, when, on what hardware and software this was measured."""
        env = self.environment
        lines = [
            f"measured      {self.created_utc} with: {self.command}",
            f"device        {self.device}",
            f"cpu           {env.get('cpu', '?')} ({env.get('usable_cores', '?')} usable cores)",
        ]
        gpu = env.get("gpu")
        if isinstance(gpu, dict):
            lines.append(
                f"gpu           {gpu.get('name', '?')}, driver {gpu.get('driver_version', '?')}, "
                f"{gpu.get('memory_total', '?')}"
            )
        packages = env.get("packages", {})
        if isinstance(packages, dict):
            lines.append("libraries     " + ", ".join(f"{k} {v}" for k, v in packages.items()))
        runtimes = env.get("runtime_versions")
        if isinstance(runtimes, dict):
            lines.append("runtimes      " + ", ".join(f"{k} {v}" for k, v in runtimes.items()))
        lines.append(
            f"settings      p99 limit {self.settings.get('p99_limit_ms')} ms, wait factor "
            f"{self.settings.get('wait_factor')}, threads {self.settings.get('threads')}"
        )
        lines += [f"not measured  {k}: {v}" for k, v in self.not_measured.items()]
        lines += [f"note          {n}" for n in self.notes]
        return "\n".join(lines)


def _json_default(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"cannot store {type(value).__name__} in a throughput record")


def load_measurement(path: str | Path) -> ThroughputRecord:
    """Read a stored measurement and check its schema.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a ``course_lib.measure.throughput._measure/1`` record or lacks a field or column.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no throughput measurement at {file}")
    payload = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(payload, dict) or payload.get("schema") != SCHEMA:
        found = payload.get("schema") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{file} is not a {SCHEMA} record (schema: {found!r})")
    needed = ("device", "created_utc", "command", "environment", "settings", "results", "at_p99_limit")
    missing = [k for k in needed if k not in payload]
    if missing:
        raise ValueError(f"{file} lacks the fields {missing}")
    results = pd.DataFrame(payload["results"])
    absent = set(_TABLE_COLUMNS) - set(results.columns)
    if absent:
        raise ValueError(f"{file}: results lack the columns {sorted(absent)}")
    at_limit = pd.DataFrame(payload["at_p99_limit"]).set_index("candidate")
    return ThroughputRecord(
        device=payload["device"],
        created_utc=payload["created_utc"],
        command=payload["command"],
        environment=payload["environment"],
        settings=payload["settings"],
        results=results,
        at_p99_limit=at_limit,
        notes=list(payload.get("notes", [])),
        not_measured=dict(payload.get("not_measured", {})),
    )
