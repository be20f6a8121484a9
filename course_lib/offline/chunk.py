"""One chunk of the batch job, start to finish: read, check, encode, score, write, each stage timed.

One concept: the unit of work every way of running the job shares. :func:`score_chunk` is called by
the single-process job, by its worker processes (:mod:`course_lib.offline.workers`) and by Dask tasks
(:mod:`course_lib.offline.dask_job`), so all three write the same files for the same chunk, bit for bit:

1. **read** chunk ``i`` of the store (:func:`course_lib.offline.store.read_chunk`, Arrow dictionaries);
2. **check** every row against the schema (:func:`course_lib.offline.rows.check_rows`);
3. **encode** the valid rows into the model's float32 matrix (:func:`course_lib.offline.rows.encode_rows`);
4. **model**: one call of the process's scorer on the whole matrix (built once per process and spec,
   :func:`scorer_for`);
5. **write** ``rejects-NNNNN.parquet`` and then ``part-NNNNN.parquet`` with pyarrow, each under a
   temporary name renamed when complete, so a part file's presence means its chunk is done.

References
----------
pyarrow documentation, ``pyarrow.parquet.write_table`` (``use_dictionary``); POSIX ``rename(2)``
(atomic replacement within one file system).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from course_lib.churn.data import ID_COLUMN
from course_lib.core.files import atomic_path
from course_lib.offline.rows import check_rows, encode_rows
from course_lib.offline.scorers import ScorerSpec
from course_lib.offline.store import ChunkPlan, read_chunk

__all__ = [
    "OUT_SCHEMA",
    "REJECT_SCHEMA",
    "STAGES",
    "ChunkResult",
    "ChunkTask",
    "peak_rss_mib",
    "reset_peak_rss",
    "score_chunk",
    "scorer_for",
    "write_atomic",
]

#: The stages of a chunk, in order; each result times all five.
STAGES = ("read", "check", "encode", "model", "write")
OUT_SCHEMA = pa.schema(
    [
        (ID_COLUMN, pa.string()),
        ("churn_probability", pa.float64()),
        ("model_version", pa.string()),
        ("scored_at", pa.timestamp("us", tz="UTC")),
    ]
)
REJECT_SCHEMA = pa.schema([(ID_COLUMN, pa.string()), ("reason", pa.string())])
_SCORERS: dict[tuple[str, str, int], Callable[[np.ndarray], np.ndarray]] = {}  # per process
_INPUT: list[np.ndarray] = []  # per process: the model-input buffer every chunk reuses


@dataclass(frozen=True)
class ChunkTask:
    """What one chunk needs, small enough to send to another process.

    ``scored_at_us`` is the job's timestamp in microseconds since the Unix epoch (UTC), the same for
    every chunk of a job, resumed chunks included.
    """

    plan: ChunkPlan
    index: int
    out_dir: str
    spec: ScorerSpec = field(repr=False)
    scored_at_us: int

    def part_path(self) -> Path:
        return Path(self.out_dir) / f"part-{self.index:05d}.parquet"

    def rejects_path(self) -> Path:
        return Path(self.out_dir) / f"rejects-{self.index:05d}.parquet"


@dataclass(frozen=True)
class ChunkResult:
    """What scoring one chunk did: rows, stage seconds, and the process that did it."""

    index: int
    rows: int
    scored: int
    rejected: int
    stage_s: dict[str, float]
    pid: int
    scorers_built: int  # scorers this process holds (1 per spec: the scorer is reused across chunks)
    peak_rss_mib: float


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB.

    Linux: ``VmHWM`` of ``/proc/self/status``, the peak of this program's own address space
    (``getrusage``'s ``ru_maxrss`` is carried over from the parent across ``fork`` and ``exec``, so a
    small worker would report its big parent's peak). Elsewhere ``ru_maxrss`` (bytes on macOS).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory to its current value; True where that worked.

    Linux 4.0 and later: write ``5`` to ``/proc/self/clear_refs`` (proc(5), "Reset the peak resident
    set size"), so that :func:`peak_rss_mib` then reports the peak since this call, not the process's
    lifetime peak (a notebook kernel's includes everything the lesson built before). False elsewhere,
    or where the file is not writable: the peak then stays the lifetime one.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def scorer_for(spec: ScorerSpec) -> Callable[[np.ndarray], np.ndarray]:
    """This process's scorer for ``spec``: built by the first chunk, reused by every later one."""
    scorer = _SCORERS.get(spec.key)
    if scorer is None:
        scorer = _SCORERS[spec.key] = spec.build()
    return scorer


def _input_buffer(rows: int, width: int) -> np.ndarray:
    if not _INPUT or len(_INPUT[0]) < rows or _INPUT[0].shape[1] != width:
        _INPUT[:] = [np.empty((rows, width), dtype=np.float32)]
    return _INPUT[0]


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` as Parquet to ``path`` so that a reader sees no file or the whole file.

    Written through ``course_lib.core.files.atomic_path``: the temporary name starts with a dot and ends
    with ``.tmp`` (a job removes leftovers of a killed run when it starts). Constant columns are
    dictionary-encoded, the unique ids are not.
    """
    constant = [c for c in ("model_version", "scored_at") if c in table.column_names]
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, use_dictionary=constant or False)


def _tables(task: ChunkTask, checked, p: np.ndarray) -> tuple[pa.Table, pa.Table]:
    n = len(p)
    ids = checked.ids if checked.n_valid == len(checked.ok) else checked.ids.filter(pa.array(checked.ok))
    stamp = np.full(n, task.scored_at_us, dtype=np.int64)
    scores = pa.Table.from_arrays(
        [
            ids,
            pa.array(p, type=pa.float64()),
            pa.repeat(pa.scalar(task.spec.model_version, pa.string()), n),
            pa.array(stamp, type=pa.timestamp("us", tz="UTC")),
        ],
        schema=OUT_SCHEMA,
    )
    rejects = pa.Table.from_arrays(
        [
            checked.ids.take(pa.array(checked.bad_rows, type=pa.int64())),
            pa.array(checked.reasons, pa.string()),
        ],
        schema=REJECT_SCHEMA,
    )
    return scores, rejects


def score_chunk(task: ChunkTask) -> ChunkResult:
    """Read, check, encode, score and write chunk ``task.index``; return its counts and stage times.

    Every row of the chunk ends in exactly one of the two files. The rejects are renamed into place
    before the part, so an existing part means both files are complete.
    """
    clock = [time.perf_counter()]
    table = read_chunk(task.plan, task.index)
    clock.append(time.perf_counter())
    checked = check_rows(table)
    clock.append(time.perf_counter())
    X = encode_rows(checked, task.spec.encoding, out=_input_buffer(checked.n_valid, task.spec.encoding.width))
    clock.append(time.perf_counter())
    p = scorer_for(task.spec)(X) if len(X) else np.empty(0)
    clock.append(time.perf_counter())
    scores, rejects = _tables(task, checked, p)
    write_atomic(rejects, task.rejects_path())
    write_atomic(scores, task.part_path())
    clock.append(time.perf_counter())
    stage_s = {stage: clock[k + 1] - clock[k] for k, stage in enumerate(STAGES)}
    return ChunkResult(
        task.index, table.num_rows, scores.num_rows, rejects.num_rows, stage_s, os.getpid(), len(_SCORERS),
        peak_rss_mib(),
    )  # fmt: skip
