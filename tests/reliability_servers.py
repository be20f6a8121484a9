"""Server processes for the reliability suite: the course's own apps, on the course's one runtime.

``python tests/reliability_servers.py KIND --port P --onnx M --store S --model-version V [--service-ms MS] [ServerConfig flags]``

Every kind serves the real model (the exported ONNX file of ``prepare_replica_files``, ~0.1 ms a call)
over the real feature store.

* ``batched``: Lesson 3's app (``POST /score`` and the batched ``POST /predict``).
  ``--service-ms`` stretches every model call by that many ms (a sleep in the batcher's worker
  thread, which holds no lock): the server's capacity is lowered to about 1000 / service_ms
  requests/s per batcher instance, so an overload of 4x needs a few hundred requests/s that a busy
  2-core machine can offer and parse, and the test measures shedding, not the machine.
* ``cached``: Lesson 8's ``CachedChurnService`` over a real Redis behind Lesson 2's app; the Redis
  address comes from ``--redis-port`` and its password from ``$COURSE_TEST_REDIS_PASSWORD`` (never a
  command line).
* ``monitored``: Lesson 9's versioned, instrumented app (``POST /score``, ``GET /metrics``).
* ``bulk``: a bare ASGI app whose ``GET /bulk`` answers ``BULK_BYTES`` bytes in one send (no model):
  an answer larger than the socket buffers, for a slow reader.

Not a test module (pytest collects ``test_*.py`` only); the tests start these with
``course_lib.serving.server.run_processes``.
"""

from __future__ import annotations

import argparse
import os
import time

from course_lib.serving.server import add_arguments, from_arguments, serve_app

PASSWORD_ENV = "COURSE_TEST_REDIS_PASSWORD"


def _slowed(forward, service_ms: float):
    if service_ms <= 0:
        return forward

    def slow_forward(records):
        time.sleep(service_ms / 1000.0)
        return forward(records)

    return slow_forward


def _service(args):
    from course_lib.churn.export import OnnxChurnScorer, make_session
    from course_lib.serving.feature_store import FeatureStore, make_lookup
    from course_lib.serving.service import ChurnService, onnx_forward

    scorer = OnnxChurnScorer(make_session(args.onnx, intra_op_num_threads=1))
    forward = _slowed(onnx_forward(scorer), args.service_ms)
    store = FeatureStore(args.store)
    lookup = make_lookup(store, "indexed")
    return store, ChurnService(
        lookup, forward, model_version=args.model_version, lookup_mode="indexed", runtime="onnx"
    )


def _batched(args, config):
    from course_lib.serving.batching.predict import create_batched_app

    _, service = _service(args)
    return create_batched_app(service, **config.batcher_kwargs(), body_timeout_s=config.body_timeout_s)


def _cached(args, config):
    import redis

    from course_lib.serving.cache.service import CachedChurnService, store_snapshot
    from course_lib.serving.cache.stores import RedisPredictionCache
    from course_lib.serving.service import create_app

    store, service = _service(args)
    client = redis.Redis(host="127.0.0.1", port=args.redis_port, password=os.environ[PASSWORD_ENV])
    cache = RedisPredictionCache(client, ttl_s=3600.0, timeout_s=args.redis_timeout_s)
    cached = CachedChurnService(
        service, cache, feature_snapshot=store_snapshot(store), breaker_reset_s=args.breaker_reset_s
    )
    return create_app(cached, body_timeout_s=config.body_timeout_s)


def _monitored(args, config):
    from course_lib.operate.canary import HashRouter
    from course_lib.operate.monitored_service import (
        ServiceMetrics,
        VersionedChurnService,
        create_monitored_app,
    )

    _, service = _service(args)
    versioned = VersionedChurnService(
        service.lookup_features,
        {"v1": service.forward},
        HashRouter("v1", "v2", 0.0),
        metrics=ServiceMetrics(),
    )
    return create_monitored_app(versioned)


BULK_BYTES = 8 * 2**20


def _bulk(args, config):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b"x" * BULK_BYTES if scope["path"] == "/bulk" else b"{}"
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


KINDS = {"batched": _batched, "bulk": _bulk, "cached": _cached, "monitored": _monitored}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model-version", required=True)
    parser.add_argument("--service-ms", type=float, default=0.0)
    parser.add_argument("--redis-port", type=int, default=0)
    parser.add_argument("--redis-timeout-s", type=float, default=0.1)
    parser.add_argument("--breaker-reset-s", type=float, default=1.0)
    add_arguments(parser)
    args = parser.parse_args()
    config = from_arguments(args)
    serve_app(KINDS[args.kind](args, config), port=args.port, config=config)


if __name__ == "__main__":
    main()
