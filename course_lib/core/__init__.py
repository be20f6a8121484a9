"""Layer 0, what every other layer uses: checks, percentiles, timing, intervals, waiting, plots, env.

Argument checks, percentiles, the timing harness, intervals for ratios measured in rounds, waiting on
events, plot ticks, the environment report, processes and files.

Imports nothing from the rest of ``course_lib``.
"""

__all__ = ["bench", "checks", "env", "intervals", "percentiles", "plotting", "waiting"]
