"""The embedded warehouse: a DuckDB file, and one small runner for the named SQL files in sql/.

Every transform is a readable file ``sql/<name>.sql`` executed by :meth:`Warehouse.run` with bound
parameters (``$name`` in the file, ``name=value`` in Python); no SQL is built by concatenation.

Monthly ingest (:meth:`Warehouse.ingest_month`):
1. the month's landing files are listed and each is checked to be Parquet with the impressions
   schema; a file that is not fails the whole ingest (IngestError names the file and the problem)
   before anything changes;
2. ingest_stage.sql reads them into the in-memory ``staging`` database, ingest_check.sql applies the contract row by
   row and keeps the violations;
3. in ONE transaction the month's clean partition and its quarantined rows are deleted and
   re-inserted (ingest_delete_*.sql, ingest_insert_*.sql), the run is logged (ingest_log_run.sql) and
   the month's per-user aggregate is rebuilt from its clean partition (user_month_stats_*.sql): a rerun
   gives the same rows, never doubles, and a failure midway rolls back to the previous state.

The per-user aggregate ``user_month_stats`` (month, arm, user_id, impressions, clicks) is what the A/B
report reads (sql/report_user_moments.sql), so the report's cost follows the number of user-months, not
of impressions. A warehouse written before the aggregate existed, or a month ingested by code that did
not maintain it, is brought up to date when the warehouse is opened (:meth:`Warehouse.ensure_aggregates`);
``abpo data rebuild-aggregates`` rebuilds or checks it by hand.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from abpo.data import storage
from abpo.data.batching import (  # noqa: F401 - re-exported: abpo.warehouse.stratified_batches etc.
    BatchPlan,
    stratified_batch_plan,
    stratified_batch_tables,
    stratified_batches,
)
from abpo.data.config import DataConfig
from abpo.data.schemas import (
    IMPRESSIONS_SCHEMA,
    INTERACTIONS_SCHEMA,
    LOGGING_POLICY_PATTERN,
    RULES,
    SCHEMA_VERSION,
    SINGLE_CANDIDATE_PROPENSITY_TOLERANCE,
    check_month,
    month_dir,
    month_location,
    schema_problems,
)
from abpo.paths import SQL_DIR

_DATA_DEFAULTS = DataConfig()  # the contract parameters' defaults (section data)
# the Arrow table of user ids the strata's SQL files anti-join (Warehouse.strata: the gate's held-out users)
EXCLUDED_USERS_TABLE = "strata_excluded_users"
log = logging.getLogger(__name__)



class IngestError(RuntimeError):
    """The landing data of a month cannot be ingested at all (missing, not Parquet, wrong schema)."""


class IngestRefused(IngestError):
    """The staged month failed its audit (the replace guard or the Great Expectations suite): nothing was published,
    the month's partition is as it was."""


class WarehouseBusy(RuntimeError):
    """Another process holds the DuckDB file's write lock."""


class WarehouseUnreadable(RuntimeError):
    """The warehouse file cannot be opened (not a DuckDB database, unreadable, a setting DuckDB refuses); the
    message names the file and the setting or the problem."""


class WarehouseSettingError(ValueError):
    """A warehouse setting (data.warehouse_memory_limit) breaks its grammar; the message names the key and the rule."""


# DuckDB's memory_limit: a number and a unit (or a percentage of RAM). Checked here so that a wrong value is a message
# naming the config key, and passed to DuckDB as a config value, never as SQL text.
MEMORY_LIMIT_RE = re.compile(r"[0-9]+(?:\.[0-9]+)? ?(?:[KMGT]i?B|B|%)", re.IGNORECASE)


def check_memory_limit(value: str, key: str = "data.warehouse_memory_limit") -> str:
    """``value`` when it is empty (DuckDB's default) or a size such as ``2GB``, ``1.5GiB``, ``512 MB``, ``60%``."""
    if value and not MEMORY_LIMIT_RE.fullmatch(value):
        raise WarehouseSettingError(f"{key} {value!r}: rule: a size such as 2GB, 1.5GiB or 512MB (units B, KB, MB, GB, "
                                    "TB, KiB, MiB, GiB, TiB), a percentage of RAM such as 60%, or empty for DuckDB's "
                                    "default (80% of RAM)")
    return value


class IngestStepFailed(IngestError):
    """A step of the ingest failed (disk full, the database invalidated, ...): the message names the step's SQL file
    and DuckDB's error; nothing was published."""


class SQLFileError(RuntimeError):
    """A named SQL file is missing or failed; the message names the file."""


class WarehouseIOError(SQLFileError, WarehouseUnreadable):
    """A SQL file failed because the warehouse file could not be read or written (a truncated or corrupt file, a
    full disk): the message names the warehouse file, the SQL file and DuckDB's error on one line. An expected
    error (`abpo` prints one line); the ingest reports it as the step that failed (IngestStepFailed)."""


def _io_failure(error: BaseException) -> bool:
    """Whether a DuckDB error means the file itself failed (not the SQL): IO, corruption, a database invalidated by
    an earlier write failure."""
    import duckdb

    text = str(error)
    return isinstance(error, (duckdb.IOException, duckdb.SerializationException)) or any(
        s in text for s in ("Corrupt database file", "database has been invalidated", "Could not read enough bytes",
                            "No space left on device"))


