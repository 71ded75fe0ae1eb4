"""Ingest throughput: N synthetic impressions -> landing Parquet -> DuckDB ingest with quarantine ->
strata -> stratified mini-batches. Prints rows/second per stage and for ingest+quarantine+stratify
together, and the process's peak resident memory.

    .venv/bin/python benchmarks/ingest.py [N] [--violation-rate 0.01] [--batch-size 4] [--threads 0]

The generation and Parquet writing are timed separately and not counted in the throughput.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from abpo.data.schemas import write_impressions  # noqa: E402
from abpo.data.synthetic import DEFAULT_ARMS, synthetic_impressions  # noqa: E402
from abpo.warehouse import Warehouse, stratified_batches  # noqa: E402

MONTH = "2025-02"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000, help="impressions to generate (default 1000000)")
    ap.add_argument("--violation-rate", type=float, default=0.01, help="share of rows breaking one rule")
    ap.add_argument("--batch-size", type=int, default=4, help="stratified mini-batch size (paper: 4)")
    ap.add_argument("--threads", type=int, default=0, help="DuckDB threads (0 = DuckDB's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="abpo-bench-ingest-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        table, injected = synthetic_impressions(args.n, MONTH, seed=args.seed, violation_rate=args.violation_rate)
        write_impressions(table, tmp / "landing", MONTH, part="bench")
        del table
        t_gen = time.perf_counter() - t

        wh = Warehouse(tmp / "wh.duckdb")
        if args.threads:
            wh.con.execute(f"SET threads = {int(args.threads)}")
        t0 = time.perf_counter()
        report = wh.ingest_month(tmp / "landing", MONTH, list(DEFAULT_ARMS))
        t1 = time.perf_counter()
        pos, neg = wh.strata([MONTH])
        t2 = time.perf_counter()
        n_batches = sum(1 for _ in stratified_batches(pos, neg, args.batch_size, args.seed))
        t3 = time.perf_counter()
        wh.close()

    expected = {r: injected.get(r, 0) for r in report.quarantined_by_rule}
    assert report.quarantined_by_rule == expected, (report.quarantined_by_rule, expected)
    total = t3 - t0
    print(f"rows: {args.n:,} ({report.rows_clean:,} clean, {report.rows_quarantined:,} quarantined; "
          f"counts per rule match the injected violations)")
    print(f"generate + write Parquet (not timed below): {t_gen:.2f}s")
    print(f"ingest + quarantine : {t1 - t0:7.2f}s  {args.n / (t1 - t0):>12,.0f} rows/s")
    print(f"strata (2 queries)  : {t2 - t1:7.2f}s  {report.rows_clean / (t2 - t1):>12,.0f} rows/s")
    print(f"stratified batches  : {t3 - t2:7.2f}s  {report.rows_clean / (t3 - t2):>12,.0f} rows/s "
          f"({n_batches:,} batches of {args.batch_size}, both strata in each)")
    print(f"ingest+quarantine+stratify: {total:.2f}s = {args.n / total:,.0f} rows/s")
    print(f"peak memory (max RSS): {peak_rss_mib():,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
