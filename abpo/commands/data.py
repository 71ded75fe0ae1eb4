"""`abpo data ...`: dataset preparation (abpo.data.prepare), synthetic landing data, the warehouse's CTR and per-user
aggregates. `abpo ingest` and `abpo restore-month`: abpo.commands.ingest, registered after it."""

from __future__ import annotations

import argparse
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

    # `abpo ingest` and `abpo restore-month` (abpo.commands.ingest) register after `abpo data`, where they were listed
    # (they belong in abpo.cli.COMMAND_MODULES, which another change holds at the time of writing)
    from abpo.commands import ingest

    ingest.register(sub, common)


def cmd_prepare(args, cfg: Config) -> int:
    from abpo.data.loaders import load_dataset
    from abpo.data.prepare import build_sets, write_prepare_report
    from abpo.data.splits import split_users

    ds = load_dataset(cfg.data)
    print(f"loaded {ds!r}" + (f" notes={ds.notes}" if ds.notes else ""))
    splits, report = split_users(ds, cfg.data)
    print(report)
    sup, bandit, ev, checked = build_sets(splits, ds, cfg.data)
    print(
        f"D_sup {len(sup)} prompts, bandit requests {len(bandit)}, eval {len(ev)} "
        f"(M_train={cfg.data.train_candidates}, M_eval={cfg.data.eval_candidates}, seed={cfg.data.seed}); "
        f"held-out target absent from all {checked} training prompts"
    )
    out = cfg.paths.resolve("root") / "data" / "prepare_report.json"
    write_prepare_report(out, ds, report, sup, bandit, ev, cfg.data.seed)
    print(f"wrote {out}")
    return 0


def cmd_synth(args, cfg: Config) -> int:
    from abpo.data.storage import is_uri
    from abpo.errors import writable_dir
    from abpo.warehouse import land_synthetic

    landing = args.landing or cfg.paths.location("landing")
    if not is_uri(landing):  # a local landing zone abpo cannot write in is refused before anything is drawn
        writable_dir(landing, "--landing" if args.landing else "paths.landing")
    rows, path, injected = land_synthetic(cfg, args.month, args.n, args.violation_rate, args.landing)
    print(f"wrote {rows} impressions to {path}; injected violations: {dict(injected) or 'none'}")
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
        months = args.month if args.month else wh.known_months()
        if not months:
            print("no impressions ingested yet")
            return 0
        for b in wh.rebuild_aggregates(months):
            print(f"{b.month}: {b.users} (arm, user) rows, {b.impressions} impressions, {b.clicks} clicks")
        print(f"warehouse: {wh.path}")
    return 0
