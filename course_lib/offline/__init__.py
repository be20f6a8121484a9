"""Layer 5, offline (batch) scoring: the resumable batch job, its scorers, Dask, a Triton model repository.

The resumable, parallel batch job over a Parquet store (``python -m course_lib.offline``) and its
short core loop (``resumable``), its chunk
pipeline (store, rows, scorers, compiled trees, chunk, workers), the same job on Dask, the model-only
floor it is measured against, a Triton model repository, and the churn model served on real Triton and
MLServer (``inference_servers``).

Imports only from the layers below.
"""

__all__ = [
    "chunk",
    "compiled",
    "dask_job",
    "floor",
    "inference_servers",
    "job",
    "resumable",
    "rows",
    "scorers",
    "store",
    "triton_repository",
    "workers",
]
