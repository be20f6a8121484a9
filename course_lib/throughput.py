"""Requests per second one replica of the churn model serves within a p99 limit, measured, with provenance.

A replica here is one worker making one model call at a time, with its threads pinned (XGBoost
``nthread=1``, ONNX Runtime ``intra_op_num_threads=1``; a GPU replica is one GPU driven by one such
worker). For each batch size the candidates are timed side by side in interleaved rounds (the course
harness's :func:`course_lib.bench.time_calls_ns`), warm-up excluded. Each round gives its own p99
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

import numpy as np
import pandas as pd

from course_lib.bench import compare_latency, time_calls_ns
from course_lib.data import DATA_DIR
from course_lib.percentiles import percentile

__all__ = [
    "MEASUREMENTS_DIR",
    "SCHEMA",
    "Candidate",
    "ThroughputRecord",
    "churn_candidates",
    "load_measurement",
    "measure_batch_latency",
    "onnx_node_placement",
    "p99_median_of_rounds_us",
    "rps_at_p99_limit",
]

SCHEMA = "course_lib.throughput/1"
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
    thread); ``runtime`` and ``device`` label the result (``"onnxruntime"``/``"xgboost"``, ``"cpu"``/``"cuda"``).
    """

    name: str
    runtime: str
    device: str
    make_call: Callable[[int], Callable[[], object]]
    max_batch_size: int | None = None


def churn_candidates(
    churn_model: object,
    onnx_model: object,
    *,
    runtimes: Sequence[str] = ("onnxruntime", "xgboost"),
    device: str = "cpu",
    n_rows: int = 4096,
    max_batch_size: int | None = None,
    seed: int = 0,
) -> list[Candidate]:
    """Candidates that score synthetic customers with the course model, one per runtime, on one device.

    Parameters
    ----------
    churn_model : course_lib.model.ChurnModel
    onnx_model : onnx.ModelProto
        ``pipeline_to_onnx(churn_model.pipeline)``.
    runtimes : subset of {"onnxruntime", "xgboost"}
        ``onnxruntime``: the whole pipeline as one ONNX graph (one-hot + trees) fed prepared arrays,
        as ``OnnxChurnScorer.run``. ``xgboost``: the booster's ``inplace_predict`` on the already
        one-hot-encoded float32 matrix (preprocessing excluded). Both with one thread.
    device : {"cpu", "cuda"}
        ``cuda`` uses ONNX Runtime's CUDAExecutionProvider (CPU as fallback for nodes it lacks) and
        XGBoost ``device="cuda"``. Inputs stay in host memory, as a request's would, so each call
        includes the copy to the GPU.
    n_rows : int >= 1
        Synthetic customers (``make_customers(n_rows, seed)``); the largest batch that can be timed.
    max_batch_size : int, optional
        Skip larger batch sizes for these candidates.

    Returns
    -------
    list of Candidate named ``"<runtime>/<device>"``.

    Raises
    ------
    ValueError
        For an unknown runtime or device.
    RuntimeError
        If ``device="cuda"`` and this XGBoost was built without CUDA, or ONNX Runtime did not put the
        CUDA provider in the session (``onnxruntime`` instead of ``onnxruntime-gpu``, or CUDA libraries
        missing).
    """
    from course_lib.data import make_customers
    from course_lib.export import OnnxChurnScorer, make_session
    from course_lib.model import features

    unknown = set(runtimes) - {"onnxruntime", "xgboost"}
    if unknown or not runtimes:
        raise ValueError(
            f"runtimes must be a non-empty subset of ['onnxruntime', 'xgboost'], got {runtimes!r}"
        )
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    customers = features(make_customers(n_rows, seed=seed))
    out: list[Candidate] = []
    if "onnxruntime" in runtimes:
        providers = (
            ("CUDAExecutionProvider", "CPUExecutionProvider")
            if device == "cuda"
            else ("CPUExecutionProvider",)
        )
        session = make_session(onnx_model, providers=providers)
        if session.get_providers()[0] != providers[0]:
            raise RuntimeError(
                f"ONNX Runtime did not enable {providers[0]} (session providers: {session.get_providers()}); "
                "install onnxruntime-gpu and the CUDA/cuDNN libraries it needs"
            )
        scorer = OnnxChurnScorer(session)
        feeds = scorer.feeds(customers)

        def onnx_call(batch: int, scorer: OnnxChurnScorer = scorer) -> Callable[[], object]:
            part = {name: values[:batch] for name, values in feeds.items()}
            return lambda: scorer.run(part)

        out.append(Candidate(f"onnxruntime/{device}", "onnxruntime", device, onnx_call, max_batch_size))
    if "xgboost" in runtimes:
        import xgboost

        if device == "cuda" and not xgboost.build_info().get("USE_CUDA", False):
            raise RuntimeError(
                f"xgboost {xgboost.__version__} was built without CUDA; install a CUDA build "
                "(xgboost or xgboost-cu13 from PyPI, not xgboost-cpu)"
            )
        pipeline = churn_model.pipeline
        matrix = np.ascontiguousarray(
            pipeline.named_steps["preprocess"].transform(customers), dtype=np.float32
        )
        booster = pipeline.named_steps["xgb"].get_booster().copy()
        booster.set_param({"nthread": 1, "device": device})

        def xgb_call(batch: int, booster: object = booster) -> Callable[[], object]:
            part = matrix[:batch]
            return lambda: booster.inplace_predict(part)

        out.append(Candidate(f"xgboost/{device}", "xgboost", device, xgb_call, max_batch_size))
    return out


