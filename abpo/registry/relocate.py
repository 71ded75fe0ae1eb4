"""A moved state's absolute paths rewritten to where it now is (`abpo state relocate`, the loop experiment's
replicates, the test suite's shared pi_init states).

The state's own SQLite MLflow store and its Airflow config hold absolute paths under the directory the state was
made in (MLflow: experiments' artifact locations, runs' artifact URIs, model versions' sources and storage
locations, logged models' artifact locations; Airflow: airflow.cfg's paths under AIRFLOW_HOME = <state>/airflow,
its SQLite connection included, and its metadata database). Used as they are, a copied state would write into the
old directory; abpo refuses to (abpo.registry.StateMoved). :func:`relocate_state` rewrites every such path from the
old directory to ``paths.root``: only where the old directory is a whole path prefix, and never from a directory that
contains the new root (``--from /`` would rewrite every path, the new state's own included)."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from abpo.errors import UsageError
from abpo.registry.store import sqlite_path

if TYPE_CHECKING:
    from abpo.config import Config


# A stored path is rewritten only where the old directory is a whole path prefix: right before it the value starts,
# or a separator of the formats these stores hold (whitespace, a quote, '=', ',', ';', ':', a bracket) stands, or a
# URI's "scheme://" ("file:///old/..." and "sqlite:////old/...": the old path's own '/' is the URI's last); right
# after it a '/' or the value's end, or a character no path segment here holds. "/mnt/old/var" and "/old/var2" are
# not under "/old/var".
_BEFORE = r"(?:^|(?<=[\s\"'=,;:(\[{<|])|(?<=://)|(?<=:///))"
_AFTER = r"(?=/|$|[\s\"',;)\]}>|?#&])"


def replace_path_prefix(text: str, old: str, new: str) -> tuple[str, int]:
    """(``text`` with every ``old`` that is a whole path prefix, see above, replaced by ``new``; how many)."""
    return re.subn(_BEFORE + re.escape(old) + _AFTER, lambda _: new, text)


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
                changes = f'typeof("{c}") = \'text\' AND ({where}) AND abpo_relocate("{c}") != "{c}"'
                args = [old for old, _ in pairs]
                n = con.execute(f'SELECT count(*) FROM "{t}" WHERE {changes}', args).fetchone()[0]
                if not n:
                    continue
                if not dry_run:
                    con.execute(f'UPDATE "{t}" SET "{c}" = abpo_relocate("{c}") WHERE {changes}', args)
                changed[f"{t}.{c}"] = n
        if not dry_run:
            con.commit()
    return changed


def _apply(value, pairs: list[tuple[str, str]]):
    if not isinstance(value, str):
        return value
    for old, new in pairs:
        value, _ = replace_path_prefix(value, old, new)
    return value


def check_from(old: str | Path, root: Path) -> Path:
    """``old`` (``--from``) as a Path when the state can be relocated from it to ``root``; UsageError naming the
    rule when it is relative, ``root`` itself, or a directory that contains ``root`` (``/`` included: every path under
    it, the new state's own, would be rewritten). Containment compares whole path components: a copy named
    ``base0x`` or ``base0.bak`` beside ``base0`` is not under it (the rewrite itself changes only whole path
    prefixes, :func:`replace_path_prefix`), so its ``--from`` is accepted."""
    given, old = str(old), Path(old)
    if not old.is_absolute():
        raise UsageError(f"--from {given}: rule: the absolute directory the state was copied from")
    if old == root or old.resolve() == root.resolve():
        raise UsageError(f"--from {given}: rule: another directory than paths.root = {root} (nothing to relocate)")
    if root.is_relative_to(old) or root.resolve().is_relative_to(old.resolve()):
        raise UsageError(
            f"--from {given}: contains paths.root = {root}; rule: the directory the state was copied from, not one "
            "above it (every path under it would be rewritten, the new state's own included)"
        )
    return old


def relocate_state(cfg: Config, old: str | Path, *, dry_run: bool = False) -> dict[str, int]:
    """Rewrite the state's paths from ``old`` to ``paths.root`` (see the module docstring); returns what changed
    (``mlflow.db:table.column`` / ``airflow/<file>`` -> values changed). Only whole path prefixes change
    (:func:`replace_path_prefix`); UsageError before anything is read when ``old`` is refused (:func:`check_from`)."""
    root = cfg.paths.resolve("root")
    old = check_from(old, root)
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
        new = f.read_text()
        n = 0
        for o, r in pairs:
            new, k = replace_path_prefix(new, o, r)
            n += k
        if n:
            out[f"airflow/{f.name}"] = n
            if not dry_run:
                f.write_text(new)
    return out
