"""The warehouse's connection and SQL runner (:class:`WarehouseDB`): the DuckDB file opened with its settings and the
in-memory staging database, the named SQL files of sql/ run with bound parameters, and the transaction helpers. The
warehouse's parts (abpo.warehouse.ingest, history, aggregates, strata, interactions) each hold one and use only
this. Spill files of killed runs are swept when it opens for writing."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Self

import pyarrow as pa

from abpo.paths import SQL_DIR
from abpo.warehouse.errors import (
    SQLFileError,
    WarehouseBusy,
    WarehouseIOError,
    WarehouseSettingError,
    WarehouseUnreadable,
    _io_failure,
    check_memory_limit,
)

log = logging.getLogger("abpo.warehouse")  # the package logs as the one module did
# a line of an SQL file that stands for another file's text (WarehouseDB.sql_text): `-- @include _validate_batch`
INCLUDE_RE = re.compile(r"^--[ \t]*@include[ \t]+([A-Za-z0-9_]+)[ \t]*$\n?", re.MULTILINE)


class WarehouseDB:
    """One DuckDB connection to the warehouse file ``path`` and the runner of the SQL files in ``sql_dir``.

    ``read_only``: a reader (no lock held against a writer's next open, nothing written, no staging database).
    ``memory_limit`` / ``temp_directory`` bound DuckDB's memory and give it a spill directory (created and probed
    here; DuckDB's leftover spill files in it are swept when opened for writing). Another process holding the write
    lock raises WarehouseBusy."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        sql_dir: str | os.PathLike = SQL_DIR,
        read_only: bool = False,
        memory_limit: str = "",
        temp_directory: str | os.PathLike = "",
    ):
        import duckdb

        self.path = Path(path)
        self.sql_dir = Path(sql_dir)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.read_only = bool(read_only)
        # settings go to DuckDB as config values, never into SQL text (a config value is not SQL)
        config: dict[str, str | bool | int | float | list[str]] = {}
        if check_memory_limit(str(memory_limit or "")):
            config["memory_limit"] = str(memory_limit)
        self.temp_directory = str(temp_directory or "")
        if temp_directory:
            _probe_spill_directory(Path(temp_directory))
            config["temp_directory"] = Path(temp_directory).as_posix()
        try:
            self.con = duckdb.connect(str(path), read_only=self.read_only, config=config)
        except duckdb.Error as e:
            first = str(e).splitlines()[0][:300]
            if isinstance(e, duckdb.IOException) and "lock" in first.lower():
                raise WarehouseBusy(
                    f"{path}: the warehouse is in use by another process (DuckDB allows one writer); "
                    f"retry when it has finished ({first})"
                ) from None
            raise WarehouseUnreadable(
                f"{path}: cannot open the warehouse ({type(e).__name__}: {first}); settings {config}"
            ) from e
        if temp_directory and not self.read_only:  # DuckDB's write lock is ours: no other process spills here now
            sweep_spill_files(temp_directory)
        self.con.execute("SET TimeZone = 'UTC'")  # a constant (TimeZone as a connect config needs icu loaded first)
        # the ingest's staging tables and the validation batch live in an in-memory database (buffer-managed: it
        # spills to the temp directory under the memory limit) that this connection's cursors see, so the Great
        # Expectations suite reads them through SQL (abpo/validation.py); none of it is written to the warehouse file.
        # A read-only connection never ingests, and DuckDB refuses an in-memory database in read-only mode.
        if not self.read_only:
            self.con.execute("ATTACH IF NOT EXISTS ':memory:' AS staging")

    # ------------------------------------------------------------------------------------ runner
    def sql_text(self, name: str, *, _including: tuple[str, ...] = ()) -> str:
        """The text of sql/<name>.sql, its includes expanded: a line ``-- @include <part>`` is replaced by the text
        of sql/<part>.sql (a part shared by several files, named with a leading ``_``: e.g. _validate_batch.sql, the
        batch of validate_month.sql and validate_staged.sql), itself expanded. A file that is missing, or includes
        itself through its parts, raises SQLFileError naming it."""
        path = self.sql_dir / f"{name}.sql"
        if not path.is_file():
            known = sorted(p.stem for p in self.sql_dir.glob("*.sql") if not p.stem.startswith("_"))
            where = f" (included by {self.sql_dir / (_including[-1] + '.sql')})" if _including else ""
            raise SQLFileError(f"{path}: no such SQL file{where} (known: {known})")
        if name in _including:
            raise SQLFileError(
                f"{path}: included again through {' -> '.join(_including + (name,))}; rule: an SQL "
                "file's includes form no cycle"
            )
        return INCLUDE_RE.sub(lambda m: self.sql_text(m.group(1), _including=_including + (name,)), path.read_text())

    def run(self, name: str, **params) -> pa.Table:
        """Execute sql/<name>.sql with ``params`` bound to its ``$name`` placeholders; return the last
        statement's result (an empty table for statements that return nothing)."""
        text = self.sql_text(name)
        try:
            rel = self.con.sql(text, params=params or None)
            return rel.to_arrow_table() if rel is not None else pa.table({})
        except Exception as e:  # duckdb.Error and friends: say which file
            if _io_failure(e):
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                raise WarehouseIOError(
                    f"{self.sql_dir / (name + '.sql')}: reading or writing the warehouse {self.path} failed "
                    f"({type(e).__name__}: {first}); rule: the warehouse file must be whole and its disk writable "
                    "with free space (a truncated or corrupt file: restore it from a backup)"
                ) from e
            raise SQLFileError(f"{self.sql_dir / (name + '.sql')}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ transactions
    def commit(self, what: str) -> None:
        """Commit, naming ``what`` when DuckDB cannot (the WAL or the file cannot be written: a full disk)."""
        import duckdb

        try:
            self.con.commit()
        except duckdb.Error as e:
            raise SQLFileError(
                f"{what} (writing {self.path}): {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            ) from e

    def rollback_after(self, error: BaseException) -> None:
        """Roll the open transaction back; a rollback that fails too (a database DuckDB invalidated after a disk-full
        error) is logged, and the caller re-raises ``error``, the failure that matters."""
        try:
            self.con.rollback()
        except Exception as e:  # noqa: BLE001
            log.info("%s: rollback after %s failed too: %s", self.path, type(error).__name__, e)

    # ------------------------------------------------------------------------------------ queries
    def months(self) -> list[str]:
        """The months of the clean impressions, ascending."""
        return [r[0] for r in self.con.execute("SELECT DISTINCT month FROM impressions ORDER BY 1").fetchall()]


def _probe_spill_directory(d: Path) -> None:
    """Create the spill directory ``d`` and check that it is writable (WarehouseSettingError naming the key)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".abpo-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise WarehouseSettingError(
            f"data.warehouse_temp_directory {str(d)!r}: cannot create or write the spill "
            f"directory ({e.strerror or e}); rule: a directory DuckDB can write (relative to paths.root "
            "unless absolute)"
        ) from e


def sweep_spill_files(temp_directory: str | os.PathLike, *, min_age_seconds: float = 60.0) -> list[Path]:
    """Remove DuckDB's leftover spill files from the spill directory: a killed ingest leaves its spill behind (6.7 GB
    for a killed 10M-row ingest). DuckDB names them ``duckdb_temp_<pid>_<n>_...``; a file whose process is gone is
    left over. Called when a warehouse opens for writing with that directory (DuckDB's file lock then keeps every
    other process off the warehouse); a file of a live process, or one whose name carries no pid and is younger
    than ``min_age_seconds``, is kept (a directory shared by two warehouses). Returns the removed paths (logged)."""
    d = Path(temp_directory)
    removed: list[Path] = []
    if not d.is_dir():
        return removed
    now = time.time()
    for p in d.iterdir():
        if not p.name.startswith("duckdb_temp") or not p.is_file() or p.is_symlink():
            continue
        m = re.match(r"duckdb_temp_(\d+)_", p.name)
        try:
            if m is not None and int(m.group(1)) != os.getpid() and _process_alive(int(m.group(1))):
                continue
            if m is not None and int(m.group(1)) == os.getpid():
                continue
            if m is None and now - p.stat().st_mtime < min_age_seconds:
                continue
            p.unlink()
            removed.append(p)
        except OSError:  # raced with DuckDB or another sweeper: leave it
            continue
    if removed:
        log.warning("%s: removed %d leftover DuckDB spill file(s) of an earlier run", d, len(removed))
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True
