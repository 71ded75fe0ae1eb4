"""Write, audit, publish: each fault of the issue, on the real DuckDB warehouse and the real GX suite. A failed
audit publishes nothing and leaves the month as it was; replaced rows can be restored; a corrupt file is named; a
second writer is told the warehouse is busy."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from abpo.data.schemas import IMPRESSIONS_SCHEMA, month_dir, write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.validation import validate_month
from abpo.warehouse import IngestError, IngestRefused, Warehouse, WarehouseBusy

ARMS = ["abpo", "grpo", "ml_retrain", "popularity"]
MONTH = "2025-02"


def clean(n=40, seed=0):
    return synthetic_impressions(n, MONTH, seed=seed, n_users=20, n_items=200)[0]


def gx(arms=ARMS):
    return lambda w, m: validate_month(w, m, arms, staged=True)


def ids(wh):
    return sorted(
        r[0] for r in wh.con.execute("SELECT impression_id FROM impressions WHERE month = ?", [MONTH]).fetchall()
    )


@pytest.fixture
def wh(tmp_path):
    with Warehouse(tmp_path / "wh.duckdb") as w:
        yield w


def test_an_empty_file_over_a_good_month_is_refused_then_forced_then_restored(wh, tmp_path):
    landing = tmp_path / "landing"
    write_impressions(clean(), landing, MONTH, part="a")
    wh.ingest_month(landing, MONTH, ARMS, audit=gx())
    before = ids(wh)
    assert len(before) == 40
    write_impressions(clean().slice(0, 0), landing, MONTH, part="a")  # the producer landed an empty file
    with pytest.raises(IngestRefused, match="0 clean rows .* holds 40.*nothing was published"):
        wh.ingest_month(landing, MONTH, ARMS, audit=gx())
    assert ids(wh) == before
    write_impressions(clean().slice(0, 10), landing, MONTH, part="a")  # a quarter of the month
    with pytest.raises(IngestRefused, match="fewer than 50%"):
        wh.ingest_month(landing, MONTH, ARMS, min_keep_fraction=0.5)
    assert wh.ingest_month(landing, MONTH, ARMS, force=True).rows_clean == 10  # forced: published
    assert len(ids(wh)) == 10 and [v["rows"] for v in wh.month_versions(MONTH)] == [40]
    out = wh.restore_month(MONTH)
    assert out["rows"] == 40 and ids(wh) == before
    assert [v["rows"] for v in wh.month_versions(MONTH)] == [10]  # the restore can itself be undone
    stats = wh.con.execute("SELECT sum(impressions) FROM user_month_stats WHERE month = ?", [MONTH]).fetchall()[0][0]
    assert stats == 40  # the per-user aggregate follows the restore


def test_an_unknown_schema_version_is_quarantined_and_the_suite_passes(wh, tmp_path):
    landing = tmp_path / "landing"
    t = clean()
    sv = pa.array([2] + [1] * (t.num_rows - 1), pa.int16())
    t = t.set_column(t.schema.get_field_index("schema_version"), IMPRESSIONS_SCHEMA.field("schema_version"), sv)
    write_impressions(t, landing, MONTH, part="a")
    rep = wh.ingest_month(landing, MONTH, ARMS, audit=gx())
    assert rep.quarantined_by_rule["unknown_schema_version"] == 1 and rep.rows_clean == 39
    assert rep.audit.success
    (detail,) = wh.con.execute("SELECT detail FROM quarantine WHERE rule = 'unknown_schema_version'").fetchall()[0]
    assert "schema_version 2" in detail


def test_a_failing_suite_publishes_nothing(wh, tmp_path):
    landing = tmp_path / "landing"
    write_impressions(clean(), landing, MONTH, part="a")
    wh.ingest_month(landing, MONTH, ARMS, audit=gx())
    before = ids(wh)
    write_impressions(clean(seed=3), landing, MONTH, part="a")
    # the suite of a stricter deployment (only abpo is a valid arm) fails on the staged rows
    with pytest.raises(IngestRefused, match="failed the Great Expectations suite"):
        wh.ingest_month(landing, MONTH, ARMS, audit=gx(["abpo"]))
    assert ids(wh) == before and wh.month_versions(MONTH) == []


def test_a_corrupt_file_is_named(wh, tmp_path):
    landing = tmp_path / "landing"
    write_impressions(clean(), landing, MONTH, part="a")
    bad = write_impressions(clean(200, seed=1), landing, MONTH, part="b")
    pq.write_table(clean(200, seed=1), bad, compression="none")
    raw = bytearray(bad.read_bytes())
    raw[100:4000] = b"\xff" * 3900  # corrupt data pages, keep the footer (the schema still reads)
    bad.write_bytes(bytes(raw))
    with pytest.raises(IngestError, match=r"part-b\.parquet: corrupt Parquet data"):
        wh.ingest_month(landing, MONTH, ARMS)
    assert ids(wh) == []
    assert (month_dir(landing, MONTH) / "part-a.parquet").exists()


def test_a_second_writer_is_told_the_warehouse_is_busy(tmp_path):
    path = tmp_path / "wh.duckdb"
    Warehouse(path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('locked', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(WarehouseBusy, match="in use by another process"):
            Warehouse(path)
    finally:
        holder.kill()
        holder.wait()