@dataclass
class IngestReport:
    month: str
    files: list[str]
    rows_in: int = 0
    rows_clean: int = 0
    rows_replaced: int = 0  # clean rows the month held before this ingest
    quarantined_by_rule: dict[str, int] = field(default_factory=lambda: {r: 0 for r in RULES})
    seconds: float = 0.0
    aggregate_rows: int = 0  # (arm, user) rows of the month in user_month_stats
    aggregate_seconds: float = 0.0  # part of `seconds` spent rebuilding them
    audit: object = None  # the audit's summary (abpo.validation.ValidationSummary) when one ran

    @property
    def rows_quarantined(self) -> int:
        return sum(self.quarantined_by_rule.values())

    def as_dict(self) -> dict:
        return {
            "month": self.month,
            "files": self.files,
            "rows_in": self.rows_in,
            "rows_clean": self.rows_clean,
            "rows_quarantined": self.rows_quarantined,
            "rows_replaced": self.rows_replaced,
            "quarantined_by_rule": dict(self.quarantined_by_rule),
            "seconds": round(self.seconds, 3),
            "aggregate_rows": self.aggregate_rows,
            "aggregate_seconds": round(self.aggregate_seconds, 3),
        }

    def __str__(self) -> str:
        lines = [
            f"ingest {self.month}: {len(self.files)} file(s), {self.rows_in} rows in, {self.rows_clean} clean, "
            f"{self.rows_quarantined} quarantined (replaced {self.rows_replaced} clean rows) in {self.seconds:.2f}s"
        ]
        lines += [f"  {rule:26s} {n:>10d}" for rule, n in self.quarantined_by_rule.items()]
        lines.append(f"  per-user aggregate: {self.aggregate_rows} (arm, user) rows rebuilt in {self.aggregate_seconds:.2f}s")
        return "\n".join(lines)


@dataclass
class AggregateBuild:
    """One month of user_month_stats rebuilt from the clean impressions (Warehouse.rebuild_aggregates)."""

    month: str
    reason: str
    users: int  # (arm, user) rows
    impressions: int
    clicks: int


