"""Layer 5, offline (batch) scoring: the resumable batch job, its scorers, Dask, a Triton model repository.

The resumable batch job over a Parquet store (``python -m course_lib.offline``), its scorers, the same
job on Dask, a Triton model repository.

Imports only from the layers below.
"""

__all__ = ["dask_job", "job", "scorers", "store", "triton_repository"]
