"""Ingest throughput, side by side: N synthetic impressions -> landing Parquet -> DuckDB ingest with quarantine ->
stratified mini-batches, run by this checkout and by a baseline commit (default: the last commit before the
warehouse was made to keep up) on the same landing files, each in its own process. Prints rows/second per stage
and end to end, the ratio, each process's peak resident memory, and checks that both quarantine exactly the
injected violations.

    .venv/bin/python benchmarks/ingest.py [N] [--baseline REV|none] [--memory-limit 1GB] [--threads 0] [--object-store]
                                      [--smoke]

This checkout streams the batches from DuckDB as Arrow tables (Warehouse.stratified_batch_stream); the baseline
does what it did then (its strata as Arrow tables, then stratified_batches as Python dicts). The generation and
Parquet writing (in parts of at most 1M rows, so the generator's memory stays bounded) are not timed. For the
memory goal run it at 10M rows with `--baseline none` (the baseline holds the strata in memory).

``--object-store`` adds a row for this checkout ingesting the same files from a bucket of a local S3 API (moto's
server on 127.0.0.1, started here; the moto and boto3 packages of the dev extra): ``paths.landing=s3://...``, where
the ingest lists and checks the objects, copies them to a local temporary directory and stages them
(abpo.data.storage). The upload itself is not timed; the server's own memory is not in the row's peak.

With a baseline the last line is `same quarantine counts and batch count; end to end now/baseline: <r>x (ingest
<i>x)`; with ``--baseline none`` it is the last row's `  end to end          : <s>s  <rows/s> rows/s; peak memory
<m> MiB`. ``--smoke`` runs the same path in seconds (tests/benchmarks/test_smoke.py): 2,000 rows, one DuckDB thread,
a 512MB memory limit, the baseline as given (the figures mean nothing at that size).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MONTH = "2025-02"
BASELINE = "a9df335"  # main before the ingest and stratified batches were made Arrow-native
PART_ROWS = 1_000_000


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(args) -> int:
    """One pipeline run in this process, code imported from ``--code-root``; prints one JSON line."""
    sys.path.insert(0, args.code_root)
    import numpy as np  # noqa: F401 - imported before timing, as the pipeline's own imports are

    from abpo import warehouse as W

    kw = {"memory_limit": args.memory_limit, "temp_directory": str(Path(args.work) / "spill")}
    wh = W.Warehouse(Path(args.work) / f"{args.label}.duckdb", **kw)
    if args.threads:
        wh.con.execute(f"SET threads = {int(args.threads)}")
    t0 = time.perf_counter()
    report = wh.ingest_month(args.landing, MONTH, args.arms.split(","))
    t1 = time.perf_counter()
    if hasattr(W.Warehouse, "stratified_batch_stream"):
        batches = rows = 0
        for chunk in wh.stratified_batch_stream([MONTH], args.batch_size, args.seed):
            rows += chunk.num_rows
            batches += len(np.unique(chunk.column("batch").to_numpy()))
        t2 = time.perf_counter()
        t3 = t2
        how = "Arrow tables streamed from DuckDB"
    else:
        pos, neg = wh.strata([MONTH])
        t2 = time.perf_counter()
        batches = sum(1 for _ in W.stratified_batches(pos, neg, args.batch_size, args.seed))
        t3 = time.perf_counter()
        how = "strata as Arrow tables, then batches as Python dicts"
    wh.close()
    print(
        json.dumps(
            {
                "ingest_s": t1 - t0,
                "strata_s": t2 - t1,
                "batches_s": t3 - t2,
                "total_s": t3 - t0,
                "rows_clean": report.rows_clean,
                "quarantined": report.quarantined_by_rule,
                "batches": batches,
                "how": how,
                "peak_mib": peak_rss_mib(),
            }
        )
    )
    return 0


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (git archive) under ``into``."""
    into.mkdir(parents=True)
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "abpo", "sql"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    from abpo.logs import progress_bars_only_on_a_terminal

    progress_bars_only_on_a_terminal()  # no progress-bar redraws in a piped or logged run (one line each)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000, help="impressions to generate (default 1000000)")
    ap.add_argument("--violation-rate", type=float, default=0.01, help="share of rows breaking one rule")
    ap.add_argument("--batch-size", type=int, default=4, help="stratified mini-batch size (paper: 4)")
    ap.add_argument(
        "--baseline", default=BASELINE, help=f"git revision to compare with (default {BASELINE}); none: skip"
    )
    ap.add_argument("--memory-limit", default="1GB", help="DuckDB memory_limit for both runs (default 1GB)")
    ap.add_argument("--threads", type=int, default=0, help="DuckDB threads (0 = DuckDB's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--object-store",
        action="store_true",
        help="also ingest the same files from a local S3 server (moto) through paths.landing=s3://...",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--code-root", "--landing", "--work", "--label", "--arms"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="2,000 rows, 1 thread, 512MB: the same path in seconds")
    args = ap.parse_args(argv)
    if args.smoke and not args.worker:
        args.n, args.threads, args.memory_limit = 2_000, 1, "512MB"
    if args.worker:
        return worker(args)

    sys.path.insert(0, str(REPO))
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions

    with tempfile.TemporaryDirectory(prefix="abpo-bench-ingest-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        injected: Counter = Counter()
        for i, start in enumerate(range(0, args.n, PART_ROWS)):
            table, inj = synthetic_impressions(
                min(PART_ROWS, args.n - start),
                MONTH,
                seed=args.seed + i,
                violation_rate=args.violation_rate,
                id_prefix=f"p{i}-",
            )
            write_impressions(table, tmp / "landing", MONTH, part=f"{i:04d}")
            injected.update(inj)
            del table
        print(
            f"rows: {args.n:,} in {i + 1} landing file(s); generate + write Parquet (not timed): "
            f"{time.perf_counter() - t:.1f}s; load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores"
        )

        runs = {"now": (REPO, str(tmp / "landing"))}
        if args.baseline.lower() != "none":
            runs = {
                f"baseline {args.baseline}": (checkout(args.baseline, tmp / "baseline"), str(tmp / "landing")),
                **runs,
            }
        server = None
        if args.object_store:
            server, uri = object_store(tmp / "landing")
            runs["now-s3 (landing in a local S3 server)"] = (REPO, uri)
        results = {}
        try:
            run_all(args, runs, results, injected, tmp)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
        if len(results) >= 2 and args.baseline.lower() != "none":
            (_, base), (_, now), *_ = results.items()
            assert base["quarantined"] == now["quarantined"] and base["batches"] == now["batches"]
            print(
                f"\nsame quarantine counts and batch count; end to end now/baseline: "
                f"{base['total_s'] / now['total_s']:.1f}x (ingest {base['ingest_s'] / now['ingest_s']:.1f}x)"
            )
    return 0


def object_store(landing: Path):
    """A moto S3 server on a free port of 127.0.0.1 holding ``landing``'s month partition (and its _SUCCESS marker)
    in bucket ``bench``; its AWS_* variables set in this process's environment (the workers inherit them). Returns
    (the server process, the landing URI)."""
    import socket
    import urllib.request

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    part = landing / "impressions" / f"month={MONTH}"
    t = time.perf_counter()
    for f in sorted(part.iterdir()):
        client.upload_file(str(f), "bench", f"landing/impressions/month={MONTH}/{f.name}")
    client.put_object(Bucket="bench", Key=f"landing/impressions/month={MONTH}/_SUCCESS", Body=b"")
    print(f"uploaded to {endpoint} (not timed): {time.perf_counter() - t:.1f}s")
    return proc, "s3://bench/landing"


def run_all(args, runs: dict, results: dict, injected: Counter, tmp: Path) -> None:
    from abpo.data.synthetic import DEFAULT_ARMS

    for label, (root, landing) in runs.items():
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--code-root",
            str(root),
            "--landing",
            landing,
            "--work",
            str(tmp),
            "--label",
            label.split()[0],
            "--arms",
            ",".join(DEFAULT_ARMS),
            "--batch-size",
            str(args.batch_size),
            "--seed",
            str(args.seed),
            "--memory-limit",
            args.memory_limit,
            "--threads",
            str(args.threads),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp).stdout
        r = results[label] = json.loads(out.strip().splitlines()[-1])
        expected = {rule: injected.get(rule, 0) for rule in r["quarantined"]}
        assert r["quarantined"] == expected, (label, r["quarantined"], expected)
        print(
            f"\n{label}: {r['rows_clean']:,} clean, {sum(r['quarantined'].values()):,} quarantined (per rule = "
            f"the injected violations); {r['batches']:,} batches of {args.batch_size} ({r['how']})"
        )
        print(f"  ingest + quarantine : {r['ingest_s']:7.2f}s  {args.n / r['ingest_s']:>12,.0f} rows/s")
        if r["batches_s"]:  # the baseline: strata, then batches
            print(f"  strata (2 queries)  : {r['strata_s']:7.2f}s  {r['rows_clean'] / r['strata_s']:>12,.0f} rows/s")
            print(f"  stratified batches  : {r['batches_s']:7.2f}s  {r['rows_clean'] / r['batches_s']:>12,.0f} rows/s")
        else:
            print(
                f"  stratified batches  : {r['strata_s']:7.2f}s  {r['rows_clean'] / r['strata_s']:>12,.0f} rows/s "
                "(strata and batches in one streamed query)"
            )
        print(
            f"  end to end          : {r['total_s']:7.2f}s  {args.n / r['total_s']:>12,.0f} rows/s; "
            f"peak memory {r['peak_mib']:,.0f} MiB"
        )


if __name__ == "__main__":
    sys.exit(main())
