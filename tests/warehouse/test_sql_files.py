"""The named SQL files as Warehouse.sql_text reads them: a shared part included by several files
(``-- @include <part>``, e.g. sql/_validate_batch.sql in validate_month.sql and validate_staged.sql), and the one
stratum file (sql/stratify.sql) whose two strata are the views impressions_positive / impressions_no_response."""

import pytest

from abpo.data.schemas import write_impressions
from abpo.data.synthetic import synthetic_impressions
from abpo.warehouse import SQLFileError, Warehouse
from abpo.warehouse.db import INCLUDE_RE

MONTH = "2025-02"
ARMS = ["abpo", "grpo", "ml_retrain", "popularity"]


@pytest.fixture
def wh(tmp_path):
    with Warehouse(tmp_path / "wh.duckdb") as w:
        yield w


@pytest.mark.parametrize("name", ["validate_month", "validate_staged"])
def test_the_validate_files_share_their_batch(wh, name):
    text = wh.sql_text(name)
    assert not INCLUDE_RE.search(text)  # expanded
    shared = (wh.sql_dir / "_validate_batch.sql").read_text()
    assert shared in text and text.count("CREATE OR REPLACE TABLE staging.validate_batch") == 1


def test_an_include_is_expanded_in_place_and_a_bad_one_is_named(wh, tmp_path):
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "_part.sql").write_text("SELECT 41 + $x AS v\n-- @include _inner\n")
    (sql / "_inner.sql").write_text("UNION ALL SELECT 2 AS v\n")
    (sql / "whole.sql").write_text("-- a comment\n-- @include _part\nORDER BY v;\n")
    (sql / "missing.sql").write_text("-- @include _nowhere\n")
    (sql / "loop.sql").write_text("-- @include _loop\n")
    (sql / "_loop.sql").write_text("SELECT 1;\n-- @include loop\n")
    wh.sql_dir = sql
    assert wh.sql_text("whole") == "-- a comment\nSELECT 41 + $x AS v\nUNION ALL SELECT 2 AS v\nORDER BY v;\n"
    assert wh.run("whole", x=1).column("v").to_pylist() == [2, 42]
    with pytest.raises(SQLFileError, match=r"_nowhere\.sql: no such SQL file \(included by .*missing\.sql\)"):
        wh.sql_text("missing")
    with pytest.raises(SQLFileError, match=r"loop\.sql: included again through loop -> _loop -> loop"):
        wh.sql_text("loop")
    with pytest.raises(SQLFileError, match=r"no such SQL file .*known: \['loop', 'missing', 'whole'\]"):
        wh.sql_text("other")  # the shared parts (_*.sql) are not listed as runnable files


def test_the_strata_are_the_views_of_the_schema(wh, tmp_path):
    """sql/stratify.sql with $clicked = 1 / 0 gives the rows of impressions_positive / impressions_no_response
    (the views the strata were read from before the two files became one), without the excluded users."""
    landing = tmp_path / "landing"
    table, _ = synthetic_impressions(400, MONTH, seed=4, n_users=30, n_items=100)
    write_impressions(table, landing, MONTH, part="a")
    wh.ingest_month(landing, MONTH, ARMS)
    cols = (
        "month, impression_id, request_id, user_id, arm, model_version, logging_policy, history, candidates, "
        "item_id, propensity, clicked"
    )
    out = [3, 7, 11]
    pos, neg = wh.strata([MONTH], exclude_users=out)
    for got, view in ((pos, "impressions_positive"), (neg, "impressions_no_response")):
        want = wh.con.sql(
            f"SELECT {cols} FROM {view} WHERE month = $m AND user_id NOT IN (3, 7, 11) ORDER BY month, impression_id",
            params={"m": MONTH},
        ).to_arrow_table()
        assert got.num_rows > 0 and got.equals(want)
    assert set(pos.column("clicked").to_pylist()) == {1} and set(neg.column("clicked").to_pylist()) == {0}
    assert pos.num_rows + neg.num_rows < sum(t.num_rows for t in wh.strata([MONTH]))  # users 3, 7, 11 left out
