"""End-to-end batch scoring: 1,000,000 customers (store read to Parquet written) and the 10M memory check.

Prints rows/s against source lesson 000's figure (1,000,000 records in 12 minutes, about 1,389 rows/s)
and the peak resident memory of a 10,000,000-customer run, each job in a fresh process so the peak is
the job's own. Run: ``python benchmarks/batch_scoring.py [--customers 1000000 10000000] [--threads N]``.
Timings are whole-process figures from one run on this machine; rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib.core.env import env_report
from course_lib.offline.job import SOURCE000_ROWS_PER_S, build_parquet_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--customers", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(env_report())
    for n in args.customers:
        store = build_parquet_store(n, 0)
        out = Path(tempfile.mkdtemp(prefix="batch_scores_"))
        try:
            cmd = [sys.executable, "-m", "course_lib.offline", "--source", str(store), "--out", str(out),
                   "--runtime", "auto", "--threads", str(args.threads), "--no-progress"]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            s = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print(
            f"{n:>11,} customers: {s['seconds']:6.1f} s, {s['rows_per_s']:>9,.0f} rows/s "
            f"({s['rows_per_s'] / SOURCE000_ROWS_PER_S:,.0f}x source 000's {SOURCE000_ROWS_PER_S:,.0f} rows/s), "
            f"peak RSS {s['peak_rss_mib']:,.0f} MiB, runtime {s['runtime']}, {s['rows_rejected']} rejected"
        )


if __name__ == "__main__":
    main()
