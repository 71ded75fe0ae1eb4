"""The per-user aggregate user_month_stats (month, arm, user_id, impressions, clicks) that the A/B report reads
(sql/report_user_moments.sql), rebuilt from a month's clean partition (sql/user_month_stats_*.sql), and the
aggregate queries over the clean impressions and the quarantine."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from abpo.data.schemas import check_month
from abpo.warehouse.db import WarehouseDB

log = logging.getLogger("abpo.warehouse")  # the package logs as the one module did


@dataclass
class AggregateBuild:
    """One month of user_month_stats rebuilt from the clean impressions (Aggregates.rebuild)."""

    month: str
    reason: str
    users: int  # (arm, user) rows
    impressions: int
    clicks: int


class Aggregates:
    """The per-user aggregate user_month_stats (built, checked, rebuilt) and the aggregate queries, over the
    warehouse's connection ``db``."""

    def __init__(self, db: WarehouseDB):
        self.db = db

    def build_user_month_stats(self, month: str) -> dict:
        """Replace ``month``'s rows of user_month_stats by its clean impressions summed per (arm, user)
        and mark it built as of the month's ingest runs. Runs inside the caller's transaction."""
        self.db.run("user_month_stats_delete", month=month)
        self.db.run("user_month_stats_insert", month=month)
        built = self.db.run("user_month_stats_mark", month=month).to_pylist()
        return built[0]

    def stale_months(self) -> dict[str, str]:
        """month -> why its user_month_stats rows are missing or out of date. Cheap (reads ingest_runs and
        user_month_stats_built), except for a warehouse that predates the aggregate, where every month of
        ``impressions`` is listed (one scan of the month column)."""
        if self.db.run("user_month_stats_predates").column("predates")[0].as_py():
            return {
                r["month"]: "the warehouse predates the per-user aggregate"
                for r in self.db.run("impression_months").to_pylist()
            }
        return {r["month"]: r["reason"] for r in self.db.run("user_month_stats_stale").to_pylist()}

    def rebuild(self, months: Sequence[str] | dict[str, str]) -> list[AggregateBuild]:
        """Rebuild user_month_stats for ``months`` (a list, or month -> reason) from the clean impressions,
        all in ONE transaction: a failure leaves every month as it was."""
        reasons = dict(months) if isinstance(months, dict) else {m: "rebuild requested" for m in months}
        builds = []
        self.db.con.begin()
        try:
            for m in sorted(reasons):
                totals = self.build_user_month_stats(check_month(m))
                builds.append(AggregateBuild(month=m, reason=reasons[m], **totals))
            self.db.con.commit()
        except BaseException:
            self.db.con.rollback()
            raise
        return builds

    def ensure(self) -> list[AggregateBuild]:
        """Rebuild the months :meth:`stale_months` lists (none in the common case: ingest keeps
        the aggregate current). Called on open."""
        stale = self.stale_months()
        if not stale:
            return []
        builds = self.rebuild(stale)
        for b in builds:
            log.warning(
                "%s: rebuilt user_month_stats for %s (%s): %d users, %d impressions",
                self.db.path,
                b.month,
                b.reason,
                b.users,
                b.impressions,
            )
        return builds

    def check(self, months: list[str] | None = None) -> pa.Table:
        """(month, arm) rows where user_month_stats disagrees with the raw clean impressions (users,
        impressions or clicks); empty when it is current. Scans the raw rows: a check, not for the report."""
        return self.db.run(
            "user_month_stats_check", months=[check_month(m) for m in months] if months is not None else None
        )

    # ------------------------------------------------------------------------------------ queries
    def ctr_by_arm_month(self, months: list[str] | None = None) -> pa.Table:
        """month, arm, impressions, clicks, users (distinct), ctr: from the clean impressions."""
        return self.db.run("ctr_by_arm_month", months=[check_month(m) for m in months] if months is not None else None)

    def quarantine_by_rule(self, months: list[str] | None = None) -> pa.Table:
        return self.db.run(
            "quarantine_by_rule", months=[check_month(m) for m in months] if months is not None else None
        )
