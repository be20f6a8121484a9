"""Layer 0, what every other layer uses: checks, percentiles, timing, waiting, wording, plots, env.

Argument checks, percentiles, the timing harness, intervals for ratios measured in rounds, waiting on
events, wording of measured comparisons, plot ticks, the environment report, processes and files.

Imports nothing from the rest of ``course_lib``.
"""

__all__ = ["bench", "checks", "env", "intervals", "percentiles", "plotting", "waiting", "wording"]
