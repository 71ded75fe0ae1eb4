"""The warehouse as its callers use it: :class:`Warehouse`, the connection and SQL runner (abpo.warehouse.db) with
its parts as collaborators, each holding that connection: the ingest (abpo.warehouse.ingest), the history of a
month's versions (history), the per-user aggregate (aggregates), the strata of the update (strata) and the
interactions (interactions). Its methods say which part does the work."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow as pa

from abpo.paths import SQL_DIR
from abpo.warehouse.aggregates import AggregateBuild, Aggregates
from abpo.warehouse.db import WarehouseDB
from abpo.warehouse.history import History
from abpo.warehouse.ingest import (
    DATA_DEFAULTS,
    Ingest,
    IngestReport,
    landing_files,
    remote_landing_files,
    stage_catalog,
)
from abpo.warehouse.interactions import Interactions
from abpo.warehouse.strata import Strata


class Warehouse(WarehouseDB):
    """A DuckDB file holding impressions (clean, by month), quarantine, ingest_runs and the per-user
    aggregate user_month_stats (sql/schema.sql). Opening it brings the aggregate up to date
    (:meth:`ensure_aggregates`; what was rebuilt is in ``aggregates_rebuilt``), unless opened ``read_only`` (readers:
    no lock held against a writer's next open, nothing written). ``memory_limit`` / ``temp_directory`` bound DuckDB's
    memory and give it a spill directory. Another process holding the write lock raises WarehouseBusy."""

    landing_files = staticmethod(landing_files)
    remote_landing_files = staticmethod(remote_landing_files)

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        sql_dir: str | os.PathLike = SQL_DIR,
        read_only: bool = False,
        memory_limit: str = "",
        temp_directory: str | os.PathLike = "",
    ):
        super().__init__(
            path, sql_dir=sql_dir, read_only=read_only, memory_limit=memory_limit, temp_directory=temp_directory
        )
        self._aggregates = Aggregates(self)
        self._history = History(self, self._aggregates)
        self._ingest = Ingest(self, self._aggregates)
        self._strata = Strata(self)
        self._interactions = Interactions(self)
        self.aggregates_rebuilt: list[AggregateBuild] = []
        if self.read_only:
            return
        try:
            self.run("schema")
            self.aggregates_rebuilt = self.ensure_aggregates()
        except BaseException:
            self.con.close()
            raise

    # ------------------------------------------------------------------------ ingest (abpo.warehouse.ingest)
    def ingest_month(
        self,
        landing_dir: str | os.PathLike,
        month: str,
        known_arms: Sequence[str],
        *,
        force: bool = False,
        min_keep_fraction: float = 0.5,
        audit: Callable[[Warehouse, str], Any] | None = None,
        min_propensity: float = DATA_DEFAULTS.min_propensity,
        max_clock_skew_seconds: float = DATA_DEFAULTS.max_clock_skew_seconds,
        max_quarantine_fraction: float = DATA_DEFAULTS.max_quarantine_fraction,
        catalog: Iterable[int] | None = None,
        policy_tau: float | None = None,
        model_versions: Mapping[str, tuple[str, Iterable[str]]] | None = None,
    ) -> IngestReport:
        """Write, audit, publish ``month``'s landing files (:meth:`abpo.warehouse.ingest.Ingest.ingest_month`);
        ``audit(warehouse, month)`` is the Great Expectations suite over the staged clean rows."""
        return self._ingest.ingest_month(
            landing_dir,
            month,
            known_arms,
            force=force,
            min_keep_fraction=min_keep_fraction,
            audit=None if audit is None else partial(audit, self),
            min_propensity=min_propensity,
            max_clock_skew_seconds=max_clock_skew_seconds,
            max_quarantine_fraction=max_quarantine_fraction,
            catalog=catalog,
            policy_tau=policy_tau,
            model_versions=model_versions,
        )

    def stage_catalog(self, catalog: Iterable[int] | None) -> None:
        """The catalog's item ids as staging.ingest_catalog (:func:`abpo.warehouse.ingest.stage_catalog`)."""
        stage_catalog(self, catalog)

    # ------------------------------------------------------------------------ history (abpo.warehouse.history)
    def month_versions(self, month: str) -> list[dict]:
        """The replaced versions of ``month`` kept in impressions_history (newest last)."""
        return self._history.month_versions(month)

    def restore_month(self, month: str, version: int | None = None) -> dict:
        """Put a replaced version of ``month`` back (:meth:`abpo.warehouse.history.History.restore_month`)."""
        return self._history.restore_month(month, version)

    # ------------------------------------------------------------------------ aggregates (abpo.warehouse.aggregates)
    def stale_aggregate_months(self) -> dict[str, str]:
        """month -> why its user_month_stats rows are missing or out of date (:meth:`Aggregates.stale_months`)."""
        return self._aggregates.stale_months()

    def rebuild_aggregates(self, months: Sequence[str] | dict[str, str]) -> list[AggregateBuild]:
        """Rebuild user_month_stats for ``months`` in one transaction (:meth:`Aggregates.rebuild`)."""
        return self._aggregates.rebuild(months)

    def ensure_aggregates(self) -> list[AggregateBuild]:
        """Rebuild the stale months of user_month_stats (:meth:`Aggregates.ensure`). Called on open."""
        return self._aggregates.ensure()

    def check_aggregates(self, months: list[str] | None = None) -> pa.Table:
        """(month, arm) rows where user_month_stats disagrees with the clean impressions (:meth:`Aggregates.check`)."""
        return self._aggregates.check(months)

    def known_months(self) -> list[str]:
        """Every month the warehouse knows, ascending (sql/impression_months.sql): months holding clean impressions and
        months with an ingest run (a month whose rows were all quarantined has a run but no clean row)."""
        return [r["month"] for r in self.run("impression_months").to_pylist()]

    def ctr_by_arm_month(self, months: list[str] | None = None) -> pa.Table:
        """month, arm, impressions, clicks, users (distinct), ctr: from the clean impressions."""
        return self._aggregates.ctr_by_arm_month(months)

    def quarantine_by_rule(self, months: list[str] | None = None) -> pa.Table:
        return self._aggregates.quarantine_by_rule(months)

    # ------------------------------------------------------------------------ strata (abpo.warehouse.strata)
    def strata(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[pa.Table, pa.Table]:
        """(positive rows B_1, no-response rows B_0) of the given months without ``exclude_users``
        (:meth:`abpo.warehouse.strata.Strata.tables`)."""
        return self._strata.tables(months, exclude_users=exclude_users)

    def stratum_sizes(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[int, int]:
        """(P, N): positive and no-response rows of the given months, without the users in ``exclude_users``."""
        return self._strata.stratum_sizes(months, exclude_users=exclude_users)

    def held_out_rows(self, months: Sequence[str], users: Iterable[int]) -> list[dict]:
        """Per arm, the rows of the given months that ``strata(months, exclude_users=users)`` leaves out."""
        return self._strata.held_out_rows(months, users)

    def impression_users(self, months: Sequence[str]) -> list[int]:
        """The distinct users of the clean impressions of the given months, ascending."""
        return self._strata.impression_users(months)

    def stratified_batch_stream(
        self,
        months: Sequence[str],
        batch_size: int,
        seed: int,
        mode: str = "oversample",
        *,
        chunk_rows: int = 65536,
        exclude_users: Iterable[int] | None = None,
    ) -> Iterator[pa.Table]:
        """The stratified mini-batches of ``months`` streamed from DuckDB
        (:meth:`abpo.warehouse.strata.Strata.stratified_batch_stream`)."""
        return self._strata.stratified_batch_stream(
            months, batch_size, seed, mode, chunk_rows=chunk_rows, exclude_users=exclude_users
        )

    # -------------------------------------------------------------------- interactions (abpo.warehouse.interactions)
    def ingest_interactions(
        self, landing_dir: str | os.PathLike, month: str, *, catalog: Iterable[int] | None = None
    ) -> int | None:
        """Replace ``month``'s partition of ``interactions`` by its landed files
        (:meth:`abpo.warehouse.interactions.Interactions.ingest_interactions`)."""
        return self._interactions.ingest_interactions(landing_dir, month, catalog=catalog)

    def interaction_rows(self, month: str) -> pa.Table:
        """The interactions of the months up to and including ``month`` (one row each)."""
        return self._interactions.interaction_rows(month)

    def interactions_to_date(self, month: str) -> dict[int, list[int]]:
        """user -> the items consumed in the months up to and including ``month``, in sequence order."""
        return self._interactions.interactions_to_date(month)