class Warehouse:
    """A DuckDB file holding impressions (clean, by month), quarantine, ingest_runs and the per-user
    aggregate user_month_stats (sql/schema.sql). Opening it brings the aggregate up to date
    (:meth:`ensure_aggregates`; what was rebuilt is in ``aggregates_rebuilt``), unless opened ``read_only`` (readers:
    no lock held against a writer's next open, nothing written). ``memory_limit`` / ``temp_directory`` bound DuckDB's
    memory and give it a spill directory. Another process holding the write lock raises WarehouseBusy."""

    def __init__(self, path: str | os.PathLike, *, sql_dir: str | os.PathLike = SQL_DIR, read_only: bool = False,
                 memory_limit: str = "", temp_directory: str | os.PathLike = ""):
        import duckdb

        self.path = Path(path)
        self.sql_dir = Path(sql_dir)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.read_only = bool(read_only)
        # settings go to DuckDB as config values, never into SQL text (a config value is not SQL)
        config: dict[str, str] = {}
        if check_memory_limit(str(memory_limit or "")):
            config["memory_limit"] = str(memory_limit)
        self._temp_directory = str(temp_directory or "")
        if temp_directory:
            try:
                Path(temp_directory).mkdir(parents=True, exist_ok=True)
                probe = Path(temp_directory) / f".abpo-write-probe-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                raise WarehouseSettingError(
                    f"data.warehouse_temp_directory {str(temp_directory)!r}: cannot create or write the spill "
                    f"directory ({e.strerror or e}); rule: a directory DuckDB can write (relative to paths.root "
                    "unless absolute)") from e
            config["temp_directory"] = Path(temp_directory).as_posix()
        try:
            self.con = duckdb.connect(str(path), read_only=self.read_only, config=config)
        except duckdb.Error as e:
            first = str(e).splitlines()[0][:300]
            if isinstance(e, duckdb.IOException) and "lock" in first.lower():
                raise WarehouseBusy(f"{path}: the warehouse is in use by another process (DuckDB allows one writer); "
                                    f"retry when it has finished ({first})") from None
            raise WarehouseUnreadable(f"{path}: cannot open the warehouse ({type(e).__name__}: {first}); settings "
                                      f"{config}") from e
        if temp_directory and not self.read_only:  # DuckDB's write lock is ours: no other process spills here now
            sweep_spill_files(temp_directory)
        self.con.execute("SET TimeZone = 'UTC'")  # a constant (TimeZone as a connect config needs icu loaded first)
        # the ingest's staging tables and the validation batch live in an in-memory database (buffer-managed: it
        # spills to the temp directory under the memory limit) that this connection's cursors see, so the Great
        # Expectations suite reads them through SQL (abpo/validation.py); none of it is written to the warehouse file.
        # A read-only connection never ingests, and DuckDB refuses an in-memory database in read-only mode.
        if not self.read_only:
            self.con.execute("ATTACH IF NOT EXISTS ':memory:' AS staging")
        self.aggregates_rebuilt: list[AggregateBuild] = []
        if self.read_only:
            return
        try:
            self.run("schema")
            self.aggregates_rebuilt = self.ensure_aggregates()
        except BaseException:
            self.con.close()
            raise

    # ------------------------------------------------------------------------------------ runner
    def sql_text(self, name: str) -> str:
        path = self.sql_dir / f"{name}.sql"
        if not path.is_file():
            known = sorted(p.stem for p in self.sql_dir.glob("*.sql"))
            raise SQLFileError(f"{path}: no such SQL file (known: {known})")
        return path.read_text()

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
                    "with free space (a truncated or corrupt file: restore it from a backup)") from e
            raise SQLFileError(f"{self.sql_dir / (name + '.sql')}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ ingest
    @staticmethod
    def landing_files(landing_dir: str | os.PathLike, month: str) -> list[Path] | list[str]:
        """The month's landing files; each must be Parquet with the impressions schema (IngestError
        otherwise). Hidden files and markers (names starting with '.' or '_') are ignored. An object-store landing
        zone (a URI) gives the objects' URIs (:meth:`remote_landing_files`)."""
        if storage.is_uri(landing_dir):
            return Warehouse.remote_landing_files(str(landing_dir), month)
        d = month_dir(landing_dir, month)
        if not d.is_dir():
            raise IngestError(f"{d}: no landing partition for month {month}")
        if d.is_symlink():
            raise IngestError(f"{d}: a symbolic link (to {os.readlink(d)}); rule: the landing partition is a real "
                              "directory")
        files = sorted(p for p in d.iterdir() if not p.name.startswith((".", "_")))
        if not files:
            raise IngestError(f"{d}: the landing partition holds no files")
        for p in files:
            if p.is_symlink():  # its rows would be recorded under the target's name, from outside the landing zone
                raise IngestError(f"{p}: a symbolic link (to {os.readlink(p)}); rule: the landing partition holds "
                                  "regular Parquet files only")
            if not p.is_file():
                raise IngestError(f"{p}: not a file (the landing partition holds Parquet files only)")
            try:
                schema = pq.read_schema(p)
            except (pa.ArrowInvalid, OSError) as e:
                raise IngestError(f"{p}: not a Parquet file ({e})") from e
            problems = schema_problems(schema, IMPRESSIONS_SCHEMA)
            if problems:
                raise IngestError(f"{p}: wrong schema: " + "; ".join(problems))
        return files

    @staticmethod
    def remote_landing_files(landing: str, month: str, kind: str = "impressions",
                             schema: pa.Schema = IMPRESSIONS_SCHEMA) -> list[str]:
        """The URIs of an object-store partition's Parquet objects, each checked (footer and schema) as the local
        files are. IngestError, one line naming the URI: a missing bucket, denied access, no partition, a partition
        without its completion marker ($ABPO_LANDING_MARKER, default _SUCCESS: an upload still running or cut
        short), an object that is not whole Parquet (a truncated upload), a wrong schema."""
        d = month_location(landing, check_month(month), kind)
        try:
            listed = storage.listdir(d)
            if listed is None:
                raise IngestError(f"{d}: no landing partition for month {month}")
            names = {storage.basename(u) for u in listed}
            files = [u for u in listed if not storage.basename(u).startswith((".", "_"))]
            if not files:
                raise IngestError(f"{d}: the landing partition holds no files")
            marker = storage.landing_marker()
            if kind == "impressions" and marker and marker not in names:
                raise IngestError(f"{d}: {len(files)} object(s) but no {marker} marker; rule: an object-store "
                                  f"partition is read once its producer has written {marker} last (a partial or "
                                  "running upload is never ingested; $ABPO_LANDING_MARKER names the marker)")
            for u in files:
                try:
                    with storage.open_input(u) as f:
                        got = pq.read_schema(f)
                except pa.ArrowInvalid as e:
                    raise IngestError(f"{u}: not a whole Parquet object ({e}); a truncated or partial upload is "
                                      "never ingested") from None
                problems = schema_problems(got, schema)
                if problems:
                    raise IngestError(f"{u}: wrong schema: " + "; ".join(problems))
        except storage.StorageError as e:
            raise IngestError(str(e)) from None
        return files

    def ingest_month(
        self, landing_dir: str | os.PathLike, month: str, known_arms: Sequence[str], *, force: bool = False,
        min_keep_fraction: float = 0.5, audit=None, min_propensity: float = _DATA_DEFAULTS.min_propensity,
        max_clock_skew_seconds: float = _DATA_DEFAULTS.max_clock_skew_seconds,
        max_quarantine_fraction: float = _DATA_DEFAULTS.max_quarantine_fraction,
        catalog: Iterable[int] | None = None,
    ) -> IngestReport:
        """Write, audit, publish ``month``'s landing files.

        write    stage the files (a corrupt one is named) and apply the contract: violations go to quarantine
        audit    refuse (IngestRefused, nothing published) when the month would be replaced by 0 clean rows, or by
                 fewer than ``min_keep_fraction`` of the clean rows it holds, or when more than
                 ``max_quarantine_fraction`` of the landed rows broke the contract, unless ``force``; then
                 ``audit(self, month)`` (the Great Expectations suite over the staged clean rows) must return an
                 object whose ``success`` is true
        publish  in one transaction: the rows being replaced move to ``impressions_history`` (restorable with
                 :meth:`restore_month`; a rerun whose clean rows equal the published ones adds no history version),
                 the month's partition and quarantine are replaced, the run is logged

        ``min_propensity`` and ``max_clock_skew_seconds`` are contract parameters (sql/ingest_check.sql). ``catalog``:
        the item ids of the catalog (the dataset's); when given, a row whose exposed item, candidates or history name
        another item is quarantined (item_not_in_catalog). A step that fails (disk full, ...) raises IngestStepFailed
        naming its SQL file; the clean-up after it never hides it.
        """
        check_month(month)
        if not 0.0 < float(min_propensity) <= 1.0:
            raise WarehouseSettingError(f"data.min_propensity {min_propensity!r}: rule: in (0, 1]")
        if not 0.0 <= float(max_quarantine_fraction) <= 1.0:
            raise WarehouseSettingError(f"data.max_quarantine_fraction {max_quarantine_fraction!r}: rule: in [0, 1]")
        t0 = time.perf_counter()
        files = self.landing_files(landing_dir, month)
        report = IngestReport(month=month, files=[storage.basename(p) if isinstance(p, str) else p.name
                                                  for p in files])
        if files and isinstance(files[0], str):  # objects: staged from a local copy, deleted once staged
            self._stage_remote(files)
        else:
            self._stage(files)
        failed: BaseException | None = None
        try:
            self.stage_catalog(catalog)
            self.run("ingest_check", month=month, known_arms=list(known_arms), schema_version=SCHEMA_VERSION,
                     min_propensity=float(min_propensity), max_clock_skew_seconds=float(max_clock_skew_seconds),
                     logging_policy_re=LOGGING_POLICY_PATTERN, check_catalog=catalog is not None,
                     single_candidate_tolerance=SINGLE_CANDIDATE_PROPENSITY_TOLERANCE)
            for row in self.run("ingest_rule_counts").to_pylist():
                if row["rule"] is None:
                    report.rows_clean = row["rows"]
                else:
                    report.quarantined_by_rule[row["rule"]] = row["rows"]
            report.rows_in = report.rows_clean + report.rows_quarantined
            report.rows_replaced = self.run("month_count", month=month).column("rows")[0].as_py()
            self._audit_replace(report, force=force, min_keep_fraction=min_keep_fraction)
            self._audit_quarantine(report, force=force, max_fraction=max_quarantine_fraction)
            if audit is not None:
                summary = audit(self, month)
                report.audit = summary
                if not summary.success:
                    raise IngestRefused(f"month {month}: the staged rows failed the Great Expectations suite; nothing "
                                        f"was published, the month's partition is unchanged.\n{summary}")
            # a rerun with the very rows already published keeps no second copy of them in the history
            same = report.rows_replaced == report.rows_clean and report.rows_clean > 0 and bool(
                self.run("ingest_same_as_published", month=month).column("same")[0].as_py())
            self.con.begin()
            try:
                if not same:
                    self.run("ingest_history_save", month=month)
                self.run("ingest_delete_month", month=month)
                self.run("ingest_delete_quarantine", month=month)
                self.run("ingest_insert_clean", month=month)
                self.run("ingest_insert_quarantine", month=month)
                self.run(
                    "ingest_log_run",
                    month=month,
                    files=report.files,
                    rows_in=report.rows_in,
                    rows_clean=report.rows_clean,
                    rows_quarantined=report.rows_quarantined,
                    rows_replaced=report.rows_replaced,
                    rules=list(report.quarantined_by_rule),
                    rule_counts=list(report.quarantined_by_rule.values()),
                )
                t_agg = time.perf_counter()
                report.aggregate_rows = self._build_user_month_stats(month)["users"]
                report.aggregate_seconds = time.perf_counter() - t_agg
                self._commit(f"the commit of month {month}")
            except BaseException as e:
                self._rollback_after(e)
                raise
        except SQLFileError as e:
            failed = e
            raise IngestStepFailed(f"ingest {month} failed at step {e}; nothing was published, the month's "
                                   "partition is as it was") from e
        except BaseException as e:
            failed = e
            raise
        finally:
            try:
                self.run("ingest_drop_stage")
            except Exception as cleanup:  # noqa: BLE001 - never let the clean-up hide the step that failed
                if failed is None:
                    raise
                log.info("ingest %s: clean-up after the failure also failed: %s", month, cleanup)
        report.seconds = time.perf_counter() - t0
        return report

    def stage_catalog(self, catalog: Iterable[int] | None) -> None:
        """The catalog's item ids as the in-memory table staging.ingest_catalog (item_id BIGINT; empty when None),
        which the contract (sql/ingest_check.sql, item_not_in_catalog) and the GX batch (sql/validate_*.sql) read."""
        ids = pa.table({"item_id": pa.array(sorted({int(i) for i in catalog or ()}), pa.int64())})
        self.con.register("ingest_catalog_arrow", ids)
        try:
            self.con.execute("CREATE OR REPLACE TABLE staging.ingest_catalog AS SELECT item_id FROM ingest_catalog_arrow")
        finally:
            self.con.unregister("ingest_catalog_arrow")

    def _commit(self, what: str) -> None:
        """Commit, naming ``what`` when DuckDB cannot (the WAL or the file cannot be written: a full disk)."""
        import duckdb

        try:
            self.con.commit()
        except duckdb.Error as e:
            raise SQLFileError(f"{what} (writing {self.path}): {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                               ) from e

    def _rollback_after(self, error: BaseException) -> None:
        """Roll the open transaction back; a rollback that fails too (a database DuckDB invalidated after a disk-full
        error) is logged, and the caller re-raises ``error``, the failure that matters."""
        try:
            self.con.rollback()
        except Exception as e:  # noqa: BLE001
            log.info("%s: rollback after %s failed too: %s", self.path, type(error).__name__, e)

    def _stage_remote(self, uris: list[str]) -> None:
        """Stage an object-store partition: the objects are copied into a temporary directory (next to DuckDB's
        spill directory when one is set), staged as local files are, and deleted."""
        import tempfile

        tmp_root = self._temp_directory or None
        with tempfile.TemporaryDirectory(prefix="abpo-landing-", dir=tmp_root) as tmp:
            try:
                local = storage.download(uris, tmp)
            except storage.StorageError as e:
                raise IngestError(str(e)) from None
            try:
                self._stage([Path(p) for p in local])
            except IngestError as e:  # name the object, not the temporary copy
                raise IngestError(str(e).replace(tmp, storage.split_query(uris[0])[0].rsplit("/", 1)[0])) from None

    def _stage(self, files: list[Path]) -> None:
        """Stage the files; when DuckDB cannot read them, find and name the corrupt one."""
        try:
            self.run("ingest_stage", files=[str(p.absolute()) for p in files])
        except SQLFileError as e:
            for p in files:
                try:
                    self.con.sql("SELECT count(*) FROM read_parquet($f)", params={"f": str(p.absolute())}).fetchall()
                    pq.read_table(p)
                except Exception as bad:  # noqa: BLE001 - any reader error names the file
                    raise IngestError(f"{p}: corrupt Parquet data ({type(bad).__name__}: {str(bad)[:200]}); nothing "
                                      "was ingested, the month's partition is unchanged") from None
            raise IngestError(f"{files[0].parent}: the landing files could not be staged ({e})") from e

    @staticmethod
    def _audit_replace(report: IngestReport, *, force: bool, min_keep_fraction: float) -> None:
        """The replace guard: a month holding clean rows is not replaced by none, or by far fewer, unless forced."""
        if force or report.rows_replaced == 0:
            return
        if report.rows_clean == 0 or report.rows_clean < min_keep_fraction * report.rows_replaced:
            raise IngestRefused(
                f"month {report.month}: the landing files ({', '.join(report.files)}) give {report.rows_clean} clean "
                f"rows ({report.rows_quarantined} quarantined) where the warehouse holds {report.rows_replaced}; rule: "
                f"a month is not replaced by fewer than {min_keep_fraction:.0%} of its clean rows unless forced "
                "(`abpo ingest --force`); nothing was published")

    @staticmethod
    def _audit_quarantine(report: IngestReport, *, force: bool, max_fraction: float) -> None:
        """The quarantine ceiling: a month where more than ``max_fraction`` of the landed rows broke the contract is
        not published (something upstream is broken), unless forced."""
        if force or report.rows_in == 0:
            return
        share = report.rows_quarantined / report.rows_in
        if share > max_fraction:
            fired = ", ".join(f"{rule} {n}" for rule, n in sorted(report.quarantined_by_rule.items(),
                                                                   key=lambda kv: -kv[1]) if n)
            raise IngestRefused(
                f"month {report.month}: {report.rows_quarantined} of {report.rows_in} landed rows ({share:.1%}) broke "
                f"the contract (rules fired: {fired}); rule: at most data.max_quarantine_fraction = {max_fraction:g} "
                "of a month may be quarantined unless forced (`abpo ingest --force`); nothing was published")

    def month_versions(self, month: str) -> list[dict]:
        """The replaced versions of ``month`` kept in impressions_history (newest last)."""
        return self.run("history_versions", month=check_month(month)).to_pylist()

    def restore_month(self, month: str, version: int | None = None) -> dict:
        """Put a replaced version of ``month`` back (default: the newest); the rows it replaces become a new history
        version, so a restore can itself be undone. The month's quarantine is left as the last ingest wrote it."""
        check_month(month)
        versions = self.month_versions(month)
        if not versions:
            raise IngestError(f"month {month}: no replaced version in impressions_history to restore")
        v = int(version if version is not None else versions[-1]["version"])
        if v not in {int(r["version"]) for r in versions}:
            raise IngestError(f"month {month}: no history version {v} (have {[r['version'] for r in versions]})")
        # the ingest's uniqueness rule (sql/ingest_check.sql, duplicate_impression_id): an id lives in one month only.
        # Ids of the version may have been ingested into another month since it was replaced.
        clash = self.run("history_restore_conflicts", month=month, version=v).to_pylist()
        if clash:
            n = clash[0]["conflicts"]
            shown = ", ".join(f"{r['impression_id']} (in {r['other_month']})" for r in clash[:5])
            raise IngestRefused(
                f"month {month}: history version {v} holds {n} impression id(s) that are now in another month, e.g. "
                f"{shown}; rule: an impression_id is unique across months (duplicate_impression_id, as at ingest); "
                "nothing was restored")
        self.con.begin()
        try:
            self.run("ingest_history_save", month=month)
            self.run("ingest_delete_month", month=month)
            self.run("history_restore", month=month, version=v)
            self.run("history_drop", month=month, version=v)
            self._build_user_month_stats(month)
            rows = self.run("month_count", month=month).column("rows")[0].as_py()
            self.con.commit()
        except BaseException as e:
            self._rollback_after(e)
            raise
        return {"month": month, "restored_version": v, "rows": rows}

    # ------------------------------------------------------------------------------------ per-user aggregate
    def _build_user_month_stats(self, month: str) -> dict:
        """Replace ``month``'s rows of user_month_stats by its clean impressions summed per (arm, user)
        and mark it built as of the month's ingest runs. Runs inside the caller's transaction."""
        self.run("user_month_stats_delete", month=month)
        self.run("user_month_stats_insert", month=month)
        built = self.run("user_month_stats_mark", month=month).to_pylist()
        return built[0]

    def stale_aggregate_months(self) -> dict[str, str]:
        """month -> why its user_month_stats rows are missing or out of date. Cheap (reads ingest_runs and
        user_month_stats_built), except for a warehouse that predates the aggregate, where every month of
        ``impressions`` is listed (one scan of the month column)."""
        if self.run("user_month_stats_predates").column("predates")[0].as_py():
            return {r["month"]: "the warehouse predates the per-user aggregate"
                    for r in self.run("impression_months").to_pylist()}
        return {r["month"]: r["reason"] for r in self.run("user_month_stats_stale").to_pylist()}

    def rebuild_aggregates(self, months: Sequence[str] | dict[str, str]) -> list[AggregateBuild]:
        """Rebuild user_month_stats for ``months`` (a list, or month -> reason) from the clean impressions,
        all in ONE transaction: a failure leaves every month as it was."""
        reasons = dict(months) if isinstance(months, dict) else {m: "rebuild requested" for m in months}
        builds = []
        self.con.begin()
        try:
            for m in sorted(reasons):
                totals = self._build_user_month_stats(check_month(m))
                builds.append(AggregateBuild(month=m, reason=reasons[m], **totals))
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise
        return builds

    def ensure_aggregates(self) -> list[AggregateBuild]:
        """Rebuild the months :meth:`stale_aggregate_months` lists (none in the common case: ingest keeps
        the aggregate current). Called on open."""
        stale = self.stale_aggregate_months()
        if not stale:
            return []
        builds = self.rebuild_aggregates(stale)
        for b in builds:
            log.warning("%s: rebuilt user_month_stats for %s (%s): %d users, %d impressions",
                        self.path, b.month, b.reason, b.users, b.impressions)
        return builds

    def check_aggregates(self, months: list[str] | None = None) -> pa.Table:
        """(month, arm) rows where user_month_stats disagrees with the raw clean impressions (users,
        impressions or clicks); empty when it is current. Scans the raw rows: a check, not for the report."""
        return self.run("user_month_stats_check",
                        months=[check_month(m) for m in months] if months is not None else None)

    # ------------------------------------------------------------------------------------ queries
    def ctr_by_arm_month(self, months: list[str] | None = None) -> pa.Table:
        """month, arm, impressions, clicks, users (distinct), ctr: from the clean impressions."""
        return self.run("ctr_by_arm_month", months=[check_month(m) for m in months] if months is not None else None)

    def quarantine_by_rule(self, months: list[str] | None = None) -> pa.Table:
        return self.run("quarantine_by_rule", months=[check_month(m) for m in months] if months is not None else None)

    @contextmanager
    def _excluded_users(self, users: Iterable[int] | None) -> Iterator[None]:
        """Register ``users`` (none when None or empty) as the Arrow table ``strata_excluded_users`` (user_id BIGINT)
        that the strata's SQL files anti-join, for the duration of the block."""
        ids = pa.array(sorted({int(u) for u in users or ()}), pa.int64())
        self.con.register(EXCLUDED_USERS_TABLE, pa.table({"user_id": ids}))
        try:
            yield
        finally:
            self.con.unregister(EXCLUDED_USERS_TABLE)

    def strata(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[pa.Table, pa.Table]:
        """(positive rows B_1, no-response rows B_0) of the given months, each in a stable order, without the rows of
        the users in ``exclude_users`` (an anti-join in DuckDB: the gate's held-out users, abpo.data.holdout)."""
        ms = [check_month(m) for m in months]
        with self._excluded_users(exclude_users):
            return self.run("stratify_positive", months=ms), self.run("stratify_no_response", months=ms)

    def stratum_sizes(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[int, int]:
        """(P, N): positive and no-response rows of the given months, without the users in ``exclude_users``."""
        with self._excluded_users(exclude_users):
            row = self.run("stratum_sizes", months=[check_month(m) for m in months]).to_pylist()[0]
        return int(row["positive"]), int(row["no_response"])

    def held_out_rows(self, months: Sequence[str], users: Iterable[int]) -> list[dict]:
        """Per arm, the rows of the given months that ``strata(months, exclude_users=users)`` leaves out: dicts
        (arm, positive, no_response, users), by arm (sql/strata_held_out.sql)."""
        with self._excluded_users(users):
            return self.run("strata_held_out", months=[check_month(m) for m in months]).to_pylist()

    def impression_users(self, months: Sequence[str]) -> list[int]:
        """The distinct users of the clean impressions of the given months, ascending."""
        t = self.run("impression_users", months=[check_month(m) for m in months])
        return [int(u) for u in t.column("user_id").to_pylist()]

    def stratified_batch_stream(
        self, months: Sequence[str], batch_size: int, seed: int, mode: str = "oversample", *, chunk_rows: int = 65536,
        exclude_users: Iterable[int] | None = None,
    ) -> Iterator[pa.Table]:
        """The stratified mini-batches of ``months`` (:func:`stratified_batch_plan`, the same batches as
        :func:`stratified_batch_tables` over :meth:`strata`), streamed from DuckDB as Arrow tables of whole batches
        (about ``chunk_rows`` rows each; the strata's columns plus ``batch`` and ``slot``, in (batch, slot) order).
        Only the plan's integers are held in Python; DuckDB joins, sorts and spills (memory_limit / temp_directory),
        so a month of any size streams in bounded memory (sql/stratified_batches.sql). The users in
        ``exclude_users`` are left out, as by :meth:`strata`."""
        ms = [check_month(m) for m in months]
        excluded = sorted({int(u) for u in exclude_users or ()})
        plan = stratified_batch_plan(*self.stratum_sizes(ms, exclude_users=excluded), batch_size, seed, mode)
        text = self.sql_text("stratified_batches")
        self.con.register("batch_plan_positive", plan.stratum(True))
        self.con.register("batch_plan_no_response", plan.stratum(False))
        self.con.register(EXCLUDED_USERS_TABLE, pa.table({"user_id": pa.array(excluded, pa.int64())}))
        try:
            try:
                reader = self.con.sql(text, params={"months": ms}).to_arrow_reader(chunk_rows)
            except Exception as e:  # noqa: BLE001 - say which file
                raise SQLFileError(f"{self.sql_dir / 'stratified_batches.sql'}: {type(e).__name__}: {e}") from e
            carry = None  # rows of a batch that continues in the next record batch
            for rb in reader:
                chunk = pa.Table.from_batches([rb]) if carry is None else pa.concat_tables(
                    [carry, pa.Table.from_batches([rb])])
                batch = chunk.column("batch").to_numpy()
                cut = int(np.searchsorted(batch, batch[-1]))  # the last batch may be incomplete
                if cut > 0:
                    yield chunk.slice(0, cut)
                carry = chunk.slice(cut)
            if carry is not None and carry.num_rows:
                yield carry
        finally:
            self.con.unregister("batch_plan_positive")
            self.con.unregister("batch_plan_no_response")
            self.con.unregister(EXCLUDED_USERS_TABLE)

    def months(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT DISTINCT month FROM impressions ORDER BY 1").fetchall()]

    # ------------------------------------------------------------------------------------ interactions
    def ingest_interactions(self, landing_dir: str | os.PathLike, month: str, *,
                            catalog: Iterable[int] | None = None) -> int | None:
        """Replace ``month``'s partition of ``interactions`` by the landed files of
        landing/interactions/month=YYYY-MM/ (INTERACTIONS_SCHEMA; IngestError naming a file that is not), in one
        transaction. With ``catalog`` (the dataset's item ids) a row of another item goes to
        ``interactions_quarantine`` (rule item_not_in_catalog, logged) instead. Returns the rows ingested, or None
        when nothing landed for the month (the partition is left as it was: serving that logs no interactions has
        nothing to add)."""
        if storage.is_uri(landing_dir):
            return self._ingest_remote_interactions(str(landing_dir), month, catalog)
        d = month_dir(landing_dir, check_month(month), "interactions")
        if not d.is_dir():
            return None
        if d.is_symlink():
            raise IngestError(f"{d}: a symbolic link; rule: the landing partition is a real directory")
        files = sorted(p for p in d.iterdir() if not p.name.startswith((".", "_")))
        for p in files:
            if p.is_symlink() or not p.is_file():
                raise IngestError(f"{p}: rule: the landing partition holds regular Parquet files only")
            try:
                problems = schema_problems(pq.read_schema(p), INTERACTIONS_SCHEMA)
            except (pa.ArrowInvalid, OSError) as e:
                raise IngestError(f"{p}: not a Parquet file ({e})") from e
            if problems:
                raise IngestError(f"{p}: wrong schema: " + "; ".join(problems))
        if not files:
            return None
        paths = [str(p.absolute()) for p in files]
        return self._replace_interactions(month, paths, paths, catalog)

    def _replace_interactions(self, month: str, paths: list[str], sources: list[str],
                              catalog: Iterable[int] | None) -> int:
        """The month's partition of ``interactions`` replaced by the rows of the local Parquet files ``paths``
        (``sources``: where each came from, recorded as source_file), in one transaction; with ``catalog`` the rows
        of items outside it go to ``interactions_quarantine`` (item_not_in_catalog, logged)."""
        self.stage_catalog(catalog)
        check = catalog is not None
        self.con.begin()
        try:
            self.run("interactions_delete_month", month=month)
            self.run("interactions_quarantine_delete", month=month)
            self.run("interactions_quarantine_insert", month=month, files=paths, sources=sources, check_catalog=check)
            self.run("interactions_insert", month=month, files=paths, sources=sources, check_catalog=check)
            rows = self.con.execute("SELECT count(*) FROM interactions WHERE month = $m", {"m": month}).fetchall()[0][0]
            quarantined = self.con.execute("SELECT count(*), min(item_id) FROM interactions_quarantine WHERE month = $m",
                                           {"m": month}).fetchall()[0]
            self._commit(f"the interactions of month {month}")
        except BaseException as e:
            self._rollback_after(e)
            raise
        finally:
            self.con.execute("DROP TABLE IF EXISTS staging.ingest_catalog")
        if quarantined[0]:
            log.warning("interactions %s: %d row(s) quarantined (item_not_in_catalog, e.g. item %s) in "
                        "interactions_quarantine", month, quarantined[0], quarantined[1])
        return int(rows)

    def _ingest_remote_interactions(self, landing: str, month: str, catalog: Iterable[int] | None = None) -> int | None:
        """:meth:`ingest_interactions` for an object-store landing zone: the partition's objects (checked as
        :meth:`remote_landing_files` does; no completion marker required: the impressions partition's gates the
        month) copied locally and inserted with their URIs as ``source_file``."""
        import tempfile

        try:
            files = self.remote_landing_files(landing, month, "interactions", INTERACTIONS_SCHEMA)
        except IngestError as e:
            if "no landing partition" in str(e) or "holds no files" in str(e):
                return None
            raise
        with tempfile.TemporaryDirectory(prefix="abpo-landing-", dir=self._temp_directory or None) as tmp:
            try:
                local = storage.download(files, tmp)
            except storage.StorageError as e:
                raise IngestError(str(e)) from None
            return self._replace_interactions(month, list(local), [storage.split_query(u)[0] for u in files], catalog)

    def interaction_rows(self, month: str) -> pa.Table:
        """The interactions of the months up to and including ``month``: user_id, item_id, month, position,
        source_file (the landed file it came from), ordered by user, month, position (sql/interactions_to_date.sql);
        no rows for a warehouse without interactions."""
        has = self.con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'interactions'")
        if not has.fetchall()[0][0]:
            return pa.table({"user_id": pa.array([], pa.int64()), "item_id": pa.array([], pa.int64()),
                             "month": pa.array([], pa.string()), "position": pa.array([], pa.int32()),
                             "source_file": pa.array([], pa.string())})
        return self.run("interactions_to_date", month=check_month(month))

    def interactions_to_date(self, month: str) -> dict[int, list[int]]:
        """user -> the items consumed in the months up to and including ``month``, in sequence order (empty for a
        warehouse without interactions)."""
        t = self.interaction_rows(month)
        out: dict[int, list[int]] = {}
        for u, i in zip(t.column("user_id").to_pylist(), t.column("item_id").to_pylist()):
            out.setdefault(int(u), []).append(int(i))
        return out


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


MEMORY_LIMIT_ENV = "ABPO_WAREHOUSE_MEMORY_LIMIT"  # a deployment's cap (docker-compose.yml sets it), over the config


def warehouse_memory_limit(cfg) -> str:
    """$ABPO_WAREHOUSE_MEMORY_LIMIT when set, else data.warehouse_memory_limit; checked against the size grammar."""
    env = os.environ.get(MEMORY_LIMIT_ENV, "")
    if env:
        return check_memory_limit(env, f"${MEMORY_LIMIT_ENV}")
    return check_memory_limit(cfg.data.warehouse_memory_limit)


def open_warehouse(cfg, *, read_only: bool = False) -> Warehouse:
    """The config's warehouse (paths.warehouse) with its memory limit (:func:`warehouse_memory_limit`) and spill
    directory (section data)."""
    tmp = cfg.data.warehouse_temp_directory
    if tmp and not Path(tmp).is_absolute():
        tmp = str(cfg.paths.resolve("root") / tmp)
    return Warehouse(cfg.paths.resolve("warehouse"), read_only=read_only, memory_limit=warehouse_memory_limit(cfg),
                     temp_directory=tmp)


def ingest_with_config(cfg, month: str, *, landing: str | os.PathLike | None = None, force: bool = False,
                       validate: bool = True) -> tuple[IngestReport, Path]:
    """Write, audit, publish ``month`` with every contract and audit setting of the config's ``data`` section (the one
    place they are read, for `abpo ingest` and the pipeline alike): known arms, min_propensity, max_clock_skew_seconds,
    ingest_min_keep_fraction, max_quarantine_fraction, the catalog (the dataset's item ids: item_not_in_catalog), and
    the Great Expectations suite unless ``validate`` is false. The suite's summary
    (``validation/impressions_<month>.json``) is written only once the month is published: a refused ingest leaves
    the month's summary as it was. Returns the report and the warehouse's path."""
    from abpo.validation import save_summary, validate_month

    d = cfg.data
    out_dir = cfg.paths.resolve("root") / "validation"
    audit = (lambda w, m: validate_month(w, m, d.known_arms, out_dir=out_dir, staged=True,
                                         min_propensity=d.min_propensity,
                                         max_clock_skew_seconds=d.max_clock_skew_seconds)) if validate else None
    catalog = config_catalog(cfg)
    with open_warehouse(cfg) as wh:
        report = wh.ingest_month(landing or cfg.paths.location("landing"), month, d.known_arms, force=force,
                                 min_keep_fraction=d.ingest_min_keep_fraction, audit=audit,
                                 min_propensity=d.min_propensity, max_clock_skew_seconds=d.max_clock_skew_seconds,
                                 max_quarantine_fraction=d.max_quarantine_fraction, catalog=catalog)
    if report.audit is not None:
        save_summary(report.audit, out_dir)
    return report, wh.path


def config_catalog(cfg) -> list[int]:
    """The item ids of the config's dataset (section data): the catalog impressions and interactions are checked
    against at ingest (item_not_in_catalog)."""
    from abpo.data.loaders import load_dataset

    return [int(i) for i in load_dataset(cfg.data).item_ids()]
