"""Layer 0, what every other layer uses: checks, percentiles, timing, intervals, waiting, plots, env.

Argument checks, percentiles, the timing harness, intervals for ratios measured in rounds, waiting on
events, plot ticks, the environment report, CPU affinity, child processes (``process``, ``guard``),
files (``files``) and a connection's socket (``sockets``). Every module here is public: the layers
above import them by name (``from course_lib.core.process import start_child``).

Imports nothing from the rest of ``course_lib``.
"""

__all__ = [
    "affinity",
    "bench",
    "checks",
    "env",
    "files",
    "guard",
    "intervals",
    "percentiles",
    "plotting",
    "process",
    "sockets",
    "vocabulary",
    "waiting",
]
