"""Monthly ingest of the landing zone's impressions (:meth:`Ingest.ingest_month`): list and check the files
(:func:`landing_files`), stage them, apply the contract (sql/ingest_check.sql), audit, publish in one transaction."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from abpo.config.data import DataConfig
from abpo.data import storage
from abpo.data.schemas import (
    ID_FORBIDDEN_PATTERN,
    IMPRESSIONS_SCHEMA,
    LOGGING_POLICY_PATTERN,
    MAX_ID_LENGTH,
    RULES,
    SCHEMA_VERSION,
    SINGLE_CANDIDATE_PROPENSITY_TOLERANCE,
    check_month,
    month_dir,
    month_location,
    schema_problems,
)
from abpo.warehouse.aggregates import Aggregates
from abpo.warehouse.db import WarehouseDB
from abpo.warehouse.errors import IngestError, IngestRefused, IngestStepFailed, SQLFileError, WarehouseSettingError

DATA_DEFAULTS = DataConfig()  # the contract parameters' defaults (section data)

log = logging.getLogger("abpo.warehouse")  # the package logs as the one module did
MANY_OBJECTS = 1000  # a partition with more objects than this is warned about (one request per object)
# A month whose logging is close to deterministic is warned about (Ingest._warn_near_deterministic): an arm where more
# than NEAR_DETERMINISTIC_SHARE of the clean rows with two or more candidates logged a propensity of at least
# NEAR_ONE_PROPENSITY (a softmax whose top score leads each of the M - 1 others by (13.8 + ln(M - 1)) tau or more:
# 0.017 nats at policy.tau's floor 1e-3 and M = 20). The served item is then the argmax nearly always and the logs
# hold nothing else of the request: the off-policy gate's weights pi/e0 have no support beyond the served items. A
# row with one candidate is left out: its propensity is 1 whatever the temperature.
NEAR_ONE_PROPENSITY = 1.0 - 1e-6
NEAR_DETERMINISTIC_SHARE = 0.5
NEAR_DETERMINISTIC_RULE = (
    "a logging policy this close to deterministic gives the off-policy gate no support beyond the served item"
)


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
    audit: Any = None  # the audit's summary (abpo.validation.ValidationSummary) when one ran
    # arms whose logging was near-deterministic (Ingest._warn_near_deterministic): arm -> the share of its clean
    # rows with two or more candidates that logged a propensity >= NEAR_ONE_PROPENSITY
    near_deterministic: dict[str, float] = field(default_factory=dict)

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
            "near_deterministic": dict(self.near_deterministic),
        }

    def __str__(self) -> str:
        lines = [
            f"ingest {self.month}: {len(self.files)} file(s), {self.rows_in} rows in, {self.rows_clean} clean, "
            f"{self.rows_quarantined} quarantined (replaced {self.rows_replaced} clean rows) in {self.seconds:.2f}s"
        ]
        lines += [f"  {rule:26s} {n:>10d}" for rule, n in self.quarantined_by_rule.items()]
        lines.append(
            f"  per-user aggregate: {self.aggregate_rows} (arm, user) rows rebuilt in {self.aggregate_seconds:.2f}s"
        )
        if self.near_deterministic:  # the warning's arms (Ingest._warn_near_deterministic)
            shares = ", ".join(f"{arm} {share:.1%}" for arm, share in self.near_deterministic.items())
            lines.append(f"  near-deterministic logging (propensity >= 1 - {1 - NEAR_ONE_PROPENSITY:.0e}): {shares}")
        return "\n".join(lines)


def _deterministic(error: BaseException) -> bool:
    """Whether a failed ingest step's error (or one it wraps) is DuckDB refusing the input itself (a binder, type,
    conversion or parser error: the same files fail the same way on every try), as opposed to the environment (a
    full disk, an invalidated database, out of memory), which a retry may get past."""
    import duckdb

    kinds = tuple(
        getattr(duckdb, n)
        for n in ("BinderException", "ConversionException", "TypeMismatchException", "ParserException")
        if hasattr(duckdb, n)
    )
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, kinds):
            return True
        e = e.__cause__ or e.__context__
    return False


def landing_files(landing_dir: str | os.PathLike, month: str) -> list[Path] | list[str]:
    """The month's landing files; each must be Parquet with the impressions schema (IngestError
    otherwise). Hidden files and markers (names starting with '.' or '_') are ignored. An object-store landing
    zone (a URI) gives the objects' URIs (:func:`remote_landing_files`)."""
    if storage.is_uri(landing_dir):
        return remote_landing_files(str(landing_dir), month)
    d = month_dir(landing_dir, month)
    if not d.is_dir():
        raise IngestError(f"{d}: no landing partition for month {month}")
    if d.is_symlink():
        raise IngestError(
            f"{d}: a symbolic link (to {os.readlink(d)}); rule: the landing partition is a real directory"
        )
    files = sorted(p for p in d.iterdir() if not p.name.startswith((".", "_")))
    if not files:
        raise IngestError(f"{d}: the landing partition holds no files")
    for p in files:
        if p.is_symlink():  # its rows would be recorded under the target's name, from outside the landing zone
            raise IngestError(
                f"{p}: a symbolic link (to {os.readlink(p)}); rule: the landing partition holds "
                "regular Parquet files only"
            )
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


