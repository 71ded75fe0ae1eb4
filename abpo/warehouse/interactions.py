"""The interactions landed with each month (landing/interactions/month=YYYY-MM/, INTERACTIONS_SCHEMA): ingested
into ``interactions`` (items outside the catalog to ``interactions_quarantine``) and read back to date."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from abpo.data import storage
from abpo.data.schemas import INTERACTIONS_SCHEMA, check_month, month_dir, schema_problems
from abpo.warehouse.db import WarehouseDB
from abpo.warehouse.errors import IngestError
from abpo.warehouse.ingest import remote_landing_files, stage_catalog

log = logging.getLogger("abpo.warehouse")  # the package logs as the one module did


class Interactions:
    """The interactions (user, item, month, position) ingested with each month, and read back to date, over the
    warehouse's connection ``db``."""

    def __init__(self, db: WarehouseDB):
        self.db = db

    def ingest_interactions(
        self, landing_dir: str | os.PathLike, month: str, *, catalog: Iterable[int] | None = None
    ) -> int | None:
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

    def _replace_interactions(
        self, month: str, paths: list[str], sources: list[str], catalog: Iterable[int] | None
    ) -> int:
        """The month's partition of ``interactions`` replaced by the rows of the local Parquet files ``paths``
        (``sources``: where each came from, recorded as source_file), in one transaction; with ``catalog`` the rows
        of items outside it go to ``interactions_quarantine`` (item_not_in_catalog, logged)."""
        stage_catalog(self.db, catalog)
        check = catalog is not None
        self.db.con.begin()
        try:
            self.db.run("interactions_delete_month", month=month)
            self.db.run("interactions_quarantine_delete", month=month)
            self.db.run(
                "interactions_quarantine_insert", month=month, files=paths, sources=sources, check_catalog=check
            )
            self.db.run("interactions_insert", month=month, files=paths, sources=sources, check_catalog=check)
            rows = self.db.con.execute("SELECT count(*) FROM interactions WHERE month = $m", {"m": month}).fetchall()[
                0
            ][0]
            quarantined = self.db.con.execute(
                "SELECT count(*), min(item_id) FROM interactions_quarantine WHERE month = $m", {"m": month}
            ).fetchall()[0]
            self.db.commit(f"the interactions of month {month}")
        except BaseException as e:
            self.db.rollback_after(e)
            raise
        finally:
            self.db.con.execute("DROP TABLE IF EXISTS staging.ingest_catalog")
        if quarantined[0]:
            log.warning(
                "interactions %s: %d row(s) quarantined (item_not_in_catalog, e.g. item %s) in interactions_quarantine",
                month,
                quarantined[0],
                quarantined[1],
            )
        return int(rows)

    def _ingest_remote_interactions(self, landing: str, month: str, catalog: Iterable[int] | None = None) -> int | None:
        """:meth:`ingest_interactions` for an object-store landing zone: the partition's objects (checked as
        :func:`abpo.warehouse.ingest.remote_landing_files` does; no completion marker required: the impressions partition's gates the
        month) copied locally and inserted with their URIs as ``source_file``."""
        import tempfile

        try:
            files = remote_landing_files(landing, month, "interactions", INTERACTIONS_SCHEMA)
        except IngestError as e:
            if "no landing partition" in str(e) or "holds no files" in str(e):
                return None
            raise
        with tempfile.TemporaryDirectory(prefix="abpo-landing-", dir=self.db.temp_directory or None) as tmp:
            try:
                local = storage.download(files, tmp)
            except storage.StorageError as e:
                raise IngestError(str(e)) from None
            return self._replace_interactions(month, list(local), [storage.split_query(u)[0] for u in files], catalog)

    def interaction_rows(self, month: str) -> pa.Table:
        """The interactions of the months up to and including ``month``: user_id, item_id, month, position,
        source_file (the landed file it came from), ordered by user, month, position (sql/interactions_to_date.sql);
        no rows for a warehouse without interactions."""
        has = self.db.con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'interactions'")
        if not has.fetchall()[0][0]:
            return pa.table(
                {
                    "user_id": pa.array([], pa.int64()),
                    "item_id": pa.array([], pa.int64()),
                    "month": pa.array([], pa.string()),
                    "position": pa.array([], pa.int32()),
                    "source_file": pa.array([], pa.string()),
                }
            )
        return self.db.run("interactions_to_date", month=check_month(month))

    def interactions_to_date(self, month: str) -> dict[int, list[int]]:
        """user -> the items consumed in the months up to and including ``month``, in sequence order (empty for a
        warehouse without interactions)."""
        t = self.interaction_rows(month)
        out: dict[int, list[int]] = {}
        for u, i in zip(t.column("user_id").to_pylist(), t.column("item_id").to_pylist()):
            out.setdefault(int(u), []).append(int(i))
        return out
