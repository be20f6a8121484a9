"""Layer 4, measuring real servers and models: load generators, knees, histograms, throughput, experiments.

The open-loop load generator and its targets, rate ladders and knees, coordinated omission,
HdrHistograms, the other load tools (k6, Locust, the client's CPU), server probes (memory, idle), batching cost
and gain, throughput records, GC pauses, the lessons' live experiments, Lesson 7's tail experiments (hedging
rounds, fan-out, cold starts), and the whole service's waterfall (with the serving peers).

Imports only from the layers below.
"""

__all__ = [
    "batch_cost",
    "batching_gain",
    "capacity_record",
    "coordinated_omission",
    "experiments",
    "gc_pauses",
    "generators",
    "histograms",
    "knee",
    "ladder",
    "load_tools",
    "loadgen",
    "server_probes",
    "source_loadtest",
    "tail",
    "targets",
    "throughput",
    "waterfall",
]
