"""Layer 2, what makes the model smaller or faster: compression, variants, the accuracy budget, tuning.

Compression (FP16, INT8), scorecards of variants, the accuracy budget, ONNX Runtime tuning.

Imports only from :mod:`course_lib.core` and :mod:`course_lib.churn`.
"""

__all__ = ["accuracy_budget", "compression", "runtime_tuning", "variants"]
