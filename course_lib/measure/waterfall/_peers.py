"""Serving peers: the same churn work behind BentoML, LitServe and granian, and the record of their knees.

``benchmarks/serving_peers.py`` starts each peer with the Python of a separate virtual environment
(``.venv-peers``, from ``benchmarks/requirements-peers.txt``: the peers are benchmark-only and would
change the course's pins), with this repository on ``PYTHONPATH`` so that every peer runs the same
``ProductionService`` work (the request schema, the cached lookup, the feature check, the same ONNX
Runtime session); :data:`PEERS` says how each is started and probed. The production server runs
beside them from the course's own environment. One ladder is climbed with them taking turns
(``course_lib.measure.ladder.climb``), and each knee is compared with the
production service's with the interval the ladder and the repeats allow. :func:`save_peers` writes
the record with every peer's version (or why it could not be installed); Lesson 12 reads it with
:func:`load_peers`.

References
----------
BentoML, LitServe and granian documentation (see ``benchmarks/peers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from course_lib.churn.data import DATA_DIR
from course_lib.core.affinity import pinned_text
from course_lib.core.files import course_workspace
from course_lib.core.guard import guard_command
from course_lib.measure.capacity_record import read_measurement, write_measurement
from course_lib.measure.waterfall._record import table_from_rows, table_rows

RECORDED_PEERS = DATA_DIR / "measurements" / "serving_peers.json"
#: The course checkout the peers run in (at or above the current working directory): BentoML's working
#: directory, and where ``make peers`` makes their virtual environment.
_CHECKOUT = course_workspace()
#: The peers' virtual environment (ignored by git): ``.venv-peers`` of that checkout
#: (``benchmarks/serving_peers.py --python`` takes another).
PEERS_VENV = _CHECKOUT / ".venv-peers"
_SCHEMA = "inference-workbook/serving-peers/1"


@dataclass(frozen=True)
class PeerSpec:
    """How a peer is started (``argv`` after the peers' Python; ``--port=N`` is appended) and probed."""

    name: str
    package: str
    argv: tuple[str, ...]
    path: str
    ready_path: str


#: The peers, each serving ``POST /score`` with ``{"customer_id": ...}``.
PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        "BentoML", "bentoml",
        ("-m", "bentoml", "serve", "benchmarks.peers.bento_service:Churn", "--host", "127.0.0.1",
         "--working-dir", str(_CHECKOUT)),
        "/score", "/readyz",
    ),
    PeerSpec("LitServe", "litserve", ("-m", "benchmarks.peers.litserve_server"), "/score", "/healthz"),
    PeerSpec(
        "FastAPI app under granian", "granian",
        ("-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--loop", "uvloop", "--http", "1",
         "--factory", "benchmarks.peers.granian_app:create"),
        "/score", "/healthz",
    ),
)  # fmt: skip


def peer_command(spec: PeerSpec, python: str | Path, *, workers: int) -> list[str]:
    """The command that starts ``spec`` with ``python`` and ``workers`` worker processes (no port yet).

    The peer runs under the course's process guard (``course_lib.core.guard``, in this Python) in a
    process group of its own, and the guard stops the whole group (SIGTERM, then SIGKILL after 10 s)
    when it is stopped itself (``run_processes`` sends SIGTERM) or when the process that started it
    dies: a peer's workers (LitServe's inference processes, BentoML's and granian's workers) do not all
    exit with their main process, so stopping the main process alone can leave them running.
    """
    argv = [str(python), *spec.argv]
    if spec.package == "granian":
        argv += ["--workers", str(int(workers))]
    return guard_command(argv, group=True, stop_timeout_s=10.0)


@dataclass(frozen=True)
class PeersRecord:
    """A recorded peers run: ``configs`` (one row per server: knees per repeat, median, ratio to the
    production service with its interval and verdict), ``versions``, the other fields in ``meta``."""

    configs: pd.DataFrame
    meta: dict
    path: Path

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.meta.get("versions", {}))

    def provenance(self) -> str:
        m = self.meta
        return (
            f"benchmarks/serving_peers.py, {m['measured_at']} on {m['cpu']} ({m['usable_cores']} usable cores), "
            f"{m['repeats']} repeats, >= {m['min_requests']:,} requests per rung, p99 limit {m['p99_limit_ms']:g} ms, "
            f"{m['workers']} workers each{pinned_text(m.get('pinned'))}; file {self.path.name}"
        )


def save_peers(configs: pd.DataFrame, path: str | Path = RECORDED_PEERS, **fields: Any) -> Path:
    """Write a peers table (index: server name) and ``fields`` (``versions``, ``unavailable``, ...) as JSON."""
    return write_measurement(path, _SCHEMA, **fields, configs=table_rows(configs))


def load_peers(path: str | Path = RECORDED_PEERS) -> PeersRecord:
    """Read a file written by :func:`save_peers`.

    Raises
    ------
    FileNotFoundError
        If there is no file (run ``python benchmarks/serving_peers.py --out FILE``).
    ValueError
        If the file is not a serving-peers record.
    """
    file = Path(path)
    payload = read_measurement(
        file,
        _SCHEMA,
        what="a serving-peers record",
        how_to_make="run python benchmarks/serving_peers.py --out FILE",
    )
    configs = table_from_rows(payload["configs"], ("ratio_to_base", "ratio_low", "ratio_high"))
    return PeersRecord(configs, {k: v for k, v in payload.items() if k != "configs"}, file)
