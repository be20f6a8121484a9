"""Layer 0, what every other layer uses: argument checks, percentiles, the timing harness, waiting on
events, intervals for ratios measured in rounds, wording of measured comparisons, plot ticks, the environment report, processes and files.

Imports nothing from the rest of ``course_lib``.
"""

__all__ = ["bench", "checks", "env", "intervals", "percentiles", "plotting", "waiting", "wording"]
