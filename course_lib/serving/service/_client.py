"""The client side of the churn service: the one error for a non-2xx answer, and an HTTP client.

``HttpStatusError`` is what every course client raises when a server answers outside 2xx: this
module's ``ChurnClient``, the hedging client (:mod:`course_lib.serving.hedging`), the load
generator's targets (:mod:`course_lib.measure.targets`) and the cold-start probe
(:mod:`course_lib.measure.tail`). Its ``shed`` says whether the server shed the request
(429 or 503: retry later) rather than refused or failed it, and the load generator
(:func:`course_lib.measure.loadgen.outcome_of`) counts a shed answer as ``"shed"``, not as an error.
(``RequestError`` is the server's side: the refusal a stage raises to answer with a 4xx.)

References
----------
W3C, "Server Timing" (the response header the client reads). RFC 9110, sections 15.6.4 (503 Service
Unavailable) and 10.2.3 (Retry-After); RFC 6585, section 4 (429 Too Many Requests). httpx documentation.
"""

from __future__ import annotations

import json
import time
from typing import Any

from course_lib.serving.profiling import RequestProfile, parse_server_timing

#: Statuses that say the server shed the request under load: 429 Too Many Requests, 503 Service
#: Unavailable (RFC 6585 section 4, RFC 9110 section 15.6.4). The request was fine; ask again later.
SHED_STATUSES: frozenset[int] = frozenset({429, 503})


class HttpStatusError(RuntimeError):
    """A server answered outside 2xx.

    Parameters
    ----------
    status : int
        The HTTP status code.
    body : str
        The answer's body (the message quotes its first 200 characters).
    retry_after : str, optional
        The ``Retry-After`` header, if the server sent one (a 503 or 429 usually does).
    where : str
        Who answered, for the message ("replica 1", "request 17").

    Attributes
    ----------
    status, body, retry_after : as given.
    shed : bool
        ``status`` is one of ``SHED_STATUSES``.
    """

    def __init__(self, status: int, body: str = "", *, retry_after: str | None = None, where: str = ""):
        hint = f" (Retry-After: {retry_after})" if retry_after is not None else ""
        super().__init__(f"{where + ' answered ' if where else ''}HTTP {status}{hint}: {body[:200]}")
        self.status = int(status)
        self.body = body
        self.retry_after = retry_after

    @property
    def shed(self) -> bool:
        """True for 429 and 503: the server shed load; the request itself was not at fault."""
        return self.status in SHED_STATUSES

    @classmethod
    def from_response(cls, response: Any, *, where: str = "") -> HttpStatusError:
        """The error for an ``httpx.Response`` (``status_code``, ``text``, ``headers``)."""
        return cls(
            response.status_code, response.text, retry_after=response.headers.get("retry-after"), where=where
        )


def raise_for_status(response: Any, *, where: str = "") -> Any:
    """Return ``response`` (an ``httpx.Response``) if its status is 2xx, else raise ``HttpStatusError``.

    Raises
    ------
    HttpStatusError
        For any status outside 200-299; ``.shed`` is true for 429 and 503.
    """
    if not 200 <= response.status_code < 300:
        raise HttpStatusError.from_response(response, where=where)
    return response


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
        # httpx is the client's: a server importing course_lib.serving.service never loads it
        import httpx  # noqa: PLC0415 (heavy optional dependency)

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
        """``score`` that returns only the five-stage profile (for ``profile_requests``).

        Raises
        ------
        HttpStatusError
            Unless the answer is 2xx (a refused request is not a latency sample).
        """
        response, profile = self.score(customer_id)
        raise_for_status(response)
        return profile

    def close(self) -> None:
        """Close the keep-alive connection."""
        self._http.close()

    def __enter__(self) -> ChurnClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
