"""The history of a month's clean partition: each ingest that replaces rows keeps them in impressions_history
(sql/ingest_history_save.sql); :meth:`History.restore_month` puts a version back."""

from __future__ import annotations

from abpo.data.schemas import check_month
from abpo.warehouse.aggregates import Aggregates
from abpo.warehouse.db import WarehouseDB
from abpo.warehouse.errors import IngestError, IngestRefused


class History:
    """The replaced versions of a month (impressions_history) and putting one back, over the warehouse's connection
    ``db``; a restore rebuilds the month's per-user aggregate with ``aggregates``."""

    def __init__(self, db: WarehouseDB, aggregates: Aggregates):
        self.db = db
        self.aggregates = aggregates

    def month_versions(self, month: str) -> list[dict]:
        """The replaced versions of ``month`` kept in impressions_history (newest last)."""
        return self.db.run("history_versions", month=check_month(month)).to_pylist()

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
        clash = self.db.run("history_restore_conflicts", month=month, version=v).to_pylist()
        if clash:
            n = clash[0]["conflicts"]
            shown = ", ".join(f"{r['impression_id']} (in {r['other_month']})" for r in clash[:5])
            raise IngestRefused(
                f"month {month}: history version {v} holds {n} impression id(s) that are now in another month, e.g. "
                f"{shown}; rule: an impression_id is unique across months (duplicate_impression_id, as at ingest); "
                "nothing was restored"
            )
        self.db.con.begin()
        try:
            self.db.run("ingest_history_save", month=month)
            self.db.run("ingest_delete_month", month=month)
            self.db.run("history_restore", month=month, version=v)
            self.db.run("history_drop", month=month, version=v)
            self.aggregates.build_user_month_stats(month)
            rows = self.db.run("month_count", month=month).column("rows")[0].as_py()
            self.db.con.commit()
        except BaseException as e:
            self.db.rollback_after(e)
            raise
        return {"month": month, "restored_version": v, "rows": rows}
