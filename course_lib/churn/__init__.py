"""Layer 1, the running example: the data, its schema, the churn model, its ONNX export, versions, variants.

The Telco data, the feature schema, the churn model, its ONNX export and identity, model versions,
pruned trees, the neural variant and distillation.

Imports only from :mod:`course_lib.core`.
"""

__all__ = ["data", "distillation", "export", "model", "neural", "pruning", "schema", "versions"]
