"""The load tools people use, run by the course beside its own generator: k6, Locust, and what each costs.

The course's open-loop generator lives in ``course_lib.measure.loadgen`` (and its processes in
``course_lib.measure.generators``); this package holds the adapters to the other tools, each running
the tool in a bounded subprocess and reading its numbers back:

* ``k6``: ``run_k6``, Grafana k6 on :data:`K6_SCRIPT` (``scripts/churn.js``, shipped with the package),
  and its summary (``K6Result``, ``parse_k6_summary``);
* ``locust``: ``run_locust``, headless Locust on :data:`LOCUSTFILE` (``scripts/locustfile.py``), its CSV,
  and its rounding and closed-loop rules reproduced from its source;
* ``client_cpu``: each load tool's CPU per request (k6 and the course generator, open loop at the same
  rate), ``save_client_cpu`` / ``load_client_cpu`` (``data/measurements/client_cpu.json``).

The scripts are package data (``importlib.resources``, via ``course_lib.core.files.package_file``), so an
installed package runs them without a checkout; a checkout's ``loadtests/`` links to them, for the
documented ``k6 run ... loadtests/churn.js`` and ``locust -f loadtests/locustfile.py``.
``course_lib.measure.waterfall`` compares k6 with the course generator on the whole service.
"""

from __future__ import annotations

from course_lib.measure.load_tools.client_cpu import (
    LOAD_TOOLS,
    RECORDED_CLIENT_CPU,
    ClientCpuRecord,
    client_cpu_table,
    generator_cpu_s_per_request,
    k6_cpu_s_per_request,
    load_client_cpu,
    save_client_cpu,
)
from course_lib.measure.load_tools.k6 import (
    K6_SCRIPT,
    MEASURED_SCENARIO,
    K6Result,
    k6_binary,
    k6_version,
    parse_k6_summary,
    run_k6,
)
from course_lib.measure.load_tools.locust import (
    LOCUSTFILE,
    bucket_response_time_ms,
    locust_closed_loop,
    locust_percentile,
    locust_rank,
    locust_requests_per_s,
    read_locust_stats,
    run_locust,
)

__all__ = [
    "K6_SCRIPT",
    "LOAD_TOOLS",
    "LOCUSTFILE",
    "MEASURED_SCENARIO",
    "RECORDED_CLIENT_CPU",
    "ClientCpuRecord",
    "K6Result",
    "bucket_response_time_ms",
    "client_cpu_table",
    "generator_cpu_s_per_request",
    "k6_binary",
    "k6_cpu_s_per_request",
    "k6_version",
    "load_client_cpu",
    "locust_closed_loop",
    "locust_percentile",
    "locust_rank",
    "locust_requests_per_s",
    "parse_k6_summary",
    "read_locust_stats",
    "run_k6",
    "run_locust",
    "save_client_cpu",
]
