"""The embedded warehouse: a DuckDB file, and one small runner for the named SQL files in sql/.

Every transform is a readable file ``sql/<name>.sql`` executed by :meth:`Warehouse.run` with bound
parameters (``$name`` in the file, ``name=value`` in Python); no SQL is built by concatenation.

Monthly ingest (:meth:`Warehouse.ingest_month`):
1. the month's landing files are listed and each is checked to be Parquet with the impressions
   schema; a file that is not fails the whole ingest (IngestError names the file and the problem)
   before anything changes;
2. ingest_stage.sql reads them, ingest_check.sql applies the contract row by row;
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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from abpo.data.schemas import IMPRESSIONS_SCHEMA, RULES, SCHEMA_VERSION, check_month, month_dir, schema_problems

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
log = logging.getLogger(__name__)



class IngestError(RuntimeError):
    """The landing data of a month cannot be ingested at all (missing, not Parquet, wrong schema)."""


class IngestRefused(IngestError):
    """The staged month failed its audit (the replace guard or the Great Expectations suite): nothing was published,
    the month's partition is as it was."""


class WarehouseBusy(RuntimeError):
    """Another process holds the DuckDB file's write lock."""


class SQLFileError(RuntimeError):
    """A named SQL file is missing or failed; the message names the file."""


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
        try:
            self.con = duckdb.connect(str(path), read_only=self.read_only)
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                raise WarehouseBusy(f"{path}: the warehouse is in use by another process (DuckDB allows one writer); "
                                    f"retry when it has finished ({str(e).splitlines()[0][:200]})") from None
            raise
        self.con.execute("SET TimeZone = 'UTC'")
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        if temp_directory:
            Path(temp_directory).mkdir(parents=True, exist_ok=True)
            self.con.execute(f"SET temp_directory = '{Path(temp_directory).as_posix()}'")
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
            raise SQLFileError(f"{self.sql_dir / (name + '.sql')}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ ingest
    @staticmethod
    def landing_files(landing_dir: str | os.PathLike, month: str) -> list[Path]:
        """The month's landing files; each must be Parquet with the impressions schema (IngestError
        otherwise). Hidden files and markers (names starting with '.' or '_') are ignored."""
        d = month_dir(landing_dir, month)
        if not d.is_dir():
            raise IngestError(f"{d}: no landing partition for month {month}")
        files = sorted(p for p in d.iterdir() if not p.name.startswith((".", "_")))
        if not files:
            raise IngestError(f"{d}: the landing partition holds no files")
        for p in files:
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

    def ingest_month(
        self, landing_dir: str | os.PathLike, month: str, known_arms: Sequence[str], *, force: bool = False,
        min_keep_fraction: float = 0.5, audit=None,
    ) -> IngestReport:
        """Write, audit, publish ``month``'s landing files.

        write    stage the files (a corrupt one is named) and apply the contract: violations go to quarantine
        audit    refuse (IngestRefused, nothing published) when the month would be replaced by 0 clean rows, or by
                 fewer than ``min_keep_fraction`` of the clean rows it holds, unless ``force``; then ``audit(self,
                 month)`` (the Great Expectations suite over the staged clean rows) must return an object whose
                 ``success`` is true
        publish  in one transaction: the rows being replaced move to ``impressions_history`` (restorable with
                 :meth:`restore_month`), the month's partition and quarantine are replaced, the run is logged
        """
        check_month(month)
        t0 = time.perf_counter()
        files = self.landing_files(landing_dir, month)
        report = IngestReport(month=month, files=[p.name for p in files])
        self._stage(files)
        try:
            self.run("ingest_check", month=month, known_arms=list(known_arms), schema_version=SCHEMA_VERSION)
            for row in self.run("ingest_rule_counts").to_pylist():
                if row["rule"] is None:
                    report.rows_clean = row["rows"]
                else:
                    report.quarantined_by_rule[row["rule"]] = row["rows"]
            report.rows_in = report.rows_clean + report.rows_quarantined
            report.rows_replaced = self.run("month_count", month=month).column("rows")[0].as_py()
            self._audit_replace(report, force=force, min_keep_fraction=min_keep_fraction)
            if audit is not None:
                summary = audit(self, month)
                report.audit = summary
                if not summary.success:
                    raise IngestRefused(f"month {month}: the staged rows failed the Great Expectations suite; nothing "
                                        f"was published, the month's partition is unchanged.\n{summary}")
            self.con.begin()
            try:
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
                self.con.commit()
            except BaseException:
                self.con.rollback()
                raise
        finally:
            self.run("ingest_drop_stage")
        report.seconds = time.perf_counter() - t0
        return report

    def _stage(self, files: list[Path]) -> None:
        """Stage the files; when DuckDB cannot read them, find and name the corrupt one."""
        try:
            self.run("ingest_stage", files=[str(p.resolve()) for p in files])
        except SQLFileError as e:
            for p in files:
                try:
                    self.con.sql("SELECT count(*) FROM read_parquet($f)", params={"f": str(p.resolve())}).fetchall()
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
                "(`abpo data ingest --force`); nothing was published")

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
        self.con.begin()
        try:
            self.run("ingest_history_save", month=month)
            self.run("ingest_delete_month", month=month)
            self.run("history_restore", month=month, version=v)
            self.run("history_drop", month=month, version=v)
            self._build_user_month_stats(month)
            rows = self.run("month_count", month=month).column("rows")[0].as_py()
            self.con.commit()
        except BaseException:
            self.con.rollback()
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

    def strata(self, months: Sequence[str]) -> tuple[pa.Table, pa.Table]:
        """(positive rows B_1, no-response rows B_0) of the given months, each in a stable order."""
        ms = [check_month(m) for m in months]
        return self.run("stratify_positive", months=ms), self.run("stratify_no_response", months=ms)

    def months(self) -> list[str]:
        return [r[0] for r in self.con.execute("SELECT DISTINCT month FROM impressions ORDER BY 1").fetchall()]


