"""`abpo state relocate`: make a copied or restored state directory (``var/``) usable where it now is. The rewrite
of the paths it holds (MLflow store, Airflow home) is abpo.registry.relocate's; this module parses and prints."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abpo.config import Config


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("state", parents=[common], help="Operate on the state directory (paths.root, $ABPO_STATE).")
    ssub = p.add_subparsers(dest="state_command", metavar="ACTION", required=True)
    r = ssub.add_parser(
        "relocate",
        parents=[common],
        help="Rewrite the absolute paths a copied or restored state holds (MLflow store, airflow.cfg) to paths.root.",
        description="Rewrite every path under OLD (the directory the state was copied from) to paths.root "
        "($ABPO_STATE) in the state's SQLite MLflow store (<root>/mlflow.db: every text column: experiments' artifact "
        "locations, runs' artifact URIs, model versions' source and storage location, logged models' artifact "
        "locations, tags and params naming files), in the Airflow home's SQLite metadata (<root>/airflow/airflow.db) "
        "and text files (<root>/airflow/*.cfg, *.json). Without --from, OLD is read from the store's experiments. Prints what changed; a second run "
        "changes nothing. Run it with nothing else using the state.",
    )
    r.add_argument(
        "--from",
        dest="old",
        default="",
        help="The directory the state was copied from (default: read from the MLflow store).",
    )
    r.add_argument("--dry-run", action="store_true", help="Count what would change; write nothing.")
    r.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo import registry

    old = args.old or registry.moved_from(cfg)
    if not old:
        print(
            f"abpo state relocate: {cfg.paths.resolve('root')}: the MLflow store names no other state directory; "
            "nothing to relocate (give --from OLD to rewrite the Airflow files anyway)"
        )
        return 0
    out = registry.relocate_state(cfg, old, dry_run=args.dry_run)
    verb = "would change" if args.dry_run else "changed"
    for k, n in out.items():
        print(f"  {k}: {n}")
    print(
        f"abpo state relocate: {old} -> {cfg.paths.resolve('root')}: {verb} {sum(out.values())} value(s) in "
        f"{len(out)} place(s)"
    )
    return 0
