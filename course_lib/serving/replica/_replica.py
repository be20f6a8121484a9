"""A replica of the production churn service in its own process: injected stalls, warm-up, a readiness probe.

``python -m course_lib.serving.replica --port N --onnx M.onnx --store S.sqlite --model-version V [options]`` serves
the production churn app (``course_lib.serving.production.create_production_app`` with
``PRODUCTION``'s levers and one worker: the prepared ONNX Runtime session, the model call where
``forward="auto"`` puts it, the cached lookup, one orjson encode, httptools + uvloop) over this
replica's own model file and feature store, on 127.0.0.1:N (a port its starter chose, as for every
course server: ``course_lib.serving.server._runners`` documents the one start-up and readiness
path), wrapped in ``ReplicaMiddleware`` which adds:

* ``GET /readyz``: 503 until the warm-up finished, then 200 (``/healthz`` from the service app is the
  liveness probe: it answers as soon as the process listens, warm or not);
* ``GET /stats``: the app's ``/stats`` (where the forward runs, the levers) and the replica's counters
  (requests, injected stalls, stalls abandoned because the client left) and stall settings;
* seeded stalls on ``POST /score``: a ``--slow-fraction`` of requests wait ``--slow-ms`` extra. The
  choice is a hash of ``(seed, x-request-id)``, so the same requests stall in every run; a stalled
  request whose client disconnects (a hedging client cancelled it) is abandoned and counted;
  ``PUT /faults`` changes the stall settings while the replica runs (``ReplicaProcess.set_faults``);
* warm-up: ``--warmup-requests`` real requests to itself before ``/readyz`` says ready, then an
  optional ``gc.freeze()``; ``--lazy-load`` builds the app (model session, feature store, the
  forward's cost probe) on the first request instead of before listening, a common pattern whose
  price the first user pays (Lesson 7's cold start).

It runs on the course's one server runtime (``course_lib.serving.server.serve_app``: the door, header and
body timeouts, connection, in-flight and body-size limits; every ``ServerConfig`` flag is accepted,
with the production parser and loop as defaults), has a bounded lifetime (``--lifetime-s``) and exits
within a fraction of a second of its parent's death. ``start_replica`` (parent side) starts one and
returns a handle; its log is an anonymous file (``ReplicaProcess.log_tail``), so nothing is left on
disk whatever happens to either process. The middleware (readiness, counters, seeded stalls) is
:mod:`course_lib.serving.replica._middleware`; its names are re-exported here.

References
----------
Kubernetes documentation, "Configure Liveness, Readiness and Startup Probes".
Dean, J. and Barroso, L. A. (2013), "The Tail at Scale", CACM 56(2): 74-80.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from course_lib.core.checks import InvalidArgumentError, positive_number
from course_lib.core.process import ChildProcess
from course_lib.serving.production import PRODUCTION
from course_lib.serving.replica._middleware import (
    FAULT_FIELDS,
    ReplicaConfig,
    ReplicaMiddleware,
    ReplicaState,
)
from course_lib.serving.server import (
    LOOPBACK_HOST,
    ServerConfig,
    add_arguments,
    from_arguments,
    port_number,
    serve_app,
    start_server,
    to_argv,
)

_NO_STALLS = ReplicaConfig()  # frozen: safe as a default argument
#: The runtime's limits a replica runs with unless told otherwise: the production service's
#: (``PRODUCTION.server``: ``DEFAULTS`` with httptools + uvloop).
REPLICA_SERVER = PRODUCTION.server


def _warm_up(url: str, ids: list[str], state: ReplicaState) -> None:
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for customer in ids:
            client.post("/score", json={"customer_id": customer}, headers={"x-warmup": "1"})
            state.warmup_done += 1
    if state.config.gc_freeze:
        gc.collect()
        gc.freeze()
    state.ready = True


class _LazyApp:
    """An ASGI app built by its first HTTP request (``--lazy-load``); ``/healthz`` answers before that."""

    def __init__(self, build: Callable[[], Any]):
        self._build = build
        self._app: Any = None

    @property
    def loaded(self) -> bool:
        """Whether the first request has built the app."""
        return self._app is not None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # nothing to start before the app exists
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        if self._app is None and scope["type"] == "http" and scope["path"] == "/healthz":
            body = b'{"status":"ok","loaded":false}'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return await send({"type": "http.response.body", "body": body})
        if self._app is None:
            self._app = self._build()  # on the event loop, on purpose: the first request waits for it
        return await self._app(scope, receive, send)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.serving.replica", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=port_number, required=True, help="port on 127.0.0.1")
    parser.add_argument("--onnx", required=True, help="path of the exported churn model (.onnx)")
    parser.add_argument("--store", required=True, help="path of the feature store (.sqlite)")
    parser.add_argument("--model-version", required=True)
    parser.add_argument(
        "--slow-fraction", type=float, default=0.0, help="fraction of /score requests to stall"
    )
    parser.add_argument("--slow-ms", type=float, default=50.0, help="extra ms of a stalled request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stall choice")
    parser.add_argument("--warmup-requests", type=int, default=0, help="requests to itself before ready")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the warm-up")
    parser.add_argument("--lazy-load", action="store_true", help="build the app on the first request")
    add_arguments(parser, REPLICA_SERVER)  # the runtime's limits, --lifetime-s among them
    return parser.parse_args(argv)


def _production_app(args: argparse.Namespace, store: Any, server: ServerConfig) -> Any:
    """The production churn app (one worker) over this replica's model file and feature store."""
    # function-level imports: the model stack loads in the replica process only
    from course_lib.churn.export import OnnxChurnScorer, make_session  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.serving.feature_store import make_lookup  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.serving.production import ProductionService, create_production_app  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.serving.service import onnx_forward  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)

    config = PRODUCTION.replace(workers=1, server=server)
    scorer = OnnxChurnScorer(make_session(args.onnx))
    scorer.check_model_version(args.model_version)
    service = ProductionService(
        make_lookup(store, "cached"),
        onnx_forward(scorer),
        model_version=args.model_version,
        lookup_mode="cached",
        runtime=config.runtime,
        encoder=config.encoder,
    )
    return create_production_app(config, service=service, body_timeout_s=server.body_timeout_s)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of a replica process (see the module docstring for the options)."""
    from course_lib.serving.feature_store import FeatureStore  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)

    args = _parse_args(argv)
    config = ReplicaConfig(args.slow_fraction, args.slow_ms, args.seed, args.warmup_requests, args.gc_freeze)
    server_config = from_arguments(args)
    store = FeatureStore(args.store)
    state = ReplicaState(config=config, ready=config.warmup_requests == 0)

    def build() -> Any:
        return _production_app(args, store, server_config)

    app = ReplicaMiddleware(_LazyApp(build) if args.lazy_load else build(), state=state)

    def started() -> None:  # it listens now: warm up through the front door
        if config.warmup_requests:
            ids = store.sample_ids(config.warmup_requests, seed=config.seed + 1)
            _warm_up(f"http://{LOOPBACK_HOST}:{args.port}", ids, state)

    serve_app(app, port=args.port, config=server_config, on_started=started)


@dataclass
class ReplicaProcess:
    """A replica started by ``start_replica``: its URL and its process (with an anonymous log)."""

    url: str
    child: ChildProcess
    started_at: float

    @property
    def process(self) -> subprocess.Popen:
        """The replica's ``subprocess.Popen``."""
        return self.child.popen

    def log_tail(self, n_bytes: int = 2000) -> str:
        """The end of the replica's log (its stderr); "" once it has been stopped."""
        return self.child.tail(n_bytes)

    def stats(self) -> dict[str, Any]:
        """The replica's ``/stats`` counters."""
        return httpx.get(f"{self.url}/stats", timeout=5.0).json()

    def set_faults(self, **faults: float) -> dict[str, float]:
        """Change the replica's stall settings now (``PUT /faults``); returns the settings in force.

        Parameters
        ----------
        **faults
            Any of ``FAULT_FIELDS``: ``slow_fraction`` (0 to 1), ``slow_ms`` (>= 0), ``seed``.

        Raises
        ------
        course_lib.core.checks.InvalidArgumentError
            For a name outside ``FAULT_FIELDS`` or a value the replica refused (its reason quoted).
        """
        unknown = sorted(set(faults) - set(FAULT_FIELDS))
        if unknown:
            raise InvalidArgumentError(f"faults must be among {list(FAULT_FIELDS)}, got {unknown}")
        response = httpx.put(f"{self.url}/faults", json=faults, timeout=5.0)
        if response.status_code != 200:
            raise InvalidArgumentError(f"the replica refused {faults}: {response.json().get('error')}")
        return response.json()

    def is_ready(self) -> bool:
        """True once ``/readyz`` answers 200."""
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, timeout_s: float = 10.0) -> int:
        """Terminate (SIGTERM), wait, kill if needed, close the log; the exit code."""
        return self.child.stop(timeout_s)

    def __enter__(self) -> ReplicaProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_replica(
    onnx_path: str | Path,
    store_path: str | Path,
    model_version: str,
    *,
    config: ReplicaConfig = _NO_STALLS,
    lazy_load: bool = False,
    max_lifetime_s: float = 300.0,
    startup_timeout_s: float = 60.0,
    server_config: ServerConfig = REPLICA_SERVER,
) -> ReplicaProcess:
    """Start a replica process and return once it listens (not necessarily warm: see ``is_ready``).

    It starts as every course server does (``course_lib.serving.server.start_server``: a free port
    chosen here, its readiness line, ``/healthz`` answering 200); ``/readyz`` says when its warm-up
    is over.

    Parameters
    ----------
    onnx_path, store_path, model_version : what the replica serves (``prepare_replica_files``).
    config : ReplicaConfig
        Injected stalls and warm-up.
    lazy_load : bool
        Build the app (ONNX Runtime session, feature store, forward probe) on the first request.
    max_lifetime_s : float > 0
        The replica exits by itself after this long (``server_config.lifetime_s`` is replaced).
    startup_timeout_s : float > 0
        How long to wait for it to listen and answer ``/healthz``.
    server_config : ServerConfig
        The runtime's limits (default ``REPLICA_SERVER``: ``DEFAULTS`` with httptools + uvloop).

    Raises
    ------
    FileNotFoundError
        If the model or the store file is missing.
    RuntimeError
        If the process exits or does not answer ``/healthz`` within ``startup_timeout_s`` (the
        message quotes the end of its log).
    """
    for name, path in (("onnx_path", onnx_path), ("store_path", store_path)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{name} {path} does not exist")
    config = ReplicaConfig(**config.__dict__)  # validate
    positive_number("max_lifetime_s", max_lifetime_s)
    limits = server_config.replace(lifetime_s=max_lifetime_s)
    cmd = [
        sys.executable, "-m", "course_lib.serving.replica", "--onnx", str(onnx_path), "--store", str(store_path),
        "--model-version", model_version, "--slow-fraction", repr(config.slow_fraction),
        "--slow-ms", repr(config.slow_ms), "--seed", str(config.seed),
        "--warmup-requests", str(config.warmup_requests), *to_argv(limits),
    ]  # fmt: skip
    cmd += ["--gc-freeze"] * config.gc_freeze + ["--lazy-load"] * lazy_load
    started = time.perf_counter()
    server = start_server(cmd, name="replica", startup_timeout_s=startup_timeout_s)
    return ReplicaProcess(server.url, server.child, started)


@dataclass(frozen=True)
class ReplicaFiles:
    """What a replica process loads: the exported model, the feature store and the model version."""

    onnx_path: Path
    store_path: Path
    model_version: str


def prepare_replica_files(
    folder: str | Path = "build/tail", *, n_customers: int = 20_000, seed: int = 0
) -> ReplicaFiles:
    """Export the course model to ONNX and build a feature store, once (reused when present).

    Relative ``folder`` paths are taken from the repository root; the store lives in the same folder.
    """
    from course_lib.churn.data import DATA_DIR  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.churn.export import pipeline_to_onnx  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.churn.model import load_or_train_churn_model  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)
    from course_lib.serving.feature_store import build_feature_store  # noqa: PLC0415 (subprocess entry point: the replica process builds the model stack)

    base = Path(folder)
    if not base.is_absolute():
        base = DATA_DIR.parent / base
    base.mkdir(parents=True, exist_ok=True)
    model = load_or_train_churn_model()
    onnx_path = base / f"churn_{model.model_version}.onnx"
    if not onnx_path.is_file():
        tmp = onnx_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pipeline_to_onnx(model.pipeline).SerializeToString())
        tmp.replace(onnx_path)
    store = build_feature_store(n_customers, seed, folder=base)
    return ReplicaFiles(onnx_path, store.path, model.model_version)


if __name__ == "__main__":
    main()
