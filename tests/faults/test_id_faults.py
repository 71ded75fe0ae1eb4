"""Ids that print as something else (issue 48, item 12): NUL, newline and right-to-left-override characters and
megabyte-long ids reached the warehouse and the reports; the ingest quarantines them (malformed_id)."""

from __future__ import annotations

import duckdb
import pytest

from tests.landed_impressions import MONTH, clean_table, land, with_row


@pytest.mark.parametrize(
    "column, value, says",
    [
        ("impression_id", "imp-1\x00hidden", "impression_id holds a control character"),
        ("impression_id", "imp-1\nabpo 2026-01 forged", "impression_id holds a control character"),
        ("request_id", "req-\u202efdp.exe", "request_id holds a control character"),
        ("model_version", "v\u20671", "model_version holds a control character"),
        ("impression_id", "x" * 1_048_576, "impression_id is 1048576 characters"),
        ("request_id", "r" * 257, "request_id is 257 characters"),
    ],
)
def test_a_malformed_id_is_quarantined(abpo, state, column, value, says):
    t = with_row(clean_table(20), 2, **{column: value})
    land(state, t)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 0, err
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT rule, detail FROM quarantine").fetchall()
        n = con.execute("SELECT count(*) FROM impressions").fetchone()[0]
    assert [r[0] for r in rows] == ["malformed_id"] and says in rows[0][1], rows
    assert "rule: an id is at most 256 characters" in rows[0][1] and n == 19


def test_printable_unicode_ids_of_256_characters_stay_clean(abpo, state):
    t = with_row(clean_table(20), 2, impression_id="é" * 256, request_id="请求-1")
    land(state, t)
    assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 0
