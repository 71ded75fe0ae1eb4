"""`abpo data ...` and `abpo ingest`: dataset preparation, synthetic landing data, monthly ingest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from abpo.months import month_arg

if TYPE_CHECKING:
    from abpo.config import Config


MAX_SYNTH_ROWS = 100_000_000  # a month far larger than a synthetic trial needs (about 10 GB in memory)


def _row_count(value: str) -> int:
    """argparse type of ``--n``: an integer in [1, MAX_SYNTH_ROWS] (argparse's one-line error otherwise)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n {value!r}: rule: an integer") from None
    if not 1 <= n <= MAX_SYNTH_ROWS:
        raise argparse.ArgumentTypeError(f"--n {value}: rule: an integer from 1 to {MAX_SYNTH_ROWS:,}")
    return n


def _share(value: str) -> float:
    """argparse type of ``--violation-rate``: a number in [0, 1]."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--violation-rate {value!r}: rule: a number in [0, 1]") from None
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"--violation-rate {value}: rule: a number in [0, 1]")
    return x


def register(sub, common: argparse.ArgumentParser) -> None:
    data = sub.add_parser(
        "data",
        help="Dataset preparation and landing-zone utilities (prepare, synth, ctr, rebuild-aggregates).",
        description="Dataset preparation (load, split, candidate sets) and landing-zone utilities.",
    )
    dsub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    p = dsub.add_parser(
        "prepare",
        parents=[common],
        help="Load the dataset, split users, build D_sup / bandit requests / eval sets and report counts.",
        description="Load data.dataset_dir (data.format), split every user into x_{1:T} / update range / "
        "held-out target, build D_sup, the bandit requests and the evaluation candidate sets, check the "
        "held-out target never reaches a training prompt, print the counts (skipped users by reason) and "
        "save them as JSON under paths.root/data/.",
    )
    p.set_defaults(handler=cmd_prepare)

    p = dsub.add_parser(
        "synth",
        parents=[common],
        help="Land N synthetic impressions for a month (for trying the ingest; not a traffic simulator).",
        description="Write N synthetic impressions (IMPRESSIONS_SCHEMA, random users/items, a share of "
        "contract violations if asked) into landing/impressions/month=YYYY-MM/part-synthetic.parquet.",
    )
    p.add_argument("--month", required=True, type=month_arg, help="Month to land, YYYY-MM.")
    p.add_argument("--n", type=_row_count, default=100_000, help="Number of impressions (default 100000).")
    p.add_argument(
        "--violation-rate", type=_share, default=0.01, help="Share of rows breaking one rule, in [0, 1] (default 0.01)."
    )
    p.add_argument(
        "--landing",
        default=None,
        help="Landing directory or object-store URI (s3://bucket/prefix; default: paths.landing).",
    )
    p.set_defaults(handler=cmd_synth)

    p = dsub.add_parser(
        "ctr",
        parents=[common],
        help="Print impressions, clicks, users and CTR per arm and month from the warehouse.",
        description="Print sql/ctr_by_arm_month.sql over the clean impressions (all months, or --month ...).",
    )
    p.add_argument(
        "--month", action="append", type=month_arg, default=None, help="Restrict to this month (repeatable)."
    )
    p.set_defaults(handler=cmd_ctr)

    p = dsub.add_parser(
        "rebuild-aggregates",
        parents=[common],
        help="Rebuild (or --check) the per-user aggregate user_month_stats the A/B report reads.",
        description="Rebuild user_month_stats (clean impressions summed per month, arm and user; what "
        "`abpo report` reads) from the clean impressions, for the --month(s) given or every month, in one "
        "transaction. Ingest keeps it current and opening the warehouse rebuilds months it knows to be "
        "stale (a warehouse from before the aggregate, a month ingested by older code); this is for rows "
        "written into `impressions` by other means. --check compares it with the raw rows instead (a full "
        "scan) and exits 1 on any difference.",
    )
    p.add_argument(
        "--month", action="append", type=month_arg, default=None, help="Only this month (repeatable; default: all)."
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="Do not rebuild: compare the aggregate with the raw clean impressions, exit 1 if they differ.",
    )
    p.set_defaults(handler=cmd_rebuild_aggregates)

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


def cmd_prepare(args, cfg: Config) -> int:
    from abpo.data.candidates import (
        assert_target_held_out,
        build_bandit_requests,
        build_eval_examples,
        build_sup_examples,
    )
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    ds = load_dataset(cfg.data)
    print(f"loaded {ds!r}" + (f" notes={ds.notes}" if ds.notes else ""))
    splits, report = split_users(ds, cfg.data)
    print(report)
    sup = build_sup_examples(splits, ds, cfg.data)
    bandit = build_bandit_requests(splits, ds, cfg.data)
    ev = build_eval_examples(splits, ds, cfg.data)
    checked = assert_target_held_out(splits, sup, bandit)
    print(
        f"D_sup {len(sup)} prompts, bandit requests {len(bandit)}, eval {len(ev)} "
        f"(M_train={cfg.data.train_candidates}, M_eval={cfg.data.eval_candidates}, seed={cfg.data.seed}); "
        f"held-out target absent from all {checked} training prompts"
    )
    out = cfg.paths.resolve("root") / "data" / "prepare_report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "dataset": ds.name,
                "items": ds.catalog.num_rows,
                "interactions": ds.interactions.num_rows,
                "loader_notes": ds.notes,
                "split": report.as_dict(),
                "skipped_users": report.skipped_users,
                "sup_examples": len(sup),
                "bandit_requests": len(bandit),
                "eval_examples": len(ev),
                "seed": cfg.data.seed,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


def cmd_synth(args, cfg: Config) -> int:
    from abpo.data.schemas import write_impressions
    from abpo.data.storage import is_uri
    from abpo.data.synthetic import synthetic_impressions
    from abpo.errors import writable_dir
    from abpo.warehouse import config_catalog

    landing = args.landing or cfg.paths.location("landing")
    if not is_uri(landing):  # a local landing zone abpo cannot write in is refused before anything is drawn
        writable_dir(landing, "--landing" if args.landing else "paths.landing")
    catalog = config_catalog(cfg)  # the ingest checks the items against it (item_not_in_catalog)
    table, injected = synthetic_impressions(
        args.n,
        args.month,
        seed=cfg.data.seed,
        arms=tuple(cfg.data.known_arms),
        violation_rate=args.violation_rate,
        item_ids=catalog,
        n_items=min(5_000, len(catalog)),
    )
    path = write_impressions(table, landing, args.month, part="synthetic")
    print(f"wrote {table.num_rows} impressions to {path}; injected violations: {dict(injected) or 'none'}")
    return 0


def cmd_ingest(args, cfg: Config) -> int:
    from abpo.monthly.report import require_month_order
    from abpo.warehouse import IngestError, ingest_with_config

    month = args.month  # checked by argparse (abpo.months.month_arg)
    require_month_order(cfg, str(month), force=args.force_month_order)  # MonthOutOfOrder: one line, exit 2
    try:
        report, path = ingest_with_config(
            cfg, month, landing=args.landing, force=args.force, validate=not args.no_validate
        )
    except IngestError as e:
        print(f"abpo ingest: {e}", file=sys.stderr)
        return 1
    print(report)
    if report.audit is not None:
        print(report.audit)
    print(f"warehouse: {path}")
    return 0


def cmd_ctr(args, cfg: Config) -> int:
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg) as wh:
        rows = wh.ctr_by_arm_month(args.month).to_pylist()
    if not rows:
        print("no impressions ingested yet")
        return 0
    print(f"{'month':8s} {'arm':12s} {'impressions':>12s} {'clicks':>9s} {'users':>8s} {'ctr':>8s}")
    for r in rows:
        print(
            f"{r['month']:8s} {r['arm']:12s} {r['impressions']:>12d} {r['clicks']:>9d} {r['users']:>8d} {r['ctr']:>8.4f}"
        )
    return 0


def cmd_rebuild_aggregates(args, cfg: Config) -> int:
    from abpo.warehouse import open_warehouse

    with open_warehouse(cfg) as wh:
        for b in wh.aggregates_rebuilt:
            print(f"on open: rebuilt {b.month} ({b.reason})")
        if args.check:
            diff = wh.check_aggregates(args.month).to_pylist()
            for r in diff:
                print(
                    f"{r['month']} {r['arm']}: raw users/impressions/clicks "
                    f"{r['raw_users']}/{r['raw_impressions']}/{r['raw_clicks']}, aggregate "
                    f"{r['aggregate_users']}/{r['aggregate_impressions']}/{r['aggregate_clicks']}"
                )
            scope = ", ".join(args.month) if args.month else "all months"
            print(f"user_month_stats {'differs from' if diff else 'matches'} the clean impressions ({scope})")
            return 1 if diff else 0
        months = args.month if args.month else [r["month"] for r in wh.run("impression_months").to_pylist()]
        if not months:
            print("no impressions ingested yet")
            return 0
        for b in wh.rebuild_aggregates(months):
            print(f"{b.month}: {b.users} (arm, user) rows, {b.impressions} impressions, {b.clicks} clicks")
        print(f"warehouse: {wh.path}")
    return 0