def remote_landing_files(
    landing: str, month: str, kind: str = "impressions", schema: pa.Schema = IMPRESSIONS_SCHEMA
) -> list[str]:
    """The URIs of an object-store partition's Parquet objects, each checked (footer and schema) as the local
    files are. IngestError, one line naming the URI: a missing bucket, denied access, no partition, a partition
    without its completion marker ($ABPO_LANDING_MARKER, default _SUCCESS: an upload still running or cut
    short), an object that is not whole Parquet (a truncated upload), a wrong schema, a sub-prefix (its objects
    would be skipped). A store that does not answer raises abpo.data.storage.StorageUnavailable (transient)."""
    d = month_location(landing, check_month(month), kind)
    try:
        found = storage.list_partition(str(d))
        if found is None:
            raise IngestError(f"{d}: no landing partition for month {month}")
        listed, prefixes = found
        if prefixes:  # objects under a sub-prefix: the local landing refuses a sub-directory the same way
            raise IngestError(
                f"{prefixes[0]}/: a sub-prefix in the landing partition ({len(prefixes)} in all); rule: the "
                "partition holds its Parquet objects directly under it (objects under a sub-prefix would be "
                "skipped): move them up or land them as their own month"
            )
        names = {storage.basename(u) for u in listed}
        files = [u for u in listed if not storage.basename(u).startswith((".", "_"))]
        if not files:
            raise IngestError(f"{d}: the landing partition holds no files")
        marker = storage.landing_marker()
        if kind == "impressions" and marker and marker not in names:
            raise IngestError(
                f"{d}: {len(files)} object(s) but no {marker} marker; rule: an object-store "
                f"partition is read once its producer has written {marker} last (a partial or "
                "running upload is never ingested; $ABPO_LANDING_MARKER names the marker)"
            )
        for u in files:
            try:
                with storage.open_input(u) as f:
                    got = pq.read_schema(f)
            except pa.ArrowInvalid as e:
                raise IngestError(
                    f"{u}: not a whole Parquet object ({e}); a truncated or partial upload is never ingested"
                ) from None
            problems = schema_problems(got, schema)
            if problems:
                raise IngestError(f"{u}: wrong schema: " + "; ".join(problems))
    except storage.StorageUnavailable:
        raise  # the store did not answer: transient (retried), not a refusal of the month's data
    except storage.StorageError as e:
        raise IngestError(str(e)) from None
    return files


def _stage_table(db: WarehouseDB, name: str, table: pa.Table) -> None:
    """``table`` as the table staging.<name> (replaced), its columns as they are, through a registered Arrow view."""
    view = f"{name}_arrow"
    db.con.register(view, table)
    try:
        cols = ", ".join(table.column_names)
        db.con.execute(f"CREATE OR REPLACE TABLE staging.{name} AS SELECT {cols} FROM {view}")
    finally:
        db.con.unregister(view)


