"""LitServe serving the production service's work: ``POST /score`` with ``{"customer_id": ...}``.

Run (from the repository root, in .venv-peers): ``python -m benchmarks.peers.litserve_server --port N``;
``PEER_WORKERS`` sets the inference workers (``workers_per_device`` on the CPU). LitServe's HTTP server
hands each decoded request to its inference worker processes through queues and back.

References
----------
LitServe documentation, "LitAPI", "LitServer" (``workers_per_device``, ``healthcheck_path``).
"""

from __future__ import annotations

import argparse
import os

import litserve as ls
from fastapi import HTTPException

from course_lib.serving.production import ProductionConfig, build_service
from course_lib.serving.service import RequestError


class ChurnAPI(ls.LitAPI):
    """decode: the id; predict: the production service's work; encode: the answer's dict."""

    def setup(self, device: str) -> None:
        self.service = build_service(ProductionConfig(workers=1))

    def decode_request(self, request: dict) -> str:
        return request["customer_id"]

    def predict(self, customer_id: str) -> dict:
        try:
            return self.service.score_customer(customer_id)
        except RequestError as err:
            raise HTTPException(status_code=err.status_code, detail=err.message) from None

    def encode_response(self, output: dict) -> dict:
        return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    workers = int(os.environ.get("PEER_WORKERS", "2"))
    server = ls.LitServer(
        ChurnAPI(api_path="/score"),
        accelerator="cpu",
        workers_per_device=workers,
        timeout=10,
        healthcheck_path="/healthz",
    )
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
