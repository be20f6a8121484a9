"""How big a model is at each precision: parameters x bytes per parameter, and the same for real files.

References
----------
Kirana Kart module 19, "Quantisation": size = parameters x bytes per parameter (4 / 2 / 1 bytes).
IEEE 754 binary32 / binary16 storage sizes.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from course_lib.core.checks import integer, one_of

#: Storage per parameter by precision (IEEE float32 / float16, int8).
BYTES_PER_PARAMETER: dict[str, int] = {"fp32": 4, "fp16": 2, "int8": 1}


def _precision_of(name: str) -> str:
    precision = name.split("-", 1)[0]
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(
            f"variant name {name!r} must start with a precision, one of {sorted(BYTES_PER_PARAMETER)} "
            "(e.g. 'int8-dynamic')"
        )
    return precision


def expected_size_bytes(n_parameters: int, precision: str) -> int:
    """Bytes needed to store ``n_parameters`` numbers at ``precision``: parameters x bytes per parameter.

    Parameters
    ----------
    n_parameters : int
        Number of weights, >= 1.
    precision : {"fp32", "fp16", "int8"}

    Raises
    ------
    ValueError
        If ``n_parameters`` is not a positive integer or ``precision`` is unknown.

    References
    ----------
    Kirana Kart module 19, "Quantisation" (100,000,000 parameters -> 400 / 200 / 100 MB).
    """
    n_parameters = integer("n_parameters", n_parameters, min=1)
    one_of("precision", precision, sorted(BYTES_PER_PARAMETER))
    return n_parameters * BYTES_PER_PARAMETER[precision]


def size_table(n_parameters: int, file_bytes: Mapping[str, int] | None = None) -> pd.DataFrame:
    """The size arithmetic for one model, optionally next to the real files' sizes.

    Parameters
    ----------
    n_parameters : int
        Number of weights of the model.
    file_bytes : mapping of variant name -> file size in bytes, optional
        Variant names start with their precision (``"fp32"``, ``"fp16"``, ``"int8-dynamic"``, ...).
        Without it, one row per precision is returned.

    Returns
    -------
    DataFrame indexed by variant (or precision) with ``bytes_per_parameter`` (nominal),
    ``expected_bytes``, ``expected_mb`` (decimal, 1 MB = 1e6 bytes) and, when ``file_bytes`` is given,
    ``file_bytes``, ``file_bytes_per_parameter`` (file size / parameters, so file overhead and any
    tensors kept at higher precision show up as excess over the nominal value) and
    ``file_vs_expected`` (ratio).

    Raises
    ------
    ValueError
        From ``expected_size_bytes``; for a variant name without a known precision prefix, or a
        file size that is not a positive integer.
    """
    rows: dict[str, dict[str, float]]
    if file_bytes is None:
        rows = {
            p: {
                "bytes_per_parameter": b,
                "expected_bytes": expected_size_bytes(n_parameters, p),
            }
            for p, b in BYTES_PER_PARAMETER.items()
        }
    else:
        rows = {}
        for name, size in file_bytes.items():
            precision = _precision_of(name)
            size = integer(f"file_bytes[{name!r}]", size, min=1)
            expected = expected_size_bytes(n_parameters, precision)
            rows[name] = {
                "bytes_per_parameter": BYTES_PER_PARAMETER[precision],
                "expected_bytes": expected,
                "file_bytes": int(size),
                "file_bytes_per_parameter": int(size) / n_parameters,
                "file_vs_expected": int(size) / expected,
            }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.insert(2, "expected_mb", table["expected_bytes"] / 1e6)
    table.index.name = "variant" if file_bytes is not None else "precision"
    return table
