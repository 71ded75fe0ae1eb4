import json

import pytest

from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.validation import validate_month
from abpo.warehouse import Warehouse

ARMS = ["abpo", "grpo", "ml_retrain", "popularity"]
MONTH = "2025-02"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    root = tmp_path_factory.mktemp("gx")
    table, _ = synthetic_impressions(3000, MONTH, seed=5, violation_rate=0.05)
    write_impressions(table, root / "landing", MONTH, part="a")
    wh = Warehouse(root / "wh.duckdb")
    wh.ingest_month(root / "landing", MONTH, ARMS)
    yield root, wh
    wh.close()


def test_clean_partition_passes_and_summary_is_saved(ingested, tmp_path, monkeypatch):
    import tempfile

    root, wh = ingested
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # GX's ephemeral context puts its default site here
    summary = validate_month(wh, MONTH, ARMS, out_dir=root / "validation")
    assert list(tmp_path.iterdir()) == []  # only abpo's Data Docs site is built (GX's default one was left in /tmp)
    assert summary.success and not summary.failed and summary.rows == 2850
    kinds = {(r["expectation"], r["column"]) for r in summary.results}
    assert ("expect_column_values_to_be_unique", "impression_id") in kinds
    assert ("expect_column_values_to_be_between", "propensity") in kinds
    assert ("expect_column_values_to_be_in_set", "item_in_candidates") in kinds
    saved = json.loads((root / "validation" / f"impressions_{MONTH}.json").read_text())
    # the GX way: a Checkpoint whose action built the Data Docs site with this month's validation result page
    docs = root / "validation" / "data_docs"
    assert (docs / "index.html").exists() and f"impressions_{MONTH}" in (docs / "index.html").read_text()
    assert list((docs / "validations").rglob("*.html"))
    assert saved["success"] is True and saved["evaluated"] == summary.evaluated
    assert "PASSED" in str(summary)


def test_suite_catches_rows_that_bypassed_ingest(ingested):
    _, wh = ingested
    # the second line of defence: corrupt the clean table behind the ingest's back
    wh.con.execute("UPDATE impressions SET propensity = 1.5 WHERE source_row IN (0, 1)")
    wh.con.execute("UPDATE impressions SET arm = 'shadow', item_id = -1 WHERE source_row = 2")
    wh.con.execute("INSERT INTO impressions SELECT * FROM impressions WHERE source_row = 3")
    summary = validate_month(wh, MONTH, ARMS)
    failed = {(r["expectation"], r["column"]): r["unexpected_count"] for r in summary.failed}
    assert not summary.success
    assert failed == {
        ("expect_column_values_to_be_between", "propensity"): 2,
        ("expect_column_values_to_be_in_set", "arm"): 1,
        ("expect_column_values_to_be_in_set", "item_in_candidates"): 1,
        ("expect_column_values_to_be_unique", "impression_id"): 2,
    }
    assert "FAILED" in str(summary) and "shadow" in str(summary)


def test_empty_month_fails_the_row_count(ingested):
    _, wh = ingested
    summary = validate_month(wh, "2030-01", ARMS)
    assert not summary.success
    assert [r["expectation"] for r in summary.failed] == ["expect_table_row_count_to_be_between"]


def test_the_suite_runs_as_sql_aggregates_never_through_pandas(ingested, monkeypatch):
    """GX reads the batch through its SQL engine on DuckDB: no query hands Python more than a few rows (the month has
    2,850), neither the warehouse's SQL files nor any query GX runs (the cursor refuses more than the cap)."""
    import abpo.validation as validation

    _, wh = ingested
    monkeypatch.setattr(validation, "MAX_GX_QUERY_ROWS", 100)
    sizes = []
    run = wh.run

    def spy(name, **params):
        out = run(name, **params)
        sizes.append(out.num_rows)
        return out

    monkeypatch.setattr(wh, "run", spy)
    summary = validate_month(wh, MONTH, ARMS)
    assert summary.rows > 2000 and summary.evaluated == 32 and max(sizes) < 100
    assert wh.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'staging'").fetchall() == [(0,)]
    monkeypatch.setattr(validation, "MAX_GX_QUERY_ROWS", 0)  # a query returning more than the cap: said, not cut
    with pytest.raises(Exception, match="more than 0 rows"):
        validate_month(wh, MONTH, ARMS)
    assert wh.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'staging'").fetchall() == [(0,)]


def test_gx_internals_stay_out_of_an_info_root_logger(ingested, caplog):
    """Inside an Airflow task the root logger takes INFO: GX's own INFO chatter (its docs decorator's "Skipping
    registering function ... because it is a closure", repeated for every data source manager it builds) must not
    reach it; its warnings still do. A level set for GX by the deployment is kept."""
    import logging

    root, wh = ingested
    with caplog.at_level(logging.INFO):
        logging.getLogger("great_expectations").setLevel(logging.NOTSET)
        validate_month(wh, MONTH, ARMS, out_dir=root / "validation-log")
    gx_info = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("great_expectations") and r.levelno < logging.WARNING
    ]
    assert not gx_info, gx_info[:5]
    assert logging.getLogger("great_expectations").level == logging.WARNING
    logging.getLogger("great_expectations").setLevel(logging.DEBUG)  # a deployment's own choice
    try:
        validate_month(wh, MONTH, ARMS)
        assert logging.getLogger("great_expectations").level == logging.DEBUG
    finally:
        logging.getLogger("great_expectations").setLevel(logging.NOTSET)