def stage_catalog(db: WarehouseDB, catalog: Iterable[int] | None) -> None:
    """The catalog's item ids as the in-memory table staging.ingest_catalog (item_id BIGINT; empty when None),
    which the contract (sql/ingest_check.sql, item_not_in_catalog) and the GX batch (sql/validate_*.sql) read."""
    ids = pa.table({"item_id": pa.array(sorted({int(i) for i in catalog or ()}), pa.int64())})
    _stage_table(db, "ingest_catalog", ids)


def stage_model_versions(db: WarehouseDB, model_versions: Mapping[str, tuple[str, Iterable[str]]] | None) -> None:
    """The registered versions the rule unknown_model_version checks rows against, as the in-memory table
    staging.ingest_model_versions (arm, model, model_version; empty when None): ``model_versions`` maps an arm to
    (its registered model's name, the model's version numbers). An arm not in it is not checked."""
    pairs = sorted({(str(a), str(m), str(v)) for a, (m, vs) in (model_versions or {}).items() for v in vs})
    t = pa.table(
        {
            "arm": pa.array([p[0] for p in pairs], pa.string()),
            "model": pa.array([p[1] for p in pairs], pa.string()),
            "model_version": pa.array([p[2] for p in pairs], pa.string()),
        }
    )
    _stage_table(db, "ingest_model_versions", t)


