"""A moved state's absolute paths rewritten to where it now is (`abpo state relocate`, the loop experiment's
replicates, the test suite's shared pi_init states).

The state's own SQLite MLflow store and its Airflow config hold absolute paths under the directory the state was
made in (MLflow: experiments' artifact locations, runs' artifact URIs, model versions' sources and storage
locations, logged models' artifact locations; Airflow: airflow.cfg's paths under AIRFLOW_HOME = <state>/airflow,
its SQLite connection included, and its metadata database). Used as they are, a copied state would write into the
old directory; abpo refuses to (abpo.registry.StateMoved). :func:`relocate_state` rewrites every such path from the
old directory to ``paths.root``."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from abpo.registry.store import sqlite_path

if TYPE_CHECKING:
    from abpo.config import Config


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


def relocate_state(cfg: Config, old: str | Path, *, dry_run: bool = False) -> dict[str, int]:
    """Rewrite the state's paths from ``old`` to ``paths.root`` (see the module docstring); returns what changed
    (``mlflow.db:table.column`` / ``airflow/<file>`` -> count). ValueError naming the rule when ``old`` is the state
    itself or not absolute."""
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
    db = sqlite_path(cfg.paths.tracking_uri())
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