def _check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    sizes = list(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of integers >= 1, got {batch_sizes!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"batch_sizes must not repeat, got {batch_sizes!r}")
    return sorted(int(b) for b in sizes)


def p99_median_of_rounds_us(rounds_ns: Sequence[np.ndarray]) -> float:
    """Median over rounds of each round's p99 (nearest rank) call time, in microseconds.

    Parameters
    ----------
    rounds_ns : sequence of 1-D arrays of call times in nanoseconds, one array per round (>= 1 call each).

    Returns
    -------
    float, microseconds. With an odd number of rounds it is one round's p99; with an even number, the
    mean of the two middle ones (``numpy.median``).

    Raises
    ------
    ValueError
        If there are no rounds or a round is empty.

    References
    ----------
    Nearest-rank percentile: :func:`course_lib.percentiles.percentile`. The median-of-rounds rule is the
    course's choice for a shared machine; see the module docstring.
    """
    if len(rounds_ns) == 0 or any(len(r) == 0 for r in rounds_ns):
        raise ValueError(
            f"rounds_ns must hold at least one non-empty round, got sizes {[len(r) for r in rounds_ns]}"
        )
    return float(np.median([percentile(np.asarray(r) / 1e3, 99) for r in rounds_ns]))


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
        clipped to ``[min_calls, max_calls]``.
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
    if not candidates:
        raise ValueError("candidates must hold at least one Candidate")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidate names must be unique, got {names}")
    sizes = _check_batch_sizes(batch_sizes)
    if not target_s > 0:
        raise ValueError(f"target_s must be > 0 seconds, got {target_s!r}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not (isinstance(warmup_calls, int) and warmup_calls >= 0):
        raise ValueError(f"warmup_calls must be an integer >= 0, got {warmup_calls!r}")
    if not 1 <= min_calls <= max_calls:
        raise ValueError(f"need 1 <= min_calls <= max_calls, got {min_calls} and {max_calls}")
    rows = []
    for batch in sizes:
        active = [c for c in candidates if c.max_batch_size is None or batch <= c.max_batch_size]
        if not active:
            continue
        calls = {c.name: c.make_call(batch) for c in active}
        slowest_s = 0.0
        for fn in calls.values():  # one probe each (also a first warm-up) to size the run
            probe = compare_latency({"probe": fn}, n_calls=1, rounds=1, warmup_calls=1)
            slowest_s = max(slowest_s, float(probe["median_us"].iloc[0]) / 1e6)
        n_calls = int(np.clip(target_s / (rounds * max(slowest_s, 1e-7)), min_calls, max_calls))
        for fn in calls.values():
            time_calls_ns(fn, 1, warmup_calls=warmup_calls)
        samples: dict[str, list[np.ndarray]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                samples[name].append(time_calls_ns(fn, n_calls))
        for cand in active:
            pooled_us = np.concatenate(samples[cand.name]) / 1e3
            median_us = float(np.median(pooled_us))
            rows.append(
                {
                    "candidate": cand.name,
                    "runtime": cand.runtime,
                    "device": cand.device,
                    "batch_size": batch,
                    "rounds": rounds,
                    "n_calls": n_calls * rounds,
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
    if not (isinstance(p99_limit_ms, (int, float)) and math.isfinite(p99_limit_ms) and p99_limit_ms > 0):
        raise ValueError(f"p99_limit_ms must be a finite number of milliseconds > 0, got {p99_limit_ms!r}")
    if not wait_factor >= 1:
        raise ValueError(f"wait_factor must be >= 1, got {wait_factor!r}")
    missing = {"candidate", "batch_size", p99_column, "rps_at_full_use"} - set(table.columns)
    if missing:
        raise ValueError(f"table is missing columns {sorted(missing)}; build it with measure_batch_latency")
    rows = {}
    for name, part in table.groupby("candidate", sort=False):
        bound_ms = wait_factor * part[p99_column] / 1e3
        ok = part[bound_ms <= p99_limit_ms]
        single = part.loc[part["batch_size"] == 1, "rps_at_full_use"]
        best = ok.loc[ok["rps_at_full_use"].idxmax()] if len(ok) else None
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
    model: object, providers: Sequence[str], feeds: dict[str, np.ndarray]
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
    import onnxruntime as ort

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
        If the file is not a ``course_lib.throughput/1`` record or lacks a field or column.
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
