"""Impression tables the warehouse, storage and fault tests land and ingest: clean synthetic rows (of the tiny
preset's catalog, or of the generator's own items), a row changed in place, and a script that runs an `abpo` command
on a disk that fills up."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions

MONTH = "2026-01"


def land(state: Path, table: pa.Table, month: str = MONTH, part: str = "a") -> Path:
    """``table`` written to the landing zone of ``state`` as month ``month``'s part ``part``."""
    return write_impressions(table, state / "landing", month, part=part)


def catalog() -> list[int]:
    """The tiny preset's catalog (the bundled MovieLens items): what `abpo ingest` checks items against."""
    from abpo.config import load_config
    from abpo.warehouse import config_catalog

    return config_catalog(load_config("tiny"))


def clean_table(n: int = 50, month: str = MONTH, seed: int = 0, prefix: str = "") -> pa.Table:
    """``n`` synthetic impressions of ``month`` that break no rule, their items in :func:`catalog`."""
    return synthetic_impressions(n, month, seed=seed, violation_rate=0.0, id_prefix=prefix, item_ids=catalog())[0]


def synthetic_table(month: str = MONTH, n: int = 60, seed: int = 1) -> pa.Table:
    """``n`` synthetic impressions of ``month`` that break no rule, their items the generator's own (not the
    catalog's): what the object-storage tests copy and read back."""
    return synthetic_impressions(n, month, seed=seed, violation_rate=0.0)[0]


def with_row(table: pa.Table, i: int, **values) -> pa.Table:
    """``table`` with row ``i``'s columns replaced by ``values``."""
    for col, v in values.items():
        vals = table.column(col).to_pylist()
        vals[i] = v
        table = table.set_column(table.schema.get_field_index(col), col, pa.array(vals, table.schema.field(col).type))
    return table


DISK_FULL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from abpo.cli import main
sys.exit(main(sys.argv[2:]))
"""
"""``python -c DISK_FULL <bytes> <abpo args...>``: the `abpo` command with no file allowed to grow past ``bytes``
(RLIMIT_FSIZE: a write past it fails as on a full disk)."""
