"""`abpo ingest` and `abpo restore-month`: one month of landed impressions into the warehouse (write, audit,
publish: abpo.warehouse.ingest_with_config) and a replaced month put back (abpo.warehouse history). Registered beside
`abpo data` (abpo.commands.data)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ingest",
        parents=[common],
        help="Ingest one month of landed impressions: write, audit (replace guard + GX), then publish.",
        description="Write, audit, publish the month's landing files into the DuckDB warehouse. Write: stage the "
        "files (a corrupt file is named) and apply the contract; rows breaking it go to quarantine with their rule. "
        "Audit, on the staged rows: a month holding clean rows is not replaced by none or by fewer than "
        "data.ingest_min_keep_fraction of them unless --force, and the Great Expectations suite must pass. Publish "
        "(one transaction): the replaced rows move to impressions_history (`abpo restore-month`), the month's "
        "partition and quarantine are replaced. A failed audit publishes nothing. Prints counts in / clean / "
        "quarantined per rule. Exit code 1 if the files cannot be ingested or the audit refuses them.",
    )
    p.add_argument("--month", required=True, type=month_arg, help="Month to ingest, YYYY-MM.")
    p.add_argument(
        "--landing",
        default=None,
        help="Landing directory or object-store URI (s3://bucket/prefix; default: paths.landing).",
    )
    p.add_argument("--no-validate", action="store_true", help="Skip the Great Expectations suite in the audit.")
    p.add_argument(
        "--force",
        action="store_true",
        help="Publish even when the month would shrink below data.ingest_min_keep_fraction (or to 0 rows).",
    )
    p.add_argument(
        "--force-month-order",
        action="store_true",
        help="Ingest a month older than the last completed month that was never ingested (a backfill; "
        "refused otherwise: it would block the next month until its own cycle completes).",
    )
    p.set_defaults(handler=cmd_ingest)

    p = sub.add_parser(
        "restore-month",
        parents=[common],
        help="Put back the previous version of a month that a later ingest replaced.",
        description="Restore a replaced version of MONTH from impressions_history (default: the newest). The rows it "
        "replaces become a history version themselves, so a restore can be undone by restoring again. Without "
        "--version and with --list, print the month's kept versions.",
    )
    p.add_argument("--month", required=True, type=month_arg, help="YYYY-MM")
    p.add_argument("--version", type=int, default=None, help="History version to restore (default: the newest).")
    p.add_argument("--list", action="store_true", help="Only list the month's kept versions.")
    p.set_defaults(handler=cmd_restore_month)


def cmd_restore_month(args, cfg: Config) -> int:
    from abpo.warehouse import IngestError, open_warehouse

    with open_warehouse(cfg) as wh:
        if args.list:
            for r in wh.month_versions(args.month):
                print(f"{args.month} version {r['version']}: {r['rows']} rows, replaced at {r['replaced_at']}")
            return 0
        try:
            out = wh.restore_month(args.month, args.version)
        except IngestError as e:
            print(f"abpo restore-month: {e}", file=sys.stderr)
            return 1
    print(f"{out['month']}: restored history version {out['restored_version']} ({out['rows']} clean rows)")
    return 0


def cmd_ingest(args, cfg: Config) -> int:
    from abpo.arms.versions import registered_versions
    from abpo.monthly.report import require_month_order
    from abpo.warehouse import IngestError, ingest_with_config

    month = args.month  # checked by argparse (abpo.months.month_arg)
    require_month_order(cfg, str(month), force=args.force_month_order)  # MonthOutOfOrder: one line, exit 2
    try:
        report, path = ingest_with_config(
            cfg,
            month,
            landing=args.landing,
            force=args.force,
            validate=not args.no_validate,
            model_versions=registered_versions(cfg),  # a row's model_version names its arm's registered version
        )
    except IngestError as e:
        print(f"abpo ingest: {e}", file=sys.stderr)
        return 1
    print(report)
    if report.audit is not None:
        print(report.audit)
    print(f"warehouse: {path}")
    return 0
