"""The warehouse's exceptions and the memory-limit grammar. Each exception's ``__module__`` is ``abpo.warehouse``, the
path it is imported from (abpo.monthly.common names them so: abpo.warehouse.IngestError, ...)."""

from __future__ import annotations

import re

from abpo.errors import ExpectedError


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


class WarehouseLost(ExpectedError, WarehouseUnreadable):
    """The warehouse file is missing or empty while the state's records (its cycle records, its registry's versions)
    show months ingested into it: creating it again would silently drop those months. A refusal, never retried."""


class WarehouseSettingError(ValueError):
    """A warehouse setting (data.warehouse_memory_limit) breaks its grammar; the message names the key and the rule."""


# DuckDB's memory_limit: a number and a unit (or a percentage of RAM). Checked here so that a wrong value is a message
# naming the config key, and passed to DuckDB as a config value, never as SQL text.
MEMORY_LIMIT_RE = re.compile(r"[0-9]+(?:\.[0-9]+)? ?(?:[KMGT]i?B|B|%)", re.IGNORECASE)


def check_memory_limit(value: str, key: str = "data.warehouse_memory_limit") -> str:
    """``value`` when it is empty (DuckDB's default) or a size such as ``2GB``, ``1.5GiB``, ``512 MB``, ``60%``."""
    if value and not MEMORY_LIMIT_RE.fullmatch(value):
        raise WarehouseSettingError(
            f"{key} {value!r}: rule: a size such as 2GB, 1.5GiB or 512MB (units B, KB, MB, GB, "
            "TB, KiB, MiB, GiB, TiB), a percentage of RAM such as 60%, or empty for DuckDB's "
            "default (80% of RAM)"
        )
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
        s in text
        for s in (
            "Corrupt database file",
            "database has been invalidated",
            "Could not read enough bytes",
            "No space left on device",
        )
    )


# the public import path: abpo.monthly.common's retry table and pickles name the classes by it
for _cls in (
    IngestError,
    IngestRefused,
    WarehouseBusy,
    WarehouseUnreadable,
    WarehouseLost,
    WarehouseSettingError,
    IngestStepFailed,
    SQLFileError,
    WarehouseIOError,
):
    _cls.__module__ = "abpo.warehouse"
del _cls
