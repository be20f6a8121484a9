"""course_lib: the verified implementations that the Inference Engineering Workbook's lessons import.

One concept per module; lessons import from the modules directly, e.g.
``from course_lib.model import train_churn_model``. See README.md for the module map.
"""

from course_lib.env import env_report

__all__ = ["__version__", "env_report"]
__version__ = "0.1.0"
