"""The strata of docs/ABPO_SPEC.md step 3 (B_1 positive, B_0 no-response rows) read from the clean impressions,
without the gate's held-out users, and their stratified mini-batches streamed from DuckDB (the plan:
abpo/data/batching.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from abpo.data.batching import stratified_batch_plan
from abpo.data.schemas import check_month
from abpo.warehouse.db import WarehouseDB
from abpo.warehouse.errors import SQLFileError

# the Arrow table of user ids the strata's SQL files anti-join (Strata.tables: the gate's held-out users)
EXCLUDED_USERS_TABLE = "strata_excluded_users"


class Strata:
    """The strata B_1 / B_0 of given months and their stratified mini-batches streamed from DuckDB, over the
    warehouse's connection ``db`` (read-only use: nothing is written)."""

    def __init__(self, db: WarehouseDB):
        self.db = db

    @contextmanager
    def _excluded_users(self, users: Iterable[int] | None) -> Iterator[None]:
        """Register ``users`` (none when None or empty) as the Arrow table ``strata_excluded_users`` (user_id BIGINT)
        that the strata's SQL files anti-join, for the duration of the block."""
        ids = pa.array(sorted({int(u) for u in users or ()}), pa.int64())
        self.db.con.register(EXCLUDED_USERS_TABLE, pa.table({"user_id": ids}))
        try:
            yield
        finally:
            self.db.con.unregister(EXCLUDED_USERS_TABLE)

    def tables(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[pa.Table, pa.Table]:
        """(positive rows B_1, no-response rows B_0) of the given months, each in a stable order, without the rows of
        the users in ``exclude_users`` (an anti-join in DuckDB: the gate's held-out users, abpo.data.holdout)."""
        ms = [check_month(m) for m in months]
        with self._excluded_users(exclude_users):
            return self.db.run("stratify", months=ms, clicked=1), self.db.run("stratify", months=ms, clicked=0)

    def stratum_sizes(self, months: Sequence[str], *, exclude_users: Iterable[int] | None = None) -> tuple[int, int]:
        """(P, N): positive and no-response rows of the given months, without the users in ``exclude_users``."""
        with self._excluded_users(exclude_users):
            row = self.db.run("stratum_sizes", months=[check_month(m) for m in months]).to_pylist()[0]
        return int(row["positive"]), int(row["no_response"])

    def held_out_rows(self, months: Sequence[str], users: Iterable[int]) -> list[dict]:
        """Per arm, the rows of the given months that ``tables(months, exclude_users=users)`` leaves out: dicts
        (arm, positive, no_response, users), by arm (sql/strata_held_out.sql)."""
        with self._excluded_users(users):
            return self.db.run("strata_held_out", months=[check_month(m) for m in months]).to_pylist()

    def impression_users(self, months: Sequence[str]) -> list[int]:
        """The distinct users of the clean impressions of the given months, ascending."""
        t = self.db.run("impression_users", months=[check_month(m) for m in months])
        return [int(u) for u in t.column("user_id").to_pylist()]

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
        """The stratified mini-batches of ``months`` (:func:`stratified_batch_plan`, the same batches as
        :func:`stratified_batch_tables` over :meth:`tables`), streamed from DuckDB as Arrow tables of whole batches
        (about ``chunk_rows`` rows each; the strata's columns plus ``batch`` and ``slot``, in (batch, slot) order).
        Only the plan's integers are held in Python; DuckDB joins, sorts and spills (memory_limit / temp_directory),
        so a month of any size streams in bounded memory (sql/stratified_batches.sql). The users in
        ``exclude_users`` are left out, as by :meth:`tables`."""
        ms = [check_month(m) for m in months]
        excluded = sorted({int(u) for u in exclude_users or ()})
        plan = stratified_batch_plan(*self.stratum_sizes(ms, exclude_users=excluded), batch_size, seed, mode)
        text = self.db.sql_text("stratified_batches")
        self.db.con.register("batch_plan_positive", plan.stratum(True))
        self.db.con.register("batch_plan_no_response", plan.stratum(False))
        self.db.con.register(EXCLUDED_USERS_TABLE, pa.table({"user_id": pa.array(excluded, pa.int64())}))
        try:
            try:
                reader = self.db.con.sql(text, params={"months": ms}).to_arrow_reader(chunk_rows)
            except Exception as e:  # noqa: BLE001 - say which file
                raise SQLFileError(f"{self.db.sql_dir / 'stratified_batches.sql'}: {type(e).__name__}: {e}") from e
            carry = None  # rows of a batch that continues in the next record batch
            for rb in reader:
                chunk = (
                    pa.Table.from_batches([rb])
                    if carry is None
                    else pa.concat_tables([carry, pa.Table.from_batches([rb])])
                )
                batch = chunk.column("batch").to_numpy()
                cut = int(np.searchsorted(batch, batch[-1]))  # the last batch may be incomplete
                if cut > 0:
                    yield chunk.slice(0, cut)
                carry = chunk.slice(cut)
            if carry is not None and carry.num_rows:
                yield carry
        finally:
            self.db.con.unregister("batch_plan_positive")
            self.db.con.unregister("batch_plan_no_response")
            self.db.con.unregister(EXCLUDED_USERS_TABLE)