def open_warehouse(cfg, *, read_only: bool = False) -> Warehouse:
    """The config's warehouse (paths.warehouse) with its memory limit and spill directory (section data)."""
    tmp = cfg.data.warehouse_temp_directory
    if tmp and not Path(tmp).is_absolute():
        tmp = str(cfg.paths.resolve("root") / tmp)
    return Warehouse(cfg.paths.resolve("warehouse"), read_only=read_only, memory_limit=cfg.data.warehouse_memory_limit,
                     temp_directory=tmp)


def _as_table(rows) -> pa.Table:
    return rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))


def stratified_batches(
    positive: pa.Table | Sequence[dict],
    no_response: pa.Table | Sequence[dict],
    batch_size: int,
    seed: int,
    mode: str = "oversample",
) -> Iterator[list[dict]]:
    """Mini-batches of ``batch_size`` rows that each hold both strata (ABPO_SPEC.md step 3: the SNIPS
    weight is self-normalised inside B_1 and B_0 of every mini-batch, so both must be present).

    Every batch holds k = clamp(round(batch_size * P / (P + N)), 1, batch_size - 1) positive rows and
    batch_size - k no-response rows, so the strata keep their overall proportion. One pass (an epoch)
    covers every row of both strata at least once, in a seeded shuffled order; the number of batches is
    max(ceil(P / k), ceil(N / (batch_size - k))). The stratum that runs out first is NOT dropped and no
    batch goes without it: it is recycled in a fresh seeded shuffle, so some of its rows appear twice in
    the epoch (rows are never silently dropped, and a short last batch never happens). An empty stratum
    raises ValueError: no batch could hold both.

    ``mode="proportional"`` uses every row at most once instead: floor((P + N) / batch_size) batches, the
    positives spread as evenly as the count allows (each batch gets floor or ceil of P / n_batches), the rest
    no-response rows; the (P + N) mod batch_size rows that fill no batch are left out (the caller counts them,
    `BatchingReport.rows_not_in_batches`). It raises ValueError when a stratum has fewer rows than there are
    batches (some batch would lack it).
    """
    if batch_size < 2:
        raise ValueError(f"batch_size={batch_size}: a batch holding both strata needs at least 2 rows")
    pos, neg = _as_table(positive), _as_table(no_response)
    P, N = pos.num_rows, neg.num_rows
    if P == 0 or N == 0:
        empty = "positive" if P == 0 else "no-response"
        raise ValueError(f"the {empty} stratum is empty: no mini-batch can hold both strata (P={P}, N={N})")
    if mode not in ("oversample", "proportional"):
        raise ValueError(f"stratified_batches: mode {mode!r}; rule: oversample | proportional")
    rng = np.random.default_rng([int(seed), 0x57A7])
    if mode == "proportional":
        yield from _proportional_batches(pos, neg, batch_size, rng)
        return
    k = min(max(int(round(batch_size * P / (P + N))), 1), batch_size - 1)
    n_batches = max(-(-P // k), -(-N // (batch_size - k)))

    def stream(n: int, need: int) -> np.ndarray:
        """``need`` indices: seeded permutations of range(n) back to back (recycling after n)."""
        reps = -(-need // n)
        return np.concatenate([rng.permutation(n) for _ in range(reps)])[:need]

    pos_idx = stream(P, n_batches * k).reshape(n_batches, k)
    neg_idx = stream(N, n_batches * (batch_size - k)).reshape(n_batches, batch_size - k)
    chunk = max(1, 8192 // batch_size)  # materialise rows a few thousand at a time
    for start in range(0, n_batches, chunk):
        p_rows = pos.take(pa.array(pos_idx[start : start + chunk].reshape(-1))).to_pylist()
        n_rows = neg.take(pa.array(neg_idx[start : start + chunk].reshape(-1))).to_pylist()
        for b in range(min(chunk, n_batches - start)):
            yield p_rows[b * k : (b + 1) * k] + n_rows[b * (batch_size - k) : (b + 1) * (batch_size - k)]


def _proportional_batches(pos: pa.Table, neg: pa.Table, batch_size: int, rng) -> Iterator[list[dict]]:
    """stratified_batches(mode="proportional"): each row at most once, positives spread evenly."""
    P, N = pos.num_rows, neg.num_rows
    n_batches = (P + N) // batch_size
    if n_batches == 0 or P < n_batches or N < n_batches:
        raise ValueError(
            f"proportional stratification: P={P} positive and N={N} no-response rows in batches of {batch_size} make "
            f"{n_batches} batch(es); rule: each stratum needs at least one row per batch (use mode='oversample')"
        )
    p_counts = np.full(n_batches, P // n_batches)
    p_counts[: P % n_batches] += 1
    p_counts = np.minimum(p_counts, batch_size - 1)  # leave room for a no-response row
    n_counts = batch_size - p_counts
    pos_idx, neg_idx = rng.permutation(P), rng.permutation(N)
    po = np.concatenate([[0], np.cumsum(p_counts)])
    no = np.concatenate([[0], np.cumsum(n_counts)])
    if no[-1] > N:
        raise ValueError(f"proportional stratification: {N} no-response rows cannot fill {n_batches} batches of "
                         f"{batch_size} next to {P} positives; rule: use mode='oversample'")
    p_rows = pos.take(pa.array(pos_idx[: po[-1]])).to_pylist()
    n_rows = neg.take(pa.array(neg_idx[: no[-1]])).to_pylist()
    for b in range(n_batches):
        yield p_rows[po[b] : po[b + 1]] + n_rows[no[b] : no[b + 1]]
