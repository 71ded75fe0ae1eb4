"""Great Expectations suite over an ingested month: the second line of defence after quarantine.

The warehouse's ingest (sql/ingest_check.sql) already keeps contract violations out of the clean
`impressions` partition. This suite re-checks the staged clean rows before the ingest publishes them (write,
audit, publish: a failure publishes nothing), and can re-check a published partition with an independent engine (GX
1.x), so a bug in the SQL rules or a row that reached the table another way is caught. sql/validate_month.sql and
sql/validate_staged.sql give GX the scalar columns plus derived checks of the list columns (item_in_candidates,
candidate_count) it cannot look inside, as the in-memory table staging.validate_batch, which GX reads through a SQL
data source (duckdb-engine on the warehouse's own connection): each expectation is an aggregate query in DuckDB and
the month never passes through pandas. The run is the GX way: a Checkpoint over a ValidationDefinition whose action
updates the Data Docs site (``validation/data_docs/index.html`` under paths.root, linked from the Airflow UI
plugin); the summary is also saved as JSON (``validation/impressions_<month>.json``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from abpo.config.data import DataConfig
from abpo.data.schemas import (
    LOGGING_POLICY_PATTERN,
    SCHEMA_VERSION,
    SINGLE_CANDIDATE_PROPENSITY_TOLERANCE,
    check_month,
)

NON_NULL = [
    "impression_id",
    "event_time",
    "user_id",
    "arm",
    "model_version",
    "item_id",
    "propensity",
    "clicked",
    "request_id",
    "position",
    "logging_policy",
    "served_at",
    "schema_version",
    "item_in_candidates",
]
_DATA_DEFAULTS = DataConfig()


class ValidationNotRun(RuntimeError):
    """The suite could not run to a verdict (an expectation DuckDB could not compute, e.g. out of memory) or its
    output could not be written (the Data Docs site or the summary: a full disk, an unwritable directory); the
    message names the suite or the path and the rule. Nothing was published."""


@dataclass
class ValidationSummary:
    month: str
    success: bool
    rows: int
    evaluated: int
    failed: list[dict] = field(default_factory=list)  # one dict per failed expectation
    results: list[dict] = field(default_factory=list)  # expectation, column, success, unexpected_count
    seconds: float = 0.0
    path: str | None = None

    def as_dict(self) -> dict:
        return {
            "month": self.month,
            "success": self.success,
            "rows": self.rows,
            "evaluated": self.evaluated,
            "failed": self.failed,
            "results": self.results,
            "seconds": round(self.seconds, 3),
        }

    def __str__(self) -> str:
        head = (
            f"GX suite impressions_{self.month}: {'PASSED' if self.success else 'FAILED'} "
            f"({self.evaluated - len(self.failed)}/{self.evaluated} expectations, {self.rows} rows, "
            f"{self.seconds:.1f}s)"
        )
        lines = [head] + [
            f"  failed {r['expectation']}({r['column'] or ''}): {r['unexpected_count']} unexpected, e.g. "
            f"{r['partial_unexpected']}"
            for r in self.failed
        ]
        if self.path:
            lines.append(f"  saved {self.path}")
        return "\n".join(lines)


def _import_gx():
    """``great_expectations``, imported with its INFO chatter kept out of the log. GX logs its internals at INFO: its
    docs decorator alone writes "Skipping registering function DataSourceManager._register_add_datasource.<locals>.
    crud_method_info because it is a closure" and three like it each time a data source manager is built (26 copies
    of each in one month's ingest task), then "Created temporary directory ...", "Loading 'datasources'", and a column
    introspection's recovered DuckDB "Binder Error". Inside an Airflow task, whose root logger takes INFO, every one
    reached the task log (each line repeated); on the CLI they never showed (root at
    WARNING). The ``great_expectations`` logger is set to WARNING before GX is imported, unless a level was set for it
    already (a deployment's logging config wins), and the one module logger GX itself sets to INFO when imported
    (``great_expectations.data_context.types.base``) is made to follow it again. abpo reports the validation itself
    (:class:`ValidationSummary`)."""
    gx_log = logging.getLogger("great_expectations")
    if gx_log.level == logging.NOTSET:
        gx_log.setLevel(logging.WARNING)
    import great_expectations as gx

    own = logging.getLogger("great_expectations.data_context.types.base")
    if own.level == logging.INFO and gx_log.level > logging.INFO:  # GX's own setLevel(INFO) at import
        own.setLevel(logging.NOTSET)
    return gx


def build_suite(
    month: str,
    known_arms: Sequence[str],
    *,
    min_propensity: float = _DATA_DEFAULTS.min_propensity,
    max_clock_skew_seconds: float = _DATA_DEFAULTS.max_clock_skew_seconds,
):
    """The expectations mirroring the impressions contract (docs/ABPO_SPEC.md D_bandit; abpo/data/schemas.py;
    sql/ingest_check.sql)."""
    gx = _import_gx()
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name=f"impressions_{month}")
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween(min_value=1))
    for col in NON_NULL:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=col))
    suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="impression_id"))
    # e0(a_log | q) is a probability over the candidate set: 0 < p <= 1, and at least data.min_propensity (> 0)
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeBetween(
            column="propensity", min_value=float(min_propensity), max_value=1.0, strict_min=min_propensity <= 0
        )
    )
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column="user_id", min_value=0))
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column="position", min_value=0))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="ids_nonempty", value_set=[True]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="logging_policy_ok", value_set=[True]))
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeBetween(
            column="serve_skew_seconds", min_value=0, max_value=float(max_clock_skew_seconds)
        )
    )
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="clicked", value_set=[0, 1]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="arm", value_set=list(known_arms)))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="item_in_candidates", value_set=[True]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="event_month", value_set=[month]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column="candidate_count", min_value=1))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="schema_version", value_set=[SCHEMA_VERSION]))
    # the propensity's consistency with its candidate set (sql/ingest_check.sql: logged_item_not_once,
    # duplicate_candidates, propensity_inconsistent) and the catalog (item_not_in_catalog)
    # at most once here; at least once is item_in_candidates's (a row failing that is not counted twice)
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(column="logged_item_count", min_value=0, max_value=1))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="candidates_unique", value_set=[True]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="propensity_consistent", value_set=[True]))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column="items_in_catalog", value_set=[True]))
    return suite


def _buffered_connection_class():
    import duckdb_engine

    class BufferedCursor(duckdb_engine.CursorWrapper):
        """duckdb-engine's cursor with its result fetched at execute time. Its cursors share their connection's one
        result set, and GX's SqlAlchemyExecutionEngine fetches a query's rows only after returning the connection to
        the pool (whose reset replaces the result), so every metric query came back empty and every expectation failed
        with "list index out of range" (great_expectations#10738, #11579). GX's metric queries return aggregates and
        at most a few unexpected values, so holding them is cheap."""

        def execute(self, statement, parameters=None, context=None):
            super().execute(statement, parameters, context)
            con = self._CursorWrapper__c
            # type codes as strings: DuckDBPyType objects kept in GX's caches outlive the duckdb module at exit
            # ("nanobind: leaked N instances" on stderr after every validated ingest)
            self._description = [(d[0], str(d[1]), *d[2:]) for d in con.description] if con.description else None
            self._rows = con.fetchmany(MAX_GX_QUERY_ROWS + 1) if con.description else []
            if con.description and len(self._rows) <= MAX_GX_QUERY_ROWS:
                assert not con.fetchmany(1)  # the result is finished: the connection is free for the next query
            elif len(self._rows) > MAX_GX_QUERY_ROWS:  # never silently cut: GX asked for rows, not an aggregate
                con.abort()
                raise RuntimeError(
                    f"a Great Expectations query returned more than {MAX_GX_QUERY_ROWS} rows; the "
                    f"suite is meant to compute aggregates: {statement[:300]}"
                )

        @property
        def description(self):
            return self._description

        @property
        def rowcount(self):
            return -1

        def fetchall(self):
            rows, self._rows = self._rows, []
            return rows

        def fetchone(self):
            return self._rows.pop(0) if self._rows else None

        def fetchmany(self, size=None):
            n = size or 1
            rows, self._rows = self._rows[:n], self._rows[n:]
            return rows

    class BufferedConnection(duckdb_engine.ConnectionWrapper):
        """A cursor of the warehouse's connection (it sees the in-memory ``staging`` database, first on its search
        path, so GX finds the batch table by its bare name) as a DBAPI connection for SQLAlchemy, with buffered
        cursors."""

        def cursor(self):
            return BufferedCursor(self._ConnectionWrapper__c, self)

    return BufferedConnection


def _BufferedConnection(duckdb_cursor):  # noqa: N802 - a class built on first use (duckdb-engine imported lazily)
    global _BUFFERED
    if _BUFFERED is None:
        _BUFFERED = _buffered_connection_class()
    duckdb_cursor.execute("SET search_path = 'staging,main'")
    return _BUFFERED(duckdb_cursor)


_BUFFERED = None
MAX_GX_QUERY_ROWS = 10_000  # GX's metric queries return aggregates and at most 20 unexpected values per expectation


def validate_month(
    warehouse,
    month: str,
    known_arms: Sequence[str],
    *,
    out_dir: str | os.PathLike | None = None,
    staged: bool = False,
    min_propensity: float = _DATA_DEFAULTS.min_propensity,
    max_clock_skew_seconds: float = _DATA_DEFAULTS.max_clock_skew_seconds,
    catalog=None,
) -> ValidationSummary:
    """Run the suite on ``month``'s clean partition, or with ``staged`` on the clean rows of the ingest in progress
    before they are published (the ingest's audit); with ``out_dir`` update the GX Data Docs in ``out_dir/data_docs``
    and, for a published partition (not ``staged``), save the summary there. A staged audit's summary is saved by
    the ingest only once it has published (:func:`save_summary`): a refused ingest leaves the month's summary as it
    was. ``catalog``: the item ids the published partition is checked against (items_in_catalog); a staged audit
    uses the ingest's catalog (staging.ingest_catalog). A suite that cannot run, or an output that cannot be
    written, raises :class:`ValidationNotRun` naming the suite or the path.

    The run is the GX way: a Checkpoint over a ValidationDefinition (suite + batch definition) whose action updates
    the Data Docs site. GX reads the batch through SQL: a SQL data source on a cursor of the warehouse's own
    connection (:class:`_BufferedConnection`), the batch being the in-memory table staging.validate_batch
    (sql/validate_staged.sql or sql/validate_month.sql), so each expectation is an aggregate query in DuckDB and only
    counts and a few unexpected values come back: the month never passes through pandas."""
    gx = _import_gx()

    check_month(month)
    t0 = time.perf_counter()
    _stage_batch(warehouse, month, staged, catalog)
    try:
        rows = warehouse.con.execute("SELECT count(*) FROM staging.validate_batch").fetchall()[0][0]
        outcome = _run_checkpoint(
            gx,
            warehouse,
            month,
            known_arms,
            staged=staged,
            out_dir=out_dir,
            min_propensity=min_propensity,
            max_clock_skew_seconds=max_clock_skew_seconds,
        )
    finally:
        warehouse.con.execute("DROP TABLE IF EXISTS staging.validate_batch")
        if not staged:
            warehouse.con.execute("DROP TABLE IF EXISTS staging.ingest_catalog")
    (result,) = outcome.run_results.values()
    _refuse_uncomputed_expectations(result, month)
    results = _expectation_results(result)
    summary = ValidationSummary(
        month=month,
        success=bool(result.success),
        rows=int(rows),
        evaluated=len(results),
        failed=[r for r in results if not r["success"]],
        results=results,
        seconds=time.perf_counter() - t0,
    )
    if out_dir is not None and not staged:
        save_summary(summary, out_dir)
    return summary


def _stage_batch(warehouse, month: str, staged: bool, catalog) -> None:
    """Build the batch staging.validate_batch (sql/validate_staged.sql, or sql/validate_month.sql over the published
    partition with ``catalog`` staged as staging.ingest_catalog); on failure the staged catalog is dropped and an
    out-of-memory error becomes :class:`ValidationNotRun`."""
    tol = SINGLE_CANDIDATE_PROPENSITY_TOLERANCE
    if not staged:
        warehouse.stage_catalog(catalog)
    try:
        if staged:
            warehouse.run("validate_staged", logging_policy_re=LOGGING_POLICY_PATTERN, single_candidate_tolerance=tol)
        else:
            warehouse.run(
                "validate_month", month=month, logging_policy_re=LOGGING_POLICY_PATTERN, single_candidate_tolerance=tol
            )
    except Exception as e:
        if not staged:
            warehouse.con.execute("DROP TABLE IF EXISTS staging.ingest_catalog")
        if _out_of_memory(e):
            raise ValidationNotRun(_oom_message(month, e)) from e
        raise


def _run_checkpoint(
    gx,
    warehouse,
    month: str,
    known_arms: Sequence[str],
    *,
    staged: bool,
    out_dir: str | os.PathLike | None,
    min_propensity: float,
    max_clock_skew_seconds: float,
):
    """The GX run over staging.validate_batch: an ephemeral context (with the Data Docs site under
    ``out_dir/data_docs`` when given), a SQL data source on the warehouse's connection, the suite, a validation
    definition and a checkpoint; returns the checkpoint's result. A Data Docs site that cannot be written raises
    :class:`ValidationNotRun` naming the path."""
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    docs = Path(out_dir) / "data_docs" if out_dir is not None else None
    if docs is not None:
        context.add_data_docs_site(
            "abpo",
            {
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    source = context.data_sources.add_sql(
        name="warehouse",
        connection_string="duckdb:///:memory:",  # the URL names the dialect; creator connects
        kwargs={"creator": lambda: _BufferedConnection(warehouse.con.cursor())},
    )
    # a table asset (not a query asset: GX reflects a query's columns by running the whole query)
    batch_def = source.add_table_asset(
        name=f"impressions_{month}" + ("_staged" if staged else ""), table_name="validate_batch"
    ).add_batch_definition_whole_table("clean_rows")
    suite = context.suites.add(
        build_suite(month, known_arms, min_propensity=min_propensity, max_clock_skew_seconds=max_clock_skew_seconds)
    )
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"impressions_{month}", data=batch_def, suite=suite)
    )
    # only abpo's site: an ephemeral context also has GX's default "local_site" in a new temp directory, which the
    # action would build too and nothing removes (a whole Data Docs site left in the system's temp directory by every validation)
    actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=["abpo"])] if docs is not None else []
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(name=f"ingest_{month}", validation_definitions=[definition], actions=actions)
    )
    try:
        return checkpoint.run()
    except OSError as e:  # the Data Docs site: a full disk, an unwritable directory
        raise ValidationNotRun(
            f"{getattr(e, 'filename', None) or docs}: the Great Expectations Data Docs of impressions_{month} "
            f"could not be written ({e.strerror or e}); rule: validation/data_docs under paths.root must be "
            "writable with free space; nothing was published"
        ) from e


def _refuse_uncomputed_expectations(result, month: str) -> None:
    """An expectation that could not be computed is a broken validation, not a failed one: raise
    :class:`ValidationNotRun` naming it (an out-of-memory one as such)."""
    for r in result.results:
        info = r.exception_info or {}
        errors = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
        errors = [e for e in errors if e.get("raised_exception")]
        if errors:
            message = str(errors[0].get("exception_message"))
            if _out_of_memory(message):
                raise ValidationNotRun(_oom_message(month, message))
            raise ValidationNotRun(
                f"GX suite impressions_{month}: {r.expectation_config.type} could not be "
                f"computed: {message.splitlines()[0][:300] if message else ''}; nothing was "
                "published"
            )


def _expectation_results(result) -> list[dict]:
    """One dict per expectation of the run (type, column, success, unexpected count, up to five unexpected values,
    the observed value), as the summary stores them."""
    results = []
    for r in result.results:
        cfg = r.expectation_config
        res = r.result or {}
        results.append(
            {
                "expectation": cfg.type,
                "column": cfg.kwargs.get("column"),
                "success": bool(r.success),
                "unexpected_count": res.get("unexpected_count", 0) or 0,
                "partial_unexpected": [str(v) for v in (res.get("partial_unexpected_list") or [])[:5]],
                "observed_value": str(res["observed_value"]) if "observed_value" in res else None,
            }
        )
    return results


def save_summary(summary: ValidationSummary, out_dir: str | os.PathLike) -> Path:
    """Write ``summary`` as ``out_dir/impressions_<month>.json`` (whole, then renamed: a reader such as the UI plugin
    never sees half a file; a failed write leaves the previous summary and no temporary file) and set its ``path``.
    ValidationNotRun names the file when it cannot be written."""
    out = Path(out_dir)
    path = out / f"impressions_{summary.month}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(summary.as_dict(), indent=2))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ValidationNotRun(
            f"{path}: the GX summary could not be written ({e.strerror or e}); rule: the "
            "validation directory under paths.root must be writable with free space"
        ) from e
    summary.path = str(path)
    return path


def _out_of_memory(error) -> bool:
    text = str(error)
    return "OutOfMemory" in type(error).__name__ or "Out of Memory" in text or "out of memory" in text.lower()


def _oom_message(month: str, error) -> str:
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    return (
        f"GX suite impressions_{month}: out of memory while validating the staged rows ({first}); rule: the "
        "month must fit data.warehouse_memory_limit (or $ABPO_WAREHOUSE_MEMORY_LIMIT) with spill space in "
        "data.warehouse_temp_directory: raise the limit, or land the month in smaller ingests; nothing was "
        "published"
    )
