"""Locust users for the churn service: ``locust -f loadtests/locustfile.py --headless --host URL ...``.

Each user is a closed loop: it posts one customer id, waits for the answer, and starts its next request
``CHURN_PACING_S`` seconds after the previous one started (or at once if the answer came later), so
``users / CHURN_PACING_S`` is the rate Locust *tries* to offer. Any answer but 200 is a failure.

Environment: ``CHURN_PATH`` (``/score`` or ``/predict``, default ``/score``), ``CHURN_PACING_S``
(default 0.1), ``CHURN_N_CUSTOMERS`` (the feature store's population, default the course's),
``CHURN_SEED`` (customer ids are drawn from a seeded generator per user).
"""

from __future__ import annotations

import itertools
import os
import random

import gevent
from locust import FastHttpUser, constant_pacing, task

from course_lib.serving.feature_store import DEFAULT_N_CUSTOMERS, customer_id

PATH = os.environ.get("CHURN_PATH", "/score")
PACING_S = float(os.environ.get("CHURN_PACING_S", "0.1"))
N_CUSTOMERS = int(os.environ.get("CHURN_N_CUSTOMERS", str(DEFAULT_N_CUSTOMERS)))
SEED = int(os.environ.get("CHURN_SEED", "0"))
_user_numbers = itertools.count()


class ChurnUser(FastHttpUser):
    """One support agent's screen asking for churn scores, one at a time."""

    wait_time = constant_pacing(PACING_S)

    def on_start(self) -> None:
        self.rng = random.Random(SEED * 100_003 + next(_user_numbers))

    @task
    def score(self) -> None:
        body = {"customer_id": customer_id(self.rng.randint(1, N_CUSTOMERS), N_CUSTOMERS)}
        with self.client.post(PATH, json=body, name=PATH, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {(response.text or '')[:200]}")


# gevent's loop caches "now"; the imports above took long enough that ``-t`` (a gevent timer set from
# the cached time) would fire early. Refresh it so the run lasts what -t says.
gevent.get_hub().loop.update_now()
