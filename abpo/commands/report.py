"""`abpo report`: the A/B report from the warehouse (--months) or from a CSV of counts (--csv)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "report",
        parents=[common],
        help="Write the A/B report (HTML, Markdown, PNG, JSON) for some months.",
        description="Write the A/B report: impressions, clicks and CTR per arm and month, the candidate arm "
        "(report.candidate_arm) against every other arm (pooled two-proportion z-test, user-clustered "
        "delta-method test, confidence intervals, Holm correction), month-to-month trends, the whole-period "
        "aggregate and a sample-ratio-mismatch check. Reads the DuckDB warehouse (--months, logged to "
        "MLflow as artifacts of the month's run) or a CSV with header month,arm,impressions,clicks[,users] "
        "(--csv). Writes report.html (self-contained), report.md, ctr_by_arm.png and report.json; months the "
        "simulator served add the section of its expected CTR per arm and month (the figures their serve step "
        "stored under <paths.root>/sim/expected_ctr/), with expected_ctr.png and expected_ctr.json.",
    )
    p.add_argument(
        "--months",
        metavar="SPEC",
        help="Months to report: 2026-02..2026-04 (inclusive range), 2026-02,2026-04 or 2026-03. "
        "Required with the warehouse; with --csv it selects months of the file (default: all).",
    )
    p.add_argument(
        "--csv",
        metavar="FILE",
        help="Read counts from this CSV (header month,arm,impressions,clicks, optionally users) "
        "instead of the warehouse.",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="Output directory (default: <paths.reports>/<first>..<last> or <paths.reports>/csv-<name>); checked "
        "before anything is read: a directory abpo can create or write in.",
    )
    p.add_argument(
        "--mlflow",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Log the files to MLflow (default: yes for the warehouse, no for --csv).",
    )
    p.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace, cfg: Config) -> int:
    from abpo.abtest.analysis import ReportInputError
    from abpo.abtest.inputs import CSVFormatError, parse_months
    from abpo.abtest.render import headline, srm_verdict
    from abpo.abtest.report import report_from_csv, report_from_warehouse
    from abpo.errors import writable_dir

    # where the files go, refused before any work (an existing file, a file in the way, no permission)
    if args.out:
        writable_dir(args.out, "--out")
    else:
        writable_dir(cfg.paths.resolve("reports"), "paths.reports")
    try:
        months = parse_months(args.months) if args.months else None
        if args.csv:
            report, files = report_from_csv(cfg, args.csv, args.out, months=months, log_mlflow=bool(args.mlflow))
        else:
            if months is None:
                print("abpo report: give --months (e.g. 2026-02..2026-04) or --csv FILE", file=sys.stderr)
                return 2
            report, files = report_from_warehouse(cfg, months, args.out, log_mlflow=args.mlflow is None or args.mlflow)
    except (CSVFormatError, ReportInputError, ValueError) as e:
        print(f"abpo report: {e}", file=sys.stderr)
        return 2
    for line in headline(report):
        print(line)
    print(srm_verdict(report))
    for n in report.notes:
        print(f"note: {n}")
    print(f"report: {files.html}")
    print(f"        {files.markdown}")
    print(f"        {files.png}")
    print(f"        {files.json}")
    return 0
