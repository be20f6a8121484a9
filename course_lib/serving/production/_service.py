"""The production churn service's stages: the chosen runtime, the cached lookup, one encode of the answer.

``build_service(config)`` loads what one worker process needs (the churn model, its ONNX Runtime
session with one intra-op thread, the feature store behind the in-process cache) and returns a
``ProductionService``: Lesson 2's ``ChurnService`` stages (strict JSON, the request schema, the
feature check, Server-Timing), whose format stage builds the answer once and encodes it once, with
``orjson`` or the standard ``json`` module (``course_lib.serving.service.encode_answer``).
``forward_cost_ms`` times the model call the way ``forward="auto"`` decides where it runs.

References
----------
orjson README (``orjson.dumps`` returns bytes). ONNX Runtime documentation, "Thread management".
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from course_lib.churn.export import OnnxChurnScorer, make_session, pipeline_to_onnx
from course_lib.churn.model import load_or_train_churn_model
from course_lib.core.checks import integer
from course_lib.serving.production._config import FORWARD_PROBE_CALLS, ProductionConfig
from course_lib.serving.service import ChurnService, Record, churn_service


class ProductionService(ChurnService):
    """``ChurnService`` with ``score_customer``, the work of ``/score`` for a server that parses itself.

    Its answer is encoded once, with ``encoder`` ("orjson" by default here, or "json";
    ``course_lib.serving.service.encode_answer``): same fields, same rounding and the same refusal of
    a probability outside [0, 1] as every ``ChurnService`` (both build ``ChurnService.answer``).
    """

    def __init__(self, *args: Any, encoder: str = "orjson", **kwargs: Any):
        super().__init__(*args, encoder=encoder, **kwargs)

    def score_customer(self, customer_id: str) -> dict[str, object]:
        """The answer's fields for one customer id, for a server that parses the request itself.

        The same work as ``/score`` after parsing: the request schema, the cached lookup, the feature
        check and the model call (``benchmarks/serving_peers.py`` puts it behind BentoML and LitServe).

        Raises
        ------
        course_lib.serving.service.RequestError
            422 for an id that is not ``SC-`` and 7 to 9 digits or features outside the schema, 404 for
            an unknown customer.
        """
        request = self.validate({"customer_id": customer_id})
        record = self.lookup(request)
        self.check_features(record)
        return self.answer(request, self.forward([record])[0])


def build_service(config: ProductionConfig, *, churn_model: Any = None) -> ProductionService:
    """The stages one worker runs for ``config``: runtime, cached lookup, encoder.

    Parameters
    ----------
    config : ProductionConfig
    churn_model : course_lib.churn.model.ChurnModel, optional
        Default ``load_or_train_churn_model()`` (the course's cached model).

    Returns
    -------
    ProductionService
        ``runtime`` and ``lookup_mode`` are echoed in every answer. For ONNX Runtime its ``forward``
        does not check its records (every path of the service runs ``check_features`` first, so the
        check is done once per request): call ``check_features`` before calling ``forward`` yourself.
    """
    churn_model = load_or_train_churn_model() if churn_model is None else churn_model
    scorer = None
    if config.runtime == "onnxruntime":
        scorer = OnnxChurnScorer(make_session(pipeline_to_onnx(churn_model.pipeline)))
    base = churn_service(config.runtime, lookup_mode="cached", churn_model=churn_model, onnx_scorer=scorer)
    forward = base.forward
    if scorer is not None:
        checked = scorer  # every path to the model runs check_features first (handle_async, score_customer)

        def forward(records: list[Record]) -> np.ndarray:
            return checked.run(checked.feeds_from_checked_records(records))

    return ProductionService(
        base.lookup_features,
        forward,
        model_version=base.model_version,
        lookup_mode=base.lookup_mode,
        runtime=base.runtime,
        encoder=config.encoder,
    )


def forward_cost_ms(
    service: ChurnService, record: dict[str, object], *, calls: int = FORWARD_PROBE_CALLS
) -> float:
    """Median cost of one model call on one customer's record, in ms (as many warm-up calls first).

    Raises
    ------
    course_lib.core.checks.InvalidArgumentError
        For ``calls`` < 1.
    course_lib.serving.service.RequestError
        422 for a record outside ``course_lib.churn.schema`` (it is checked first: the production
        forward does not check).
    """
    n = integer("calls", calls, min=1)
    service.check_features(record)
    times = []
    for i in range(2 * n):
        start = time.perf_counter_ns()
        service.forward([record])
        if i >= n:
            times.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.median(times))