class Ingest:
    """The monthly ingest of impressions (write, audit, publish) over the warehouse's connection ``db``; publishing a
    month rebuilds its per-user aggregate with ``aggregates`` in the same transaction."""

    def __init__(self, db: WarehouseDB, aggregates: Aggregates):
        self.db = db
        self.aggregates = aggregates

    def ingest_month(
        self,
        landing_dir: str | os.PathLike,
        month: str,
        known_arms: Sequence[str],
        *,
        force: bool = False,
        min_keep_fraction: float = 0.5,
        audit: Callable[[str], Any] | None = None,
        min_propensity: float = DATA_DEFAULTS.min_propensity,
        max_clock_skew_seconds: float = DATA_DEFAULTS.max_clock_skew_seconds,
        max_quarantine_fraction: float = DATA_DEFAULTS.max_quarantine_fraction,
        catalog: Iterable[int] | None = None,
        policy_tau: float | None = None,
        model_versions: Mapping[str, tuple[str, Iterable[str]]] | None = None,
    ) -> IngestReport:
        """Write, audit, publish ``month``'s landing files.

        write    stage the files (a corrupt one is named) and apply the contract: violations go to quarantine
        audit    refuse (IngestRefused, nothing published) when the month would be replaced by 0 clean rows, or by
                 fewer than ``min_keep_fraction`` of the clean rows it holds, or when more than
                 ``max_quarantine_fraction`` of the landed rows broke the contract, unless ``force``; then
                 ``audit(month)`` (the Great Expectations suite over the staged clean rows) must return an
                 object whose ``success`` is true
        publish  in one transaction: the rows being replaced move to ``impressions_history`` (restorable with
                 :meth:`abpo.warehouse.history.History.restore_month`; a rerun whose clean rows equal the published
                 ones adds no history version), the month's partition and quarantine are replaced, the run is logged

        ``min_propensity`` and ``max_clock_skew_seconds`` are contract parameters (sql/ingest_check.sql). ``catalog``:
        the item ids of the catalog (the dataset's); when given, a row whose exposed item, candidates or history name
        another item is quarantined (item_not_in_catalog). A step that fails (disk full, ...) raises IngestStepFailed
        naming its SQL file; the clean-up after it never hides it. ``policy_tau`` (policy.tau): an LLM row logged with
        another softmax temperature is quarantined (logging_tau_mismatch), as the update would refuse it; None: not
        checked. ``model_versions`` (arm -> (its registered model, the model's version numbers), read from the
        registry by the caller: abpo.arms.versions.registered_versions): a row of such an arm whose model_version is
        none of them is quarantined (unknown_model_version); an arm not in it, or None, is not checked. An arm whose
        clean rows logged near-deterministic propensities is warned about (:meth:`_warn_near_deterministic`).
        """
        check_month(month)
        check_contract_settings(min_propensity, max_quarantine_fraction)
        t0 = time.perf_counter()
        files = landing_files(landing_dir, month)
        report = IngestReport(month=month, files=[storage.basename(p) if isinstance(p, str) else p.name for p in files])
        self._stage_landed(files)
        failed: BaseException | None = None
        try:
            stage_catalog(self.db, catalog)
            stage_model_versions(self.db, model_versions)
            self._apply_contract(
                report,
                known_arms,
                min_propensity=float(min_propensity),
                max_clock_skew_seconds=float(max_clock_skew_seconds),
                check_catalog=catalog is not None,
                policy_tau=float(policy_tau or 0.0),
            )
            self._warn_near_deterministic(report, policy_tau)
            _audit_replace(report, force=force, min_keep_fraction=min_keep_fraction)
            _audit_quarantine(report, force=force, max_fraction=max_quarantine_fraction)
            if audit is not None:
                report.audit = audit(month)
                if not report.audit.success:
                    raise IngestRefused(
                        f"month {month}: the staged rows failed the Great Expectations suite; nothing "
                        f"was published, the month's partition is unchanged.\n{report.audit}"
                    )
            self._publish(report)
        except SQLFileError as e:
            failed = e
            if _deterministic(e):  # the same files fail the same way: a refusal, not retried
                raise IngestError(
                    f"ingest {month} failed at step {e}; rule: the landed files must match the impressions schema "
                    "as DuckDB binds it (a changed column type fails the same way on every try); nothing was "
                    "published, the month's partition is as it was"
                ) from e
            raise IngestStepFailed(
                f"ingest {month} failed at step {e}; nothing was published, the month's partition is as it was"
            ) from e
        except BaseException as e:
            failed = e
            raise
        finally:
            self._drop_stage(month, failed)
        report.seconds = time.perf_counter() - t0
        return report

    def _apply_contract(self, report: IngestReport, known_arms: Sequence[str], **params: Any) -> None:
        """Write: the contract (sql/ingest_check.sql) over the staged rows, with its parameters ``params``; the
        report's clean, quarantined (per rule), landed and replaced row counts."""
        self.db.run(
            "ingest_check",
            month=report.month,
            known_arms=list(known_arms),
            schema_version=SCHEMA_VERSION,
            logging_policy_re=LOGGING_POLICY_PATTERN,
            single_candidate_tolerance=SINGLE_CANDIDATE_PROPENSITY_TOLERANCE,
            id_forbidden_re=ID_FORBIDDEN_PATTERN,
            max_id_length=MAX_ID_LENGTH,
            **params,
        )
        for row in self.db.run("ingest_rule_counts").to_pylist():
            if row["rule"] is None:
                report.rows_clean = row["rows"]
            else:
                report.quarantined_by_rule[row["rule"]] = row["rows"]
        report.rows_in = report.rows_clean + report.rows_quarantined
        report.rows_replaced = self.db.run("month_count", month=report.month).column("rows")[0].as_py()

    def _warn_near_deterministic(self, report: IngestReport, policy_tau: float | None) -> None:
        """One WARNING line naming the month, each arm whose clean rows with two or more candidates logged a
        propensity >= NEAR_ONE_PROPENSITY in more than NEAR_DETERMINISTIC_SHARE of them (its share, rows and logging
        rules), the tau in use and the rule; the shares go to ``report.near_deterministic``. Not a refusal: the rows
        are true logs, but the off-policy gate reads nothing from them beyond the served items."""
        rows = self.db.run("ingest_near_deterministic", at_least=NEAR_ONE_PROPENSITY).to_pylist()
        flagged = [r for r in rows if r["rows"] and r["near_one"] > NEAR_DETERMINISTIC_SHARE * r["rows"]]
        if not flagged:
            return
        report.near_deterministic = {r["arm"]: round(r["near_one"] / r["rows"], 4) for r in flagged}
        arms = "; ".join(
            f"{r['near_one']} of {r['rows']} rows of arm {r['arm']} ({r['near_one'] / r['rows']:.1%}, "
            + ", ".join(r["policies"])
            + (f" and {r['n_policies'] - len(r['policies'])} more" if r["n_policies"] > len(r["policies"]) else "")
            + ")"
            for r in flagged
        )
        fixes = ["raise policy.tau"] if any(r["llm_rule"] for r in flagged) else []
        fixes += [f"raise arms.{r['arm']}.temperature" for r in flagged if r["ranker_rule"]]
        tau = f"policy.tau = {policy_tau:g}" if policy_tau else "policy.tau not given"
        log.warning(
            f"ingest {report.month}: near-deterministic logging: propensity >= 1 - {1 - NEAR_ONE_PROPENSITY:.0e} "
            f"on {arms}, of the rows with two or more candidates; {tau}; rule: {NEAR_DETERMINISTIC_RULE} (warned "
            f"above {NEAR_DETERMINISTIC_SHARE:.0%} of an arm's rows); " + (" / ".join(fixes) or "raise the temperature")
        )

    def _publish(self, report: IngestReport) -> None:
        """Publish: in ONE transaction the replaced rows to the history (not when a rerun's clean rows are the very
        rows already published), the month's partition and quarantine replaced, the run logged, the month's per-user
        aggregate rebuilt; a failure rolls back to the previous state."""
        month = report.month
        same = (
            report.rows_replaced == report.rows_clean
            and report.rows_clean > 0
            and bool(self.db.run("ingest_same_as_published", month=month).column("same")[0].as_py())
        )
        self.db.con.begin()
        try:
            if not same:
                self.db.run("ingest_history_save", month=month)
            self.db.run("ingest_delete_month", month=month)
            self.db.run("ingest_delete_quarantine", month=month)
            self.db.run("ingest_insert_clean", month=month)
            self.db.run("ingest_insert_quarantine", month=month)
            self.db.run(
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
            report.aggregate_rows = self.aggregates.build_user_month_stats(month)["users"]
            report.aggregate_seconds = time.perf_counter() - t_agg
            self.db.commit(f"the commit of month {month}")
        except BaseException as e:
            self.db.rollback_after(e)
            raise

    def _drop_stage(self, month: str, failed: BaseException | None) -> None:
        """Drop the staging tables; a clean-up that fails after a failed step is logged, never raised over it."""
        try:
            self.db.run("ingest_drop_stage")
        except Exception as cleanup:  # noqa: BLE001 - never let the clean-up hide the step that failed
            if failed is None:
                raise
            log.info("ingest %s: clean-up after the failure also failed: %s", month, cleanup)

    def _stage_landed(self, files: list[Path] | list[str]) -> None:
        """Stage the month's landing files: local files directly, objects (URIs) from a local copy, deleted once
        staged."""
        remote = [p for p in files if isinstance(p, str)]
        if remote:
            self._stage_remote(remote)
        else:
            self._stage([p for p in files if isinstance(p, Path)])

    def _stage_remote(self, uris: list[str]) -> None:
        """Stage an object-store partition: the objects are copied into a temporary directory (next to DuckDB's
        spill directory when one is set), staged as local files are, and deleted."""
        import tempfile

        tmp_root = self.db.temp_directory or None
        if len(uris) > MANY_OBJECTS:
            log.warning(
                "%s: %d objects in the month's partition: copied %d at a time, each a request of its own; many small "
                "objects make a slow ingest (compact them into objects of tens of MB before landing)",
                storage.split_query(uris[0])[0].rsplit("/", 1)[0],
                len(uris),
                storage.DOWNLOAD_WORKERS,
            )
        with tempfile.TemporaryDirectory(prefix="abpo-landing-", dir=tmp_root) as tmp:
            try:
                local = storage.download(uris, tmp)
            except storage.StorageUnavailable:
                raise  # transient: retried
            except storage.StorageError as e:
                raise IngestError(str(e)) from None
            for uri, p in zip(uris, local, strict=True):  # the bytes staged are the bytes checked
                problems = schema_problems(pq.read_schema(p), IMPRESSIONS_SCHEMA)
                if problems:
                    raise IngestError(f"{uri}: wrong schema (rewritten after it was checked): " + "; ".join(problems))
            try:
                self._stage([Path(p) for p in local])
            except IngestError as e:  # name the object, not the temporary copy
                raise IngestError(str(e).replace(tmp, storage.split_query(uris[0])[0].rsplit("/", 1)[0])) from None

    def _stage(self, files: list[Path]) -> None:
        """Stage the files; when DuckDB cannot read them, find and name the corrupt one."""
        try:
            self.db.run("ingest_stage", files=[str(p.absolute()) for p in files])
        except SQLFileError as e:
            for p in files:
                try:
                    self.db.con.sql("SELECT count(*) FROM read_parquet($f)", params={"f": str(p.absolute())}).fetchall()
                    pq.read_table(p)
                except Exception as bad:  # noqa: BLE001 - any reader error names the file
                    raise IngestError(
                        f"{p}: corrupt Parquet data ({type(bad).__name__}: {str(bad)[:200]}); nothing "
                        "was ingested, the month's partition is unchanged"
                    ) from None
            raise IngestError(f"{files[0].parent}: the landing files could not be staged ({e})") from e


def check_contract_settings(min_propensity: float, max_quarantine_fraction: float) -> None:
    """WarehouseSettingError naming the key when data.min_propensity is outside (0, 1] or
    data.max_quarantine_fraction outside [0, 1]."""
    if not 0.0 < float(min_propensity) <= 1.0:
        raise WarehouseSettingError(f"data.min_propensity {min_propensity!r}: rule: in (0, 1]")
    if not 0.0 <= float(max_quarantine_fraction) <= 1.0:
        raise WarehouseSettingError(f"data.max_quarantine_fraction {max_quarantine_fraction!r}: rule: in [0, 1]")


def _audit_replace(report: IngestReport, *, force: bool, min_keep_fraction: float) -> None:
    """The replace guard: a month holding clean rows is not replaced by none, or by far fewer, unless forced."""
    if force or report.rows_replaced == 0:
        return
    if report.rows_clean == 0 or report.rows_clean < min_keep_fraction * report.rows_replaced:
        raise IngestRefused(
            f"month {report.month}: the landing files ({', '.join(report.files)}) give {report.rows_clean} clean "
            f"rows ({report.rows_quarantined} quarantined) where the warehouse holds {report.rows_replaced}; rule: "
            f"a month is not replaced by fewer than {min_keep_fraction:.0%} of its clean rows unless forced "
            "(`abpo ingest --force`); nothing was published"
        )


def _audit_quarantine(report: IngestReport, *, force: bool, max_fraction: float) -> None:
    """The quarantine ceiling: a month where more than ``max_fraction`` of the landed rows broke the contract is
    not published (something upstream is broken), unless forced."""
    if force or report.rows_in == 0:
        return
    share = report.rows_quarantined / report.rows_in
    if share > max_fraction:
        fired = ", ".join(
            f"{rule} {n}" for rule, n in sorted(report.quarantined_by_rule.items(), key=lambda kv: -kv[1]) if n
        )
        raise IngestRefused(
            f"month {report.month}: {report.rows_quarantined} of {report.rows_in} landed rows ({share:.1%}) broke "
            f"the contract (rules fired: {fired}); rule: at most data.max_quarantine_fraction = {max_fraction:g} "
            "of a month may be quarantined unless forced (`abpo ingest --force`); nothing was published"
        )
