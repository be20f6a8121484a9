"""An HTTP client for the churn service that adds the ``transport`` stage to the server's profile.

References
----------
W3C, "Server Timing" (the response header the client reads). httpx documentation.
"""

from __future__ import annotations

import json
import time

from course_lib.serving.profiling import RequestProfile, parse_server_timing
from course_lib.serving.service._pipeline import RequestError

__all__ = ["ChurnClient"]


class ChurnClient:
    """An HTTP client for ``POST /score`` that adds the ``transport`` stage to the server's profile.

    Parameters
    ----------
    base_url : str
        E.g. ``http://127.0.0.1:8123`` (from ``course_lib.serving.server._runners.serve_in_thread``).
    timeout_s : float
        Per-request timeout; a hung server fails the call instead of hanging the lesson.

    Notes
    -----
    ``transport`` = the client's wall time around the POST minus the stages the server reports,
    i.e. everything outside the app: the client library, loopback TCP, uvicorn's HTTP parsing,
    the ASGI framework and the copy of the answer back.
    """

    def __init__(self, base_url: str, *, timeout_s: float = 10.0):
        import httpx

        self._http = httpx.Client(base_url=base_url, timeout=timeout_s)

    def post(self, body: bytes, *, content_type: str = "application/json") -> object:
        """POST raw bytes to ``/score``; returns the ``httpx.Response`` (for malformed-request tests)."""
        return self._http.post("/score", content=body, headers={"content-type": content_type})

    def score(self, customer_id: str, *, request_id: str = "") -> tuple[object, RequestProfile]:
        """Score one customer over HTTP and profile all five stages.

        Returns
        -------
        (httpx.Response, RequestProfile)
            The profile holds ``transport`` then the server's stages from ``Server-Timing``.

        Raises
        ------
        ValueError
            If the answer lacks a ``Server-Timing`` header or its stages exceed the client's wall
            time (a clock problem, never expected).
        """
        body = json.dumps({"customer_id": customer_id}).encode()
        start = time.perf_counter_ns()
        response = self._http.post("/score", content=body, headers={"content-type": "application/json"})
        wall_ms = (time.perf_counter_ns() - start) / 1e6
        header = response.headers.get("server-timing")
        if header is None:
            raise ValueError(f"response {response.status_code} has no Server-Timing header")
        server_ms = parse_server_timing(header)
        transport_ms = wall_ms - sum(server_ms.values())
        if transport_ms < 0:
            raise ValueError(
                f"server stages ({server_ms}) add up to more than the wall time {wall_ms:.3f} ms"
            )
        return response, RequestProfile(request_id or customer_id, {"transport": transport_ms, **server_ms})

    def timed_score(self, customer_id: str) -> RequestProfile:
        """``score`` that returns only the five-stage profile, raising ``RequestError`` unless 200."""
        response, profile = self.score(customer_id)
        if response.status_code != 200:
            raise RequestError(response.status_code, "request_failed", response.text)
        return profile

    def close(self) -> None:
        """Close the keep-alive connection."""
        self._http.close()

    def __enter__(self) -> ChurnClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
