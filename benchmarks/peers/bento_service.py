"""BentoML serving the production service's work: ``POST /score`` with ``{"customer_id": ...}``.

Run (from the repository root, in .venv-peers): ``bentoml serve benchmarks.peers.bento_service:Churn
--host 127.0.0.1 --port N``; ``PEER_WORKERS`` sets BentoML's worker processes. BentoML parses and
validates the JSON body itself (its ``customer_id: str`` signature), runs the sync API in its thread
pool, and encodes the returned dict.

References
----------
BentoML documentation, "Services", "Workers", "Concurrency".
"""

from __future__ import annotations

import os

import bentoml

from course_lib.serving.production import ProductionConfig, build_service
from course_lib.serving.service import RequestError

WORKERS = int(os.environ.get("PEER_WORKERS", "2"))


@bentoml.service(workers=WORKERS, traffic={"timeout": 10})
class Churn:
    """One customer's churn score, as ``course_lib.serving.production`` computes it."""

    def __init__(self) -> None:
        self.service = build_service(ProductionConfig(workers=1))

    @bentoml.api
    def score(self, customer_id: str) -> dict:
        try:
            return self.service.score_customer(customer_id)
        except RequestError as err:
            raise bentoml.exceptions.InvalidArgument(err.message) from None
