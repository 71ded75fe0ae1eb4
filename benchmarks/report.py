"""How long the A/B report takes on large logs: 10M vs 100M synthetic impressions, side by side, and what
the per-user aggregate it reads costs at ingest.

The rows are generated directly inside a DuckDB warehouse file (range() + hash-based columns, nothing
materialised in Python), in the warehouse's own `impressions` table (sql/schema.sql). Then, per size:

1. ingest-time aggregation: `Warehouse.rebuild_aggregates` over the three months, the very SQL each
   month's ingest runs inside its transaction (sql/user_month_stats_{delete,insert,mark}.sql), plus a
   CHECKPOINT so the result is on disk. This cost is paid once per month at ingest, not per report;
   it is printed separately as impressions aggregated per second. (Inside a real ingest the month was
   just inserted in the same transaction; here it is read back from the checkpointed table.)
2. the report step exactly as `abpo report --months` runs it (minus MLflow): open the warehouse, read
   sql/report_user_moments.sql from user_month_stats (per-user moments per arm and month and over the
   period, from which the per-arm-per-month counts follow), the statistics, and the
   HTML/Markdown/PNG/JSON files.
3. with --raw-baseline, once: the previous design for comparison, the same moments grouped from the
   raw `impressions` rows (RAW_MOMENTS_SQL below; what sql/report_user_moments.sql did before).

Columns the report does not read (ids, lists, serving fields) are constants: a column store does not
scan them, and generating 100M unique strings would only slow the set-up.

    .venv/bin/python benchmarks/report.py                       # 10M and 100M
    .venv/bin/python benchmarks/report.py --sizes 1e6 1e7       # quicker
    .venv/bin/python benchmarks/report.py --smoke               # seconds: --sizes 1e4 2e4 --repeat 1 --raw-baseline

With two sizes or more the line before the last is the ratio, `ratio <n1> / <n0> rows (x<r> rows, x<a> aggregate
rows): report time x<t>, report CPU x<c>, aggregation time x<g>[, raw-row SQL x<s>]`; the last line is always
`(wall time on a machine with <n> cores, load average now <1 min>, <5 min>, <15 min>)`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

MONTHS = ["2026-02", "2026-03", "2026-04"]

# Synthetic log: months split evenly over row ids; users = rows * users_per_row, assigned to arms by a
# stable hash of user_id with unequal shares (abpo 40%, the others 20%); click with probability
# base CTR of the arm (+0.4 pp per month for abpo), decided by a hash of the row id.
GENERATE_SQL = """
INSERT INTO impressions
WITH base AS (
    SELECT i,
           (i * 3 // $n)::INTEGER                    AS m,        -- month index 0..2
           (hash(i, 1) % $users)::BIGINT + 1          AS user_id
    FROM range($n) AS t(i)
), assigned AS (
    SELECT *, CASE WHEN hash(user_id, 2) % 10 < 4 THEN 'abpo'
                   ELSE (['grpo', 'ml_retrain', 'popularity'])[1 + (hash(user_id, 3) % 3)::INTEGER] END AS arm
    FROM base
)
SELECT
    (['2026-02', '2026-03', '2026-04'])[m + 1]                                    AS month,
    'synthetic'                                                                   AS impression_id,
    TIMESTAMPTZ '2026-02-01 00:00:00+00' + to_months(m)
        + to_seconds((hash(i, 4) % 2419200)::BIGINT)                              AS event_time,
    user_id,
    arm,
    arm || '-1'                                                                   AS model_version,
    [1, 2, 3]::BIGINT[]                                                           AS history,
    [4, 5, 6]::BIGINT[]                                                           AS candidates,
    5::BIGINT                                                                     AS item_id,
    0.5::DOUBLE                                                                   AS propensity,
    (CASE WHEN (hash(i, 5) % 1000000) < 1000000 * (CASE arm WHEN 'abpo' THEN 0.050 + 0.004 * m
                                                             WHEN 'grpo' THEN 0.047
                                                             WHEN 'ml_retrain' THEN 0.045
                                                             ELSE 0.040 END)
          THEN 1 ELSE 0 END)::TINYINT                                             AS clicked,
    'synthetic'                                                                   AS request_id,
    0::SMALLINT                                                                   AS position,
    'softmax(tau=1.0)'                                                            AS logging_policy,
    TIMESTAMPTZ '2026-02-01 00:00:00+00' + to_months(m)
        + to_seconds((hash(i, 4) % 2419200)::BIGINT)                              AS served_at,
    1::SMALLINT                                                                   AS schema_version,
    'synthetic'                                                                   AS source_file,
    i                                                                             AS source_row
FROM assigned
"""


# The report's moments grouped from the raw rows (the design before user_month_stats), for --raw-baseline.
RAW_MOMENTS_SQL = """
WITH per_user_month AS (
    SELECT month, arm, user_id, sum(clicked)::BIGINT AS x, count(*)::BIGINT AS y
    FROM impressions WHERE list_contains($months::VARCHAR[], month)
    GROUP BY month, arm, user_id
),
per_user_period AS (
    SELECT arm, user_id, sum(x)::BIGINT AS x, sum(y)::BIGINT AS y FROM per_user_month GROUP BY arm, user_id
)
SELECT month AS period, arm, count(*)::BIGINT AS users, sum(x)::BIGINT AS clicks, sum(y)::BIGINT AS impressions,
       sum(x * x)::BIGINT AS clicks_sq, sum(y * y)::BIGINT AS impressions_sq, sum(x * y)::BIGINT AS clicks_x_impressions
FROM per_user_month GROUP BY month, arm
UNION ALL
SELECT 'all', arm, count(*)::BIGINT, sum(x)::BIGINT, sum(y)::BIGINT, sum(x * x)::BIGINT, sum(y * y)::BIGINT,
       sum(x * y)::BIGINT
FROM per_user_period GROUP BY arm
ORDER BY period, arm
"""


def _size(s: str) -> int:
    return int(float(s))


def generate(path: Path, n: int, users: int, memory_limit: str) -> float:
    """The raw rows only: the per-user aggregate is left unbuilt (time_aggregation builds it)."""
    from abpo.warehouse import Warehouse

    t0 = time.perf_counter()
    with Warehouse(path) as wh:
        wh.con.execute(f"SET memory_limit = '{memory_limit}'")
        wh.con.execute("SET preserve_insertion_order = false")
        wh.con.execute(GENERATE_SQL, {"n": n, "users": users})
        wh.con.execute("CHECKPOINT")
    return time.perf_counter() - t0


def time_aggregation(path: Path, memory_limit: str) -> dict[str, float]:
    """user_month_stats rebuilt for the three months (the ingest-time step), timed with its CHECKPOINT.
    Opens the warehouse without the on-open check (a freshly generated warehouse has no aggregate yet,
    and opening it normally would build it untimed)."""
    from abpo.warehouse import Warehouse

    class _NoCheckOnOpen(Warehouse):
        def ensure_aggregates(self):
            return []

    with _NoCheckOnOpen(path) as wh:
        wh.con.execute(f"SET memory_limit = '{memory_limit}'")
        c0, t0 = time.process_time(), time.perf_counter()
        builds = wh.rebuild_aggregates(MONTHS)
        wh.con.execute("CHECKPOINT")
        t = {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        t["impressions"] = sum(b.impressions for b in builds)
        t["rows"] = sum(b.users for b in builds)
        assert wh.stale_aggregate_months() == {}
    return t


def time_raw_baseline(path: Path) -> float:
    from abpo.warehouse import Warehouse

    with Warehouse(path) as wh:
        t0 = time.perf_counter()
        wh.con.execute(RAW_MOMENTS_SQL, {"months": MONTHS}).fetchall()
        return time.perf_counter() - t0


def time_report(root: Path, out: Path) -> dict[str, float]:
    """The report step as `abpo report --months` runs it, phase by phase (MLflow left out)."""
    from abpo.abtest.analysis import analyse
    from abpo.abtest.render import write_report
    from abpo.abtest.report import load_from_warehouse
    from abpo.config import Config

    cfg = Config()  # the defaults (no preset file involved), pointed at the benchmark's warehouse
    cfg.paths.root = str(root)
    cfg.report.arm_shares = {"abpo": 0.4, "grpo": 0.2, "ml_retrain": 0.2, "popularity": 0.2}
    t = {}
    c0 = time.process_time()  # CPU seconds of this process, DuckDB's threads included
    t0 = time.perf_counter()
    counts, moments = load_from_warehouse(cfg.paths.resolve("warehouse"), MONTHS)
    t1 = time.perf_counter()
    report = analyse(counts, cfg.report, months=MONTHS, moments=moments, source="benchmark")
    write_report(report, out)
    t2 = time.perf_counter()
    t.update(sql=t1 - t0, stats_render=t2 - t1, total=t2 - t0, cpu=time.process_time() - c0)
    t["impressions"] = sum(counts.column("impressions").to_pylist())
    t["srm_flagged"] = len(report.srm_flagged)
    return t


def main(argv: list[str] | None = None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes",
        nargs="+",
        type=_size,
        default=[10_000_000, 100_000_000],
        help="Numbers of impressions (default: 1e7 1e8).",
    )
    ap.add_argument(
        "--users-per-row",
        type=float,
        default=0.05,
        help="Distinct users = rows x this (default 0.05: ~20 impressions per user over 3 months).",
    )
    ap.add_argument(
        "--dir",
        default=None,
        help="Keep the generated warehouses here and reuse them on the next run (default: a temp dir, "
        "removed at the end).",
    )
    ap.add_argument("--memory-limit", default="8GB", help="DuckDB memory limit while generating (default 8GB).")
    ap.add_argument("--repeat", type=int, default=2, help="Time the report this many times; the best counts.")
    ap.add_argument(
        "--raw-baseline",
        action="store_true",
        help="Also time, once per size, the same moments grouped from the raw impressions (the "
        "design before the per-user aggregate), for comparison.",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the same path in seconds: --sizes 1e4 2e4 --repeat 1 --raw-baseline (tests/benchmarks/test_smoke.py)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeat, args.raw_baseline = [10_000, 20_000], 1, True

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="abpo-bench-report-"))
    results = []
    try:
        for n in args.sizes:
            root = base / f"n{n}"
            root.mkdir(parents=True, exist_ok=True)
            wh_path = root / "warehouse.duckdb"
            users = max(int(n * args.users_per_row), 10)
            done = root / f"generated-{users}"
            if args.dir and wh_path.exists() and done.exists():
                print(f"[{n:,} rows] reusing {wh_path}", flush=True)
            else:
                wh_path.unlink(missing_ok=True)
                gen = generate(wh_path, n, users, args.memory_limit)
                done.touch()
                size_mb = wh_path.stat().st_size / 2**20
                print(f"[{n:,} rows] generated in {gen:.1f}s ({users:,} users, file {size_mb:,.0f} MiB)", flush=True)
            agg = time_aggregation(wh_path, args.memory_limit)
            assert agg["impressions"] == n, (agg["impressions"], n)
            print(
                f"[{n:,} rows] ingest-time aggregation (once per month at ingest, not per report): "
                f"{agg['seconds']:.2f}s = {n / agg['seconds']:,.0f} impressions/s, CPU {agg['cpu']:.2f}s; "
                f"user_month_stats {agg['rows']:,} rows ({n / agg['rows']:.1f} impressions per row)",
                flush=True,
            )
            runs = [time_report(root, root / "report") for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["total"])
            assert best["impressions"] == n, (best["impressions"], n)
            print(
                f"[{n:,} rows] report {best['total']:.2f}s (best of {args.repeat}): DuckDB from user_month_stats "
                f"{best['sql']:.2f}s, statistics+files "
                f"{best['stats_render']:.2f}s, CPU {best['cpu']:.2f}s; all runs {[round(r['total'], 2) for r in runs]}",
                flush=True,
            )
            raw = time_raw_baseline(wh_path) if args.raw_baseline else float("nan")
            if args.raw_baseline:
                print(
                    f"[{n:,} rows] baseline, same moments grouped from the raw rows: {raw:.2f}s (DuckDB only, once)",
                    flush=True,
                )
            results.append((n, agg, best, raw))
        print()
        print(
            f"{'impressions':>14}  {'agg rows':>11}  {'aggregation':>11}  {'impr/s aggr.':>12}  "
            f"{'report time':>11}  {'CPU time':>8}  {'ns/row':>6}" + ("  raw-row SQL" if args.raw_baseline else "")
        )
        for n, agg, best, raw in results:
            print(
                f"{n:>14,}  {agg['rows']:>11,}  {agg['seconds']:>10.2f}s  {n / agg['seconds']:>12,.0f}  "
                f"{best['total']:>10.2f}s  {best['cpu']:>7.2f}s  {1e9 * best['total'] / n:>6.1f}"
                + (f"  {raw:>10.2f}s" if args.raw_baseline else "")
            )
        if len(results) >= 2:
            (n0, a0, b0, r0), (n1, a1, b1, r1) = results[0], results[-1]
            print(
                f"ratio {n1:,} / {n0:,} rows (x{n1 / n0:.0f} rows, x{a1['rows'] / a0['rows']:.1f} aggregate rows): "
                f"report time x{b1['total'] / b0['total']:.2f}, report CPU x{b1['cpu'] / b0['cpu']:.2f}, "
                f"aggregation time x{a1['seconds'] / a0['seconds']:.2f}"
                + (f", raw-row SQL x{r1 / r0:.2f}" if args.raw_baseline else "")
            )
        print(
            f"(wall time on a machine with {os.cpu_count()} cores, load average now "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())})"
        )
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
