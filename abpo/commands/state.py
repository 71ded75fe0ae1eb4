"""`abpo state relocate`: make a copied or restored state directory (``var/``) usable where it now is.

The state's own SQLite MLflow store and its Airflow config hold absolute paths under the directory the state was
made in (MLflow: experiments' artifact locations, runs' artifact URIs, model versions' sources and storage
locations, logged models' artifact locations; Airflow: airflow.cfg's paths under AIRFLOW_HOME = <state>/airflow,
its SQLite connection included, and its metadata database). Used as they are, a copied state would write into the old directory; abpo refuses
to (abpo.registry.StateMoved). This command rewrites every such path from the old directory to ``paths.root``."""

from __future__ import annotations

import argparse
import contextlib
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

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


def _replace_path(text: str, old: str, new: str) -> str:
    """``text`` with every ``old`` that is a whole path (followed by '/', the end or a character no path segment
    here holds) replaced by ``new``."""
    return re.sub(re.escape(old) + r"(?=/|$|[\s\"',;)\]?#])", lambda _: new, text)


def rewrite_sqlite(db: Path, pairs: list[tuple[str, str]], *, dry_run: bool = False) -> dict[str, int]:
    """Replace each (old, new) path of ``pairs`` in every text value of the SQLite file ``db``; returns
    ``table.column -> values changed``."""
    changed: dict[str, int] = {}
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.create_function("abpo_relocate", 1, lambda v: _apply(v, pairs), deterministic=True)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            cols = [
                r[1]
                for r in con.execute(f'PRAGMA table_info("{t}")')
                if (r[2] or "").upper().split("(")[0] in ("TEXT", "VARCHAR", "CHAR", "CLOB", "")
            ]
            for c in cols:
                where = " OR ".join(f'instr("{c}", ?) > 0' for _ in pairs)
                args = [old for old, _ in pairs]
                n = con.execute(
                    f'SELECT count(*) FROM "{t}" WHERE typeof("{c}") = \'text\' AND ({where})', args
                ).fetchone()[0]
                if not n:
                    continue
                if not dry_run:
                    con.execute(
                        f'UPDATE "{t}" SET "{c}" = abpo_relocate("{c}") WHERE typeof("{c}") = \'text\' AND ({where})',
                        args,
                    )
                changed[f"{t}.{c}"] = n
        if not dry_run:
            con.commit()
    return changed


def _apply(value, pairs: list[tuple[str, str]]):
    if not isinstance(value, str):
        return value
    for old, new in pairs:
        value = _replace_path(value, old, new)
    return value


def relocate(cfg: Config, old: str | Path, *, dry_run: bool = False) -> dict[str, int]:
    """Rewrite the state's paths from ``old`` to ``paths.root`` (see the module docstring); returns what changed
    (``mlflow.db:table.column`` / ``airflow/<file>`` -> count). ValueError naming the rule when ``old`` is the state
    itself or not absolute."""
    from abpo import registry

    root = cfg.paths.resolve("root")
    old = Path(old)
    if not old.is_absolute():
        raise ValueError(f"--from {old}: rule: the absolute directory the state was copied from")
    if old.resolve() == root.resolve() or old == root:
        raise ValueError(f"--from {old}: rule: another directory than paths.root = {root} (nothing to relocate)")
    pairs = [(str(old), str(root))]
    if quote(str(old)) != str(old):  # file URIs percent-quote what a plain path does not
        pairs.append((quote(str(old)), quote(str(root))))
    out: dict[str, int] = {}
    db = registry.sqlite_path(cfg.paths.tracking_uri())
    if db is not None and db == root / "mlflow.db" and db.is_file():
        out.update({f"mlflow.db:{k}": v for k, v in rewrite_sqlite(db, pairs, dry_run=dry_run).items()})
    home = root / "airflow"
    if (home / "airflow.db").is_file():  # the demo's Airflow metadata (SQLite)
        out.update(
            {
                f"airflow/airflow.db:{k}": v
                for k, v in rewrite_sqlite(home / "airflow.db", pairs, dry_run=dry_run).items()
            }
        )
    for f in sorted([*home.glob("*.cfg"), *home.glob("*.json")]) if home.is_dir() else []:
        text = f.read_text()
        new = _apply(text, pairs)
        if new != text:
            out[f"airflow/{f.name}"] = sum(text.count(o) for o, _ in pairs)
            if not dry_run:
                f.write_text(new)
    return out


def run(args: argparse.Namespace, cfg: Config) -> int:
    from abpo import registry

    old = args.old or registry.moved_from(cfg)
    if not old:
        print(
            f"abpo state relocate: {cfg.paths.resolve('root')}: the MLflow store names no other state directory; "
            "nothing to relocate (give --from OLD to rewrite the Airflow files anyway)"
        )
        return 0
    out = relocate(cfg, old, dry_run=args.dry_run)
    verb = "would change" if args.dry_run else "changed"
    for k, n in out.items():
        print(f"  {k}: {n}")
    print(
        f"abpo state relocate: {old} -> {cfg.paths.resolve('root')}: {verb} {sum(out.values())} value(s) in "
        f"{len(out)} place(s)"
    )
    return 0
