"""Layer 4, measuring real servers and models: the open-loop load generator and its targets, rate ladders
and knees, coordinated omission, HdrHistograms, Locust, the load-test server, batching cost and gain,
throughput records, cold starts, GC pauses, a cache's hit and miss costs against no cache, and the lessons'
live experiments.

Imports only from the layers below.
"""

__all__ = [
    "batch_cost",
    "batching_gain",
    "cache_costs",
    "capacity_record",
    "cold_start",
    "coordinated_omission",
    "gc_pauses",
    "generators",
    "histograms",
    "knee",
    "load_server",
    "loadgen",
    "locust_runner",
    "rate_sweep",
    "server_levers",
    "source_loadtest",
    "targets",
    "throughput",
]
