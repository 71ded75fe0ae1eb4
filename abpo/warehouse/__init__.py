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

The package follows those seams: db.py (the connection, the SQL runner, the transactions), core.py
(:class:`Warehouse`: the connection with its parts), ingest.py, history.py, aggregates.py, strata.py and
interactions.py (the parts, each a class holding the connection it works on), errors.py (the exceptions), from_config.py (the warehouse, the ingest and a synthetic landed month as the config describes them). Every name is imported from
``abpo.warehouse`` (the stratified mini-batches' plan is abpo.data.batching, the schemas' rules abpo.data.schemas).
"""

from abpo.warehouse.aggregates import AggregateBuild
from abpo.warehouse.core import Warehouse
from abpo.warehouse.db import sweep_spill_files
from abpo.warehouse.errors import (
    MEMORY_LIMIT_RE,
    IngestError,
    IngestRefused,
    IngestStepFailed,
    SQLFileError,
    WarehouseBusy,
    WarehouseIOError,
    WarehouseLost,
    WarehouseSettingError,
    WarehouseUnreadable,
    check_memory_limit,
)
from abpo.warehouse.from_config import (
    MEMORY_LIMIT_ENV,
    config_catalog,
    ingest_with_config,
    land_synthetic,
    open_warehouse,
    recorded_months,
    require_warehouse,
    warehouse_memory_limit,
)
from abpo.warehouse.ingest import IngestReport
from abpo.warehouse.strata import EXCLUDED_USERS_TABLE

__all__ = [
    "EXCLUDED_USERS_TABLE",
    "MEMORY_LIMIT_ENV",
    "MEMORY_LIMIT_RE",
    "AggregateBuild",
    "IngestError",
    "IngestRefused",
    "IngestReport",
    "IngestStepFailed",
    "SQLFileError",
    "Warehouse",
    "WarehouseBusy",
    "WarehouseIOError",
    "WarehouseLost",
    "WarehouseSettingError",
    "WarehouseUnreadable",
    "check_memory_limit",
    "config_catalog",
    "ingest_with_config",
    "land_synthetic",
    "open_warehouse",
    "recorded_months",
    "require_warehouse",
    "sweep_spill_files",
    "warehouse_memory_limit",
]
