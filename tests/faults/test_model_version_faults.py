"""A row's model_version is its lineage: the registered version that served it. Once an arm abpo serves has
registered versions in the MLflow registry, a row of that arm naming another version is quarantined at ingest
(unknown_model_version, the detail naming the version, the arm's model and the rule), as the other row-level breaks of
the contract are, by `abpo ingest` and by the monthly ingest step alike. An arm without a registered version (before
the bootstrap, or an arm whose model was never registered) is not checked, and the check creates no store. Real DuckDB
and MLflow (SQLite), by the route a user takes."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from tests.faults.registry_versions import registry_with_versions
from tests.landed_impressions import MONTH, clean_table, land

RULE = "rule: a row of an arm abpo serves names the registered version that served it"


def _versions(table: pa.Table, unknown: dict[int, str]) -> tuple[pa.Table, list[str]]:
    """``table`` with arm abpo's rows naming its registered version 2, but its k-th row ``unknown[k]``, and every
    other arm's rows a version of no registered model; and the ids of the rows given an unknown version."""
    arm_of = table.column("arm").to_pylist()
    ids = table.column("impression_id").to_pylist()
    abpo_rows = [i for i, a in enumerate(arm_of) if a == "abpo"]
    mv = ["2" if a == "abpo" else f"{a}-external-7" for a in arm_of]
    for k, v in unknown.items():
        mv[abpo_rows[k]] = v
    table = table.set_column(table.schema.get_field_index("model_version"), "model_version", pa.array(mv))
    return table, sorted(ids[abpo_rows[k]] for k in unknown)


def _quarantine(state) -> list[tuple]:
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        return con.execute("SELECT impression_id, rule, detail FROM quarantine ORDER BY impression_id").fetchall()


def test_a_row_naming_a_version_the_registry_never_had_is_quarantined(abpo, state):
    from abpo.arms.versions import registered_versions
    from abpo.config import load_config

    registry_with_versions(state, n=3)  # abpo-arm-abpo v1..v3; no other arm has a registered model
    assert registered_versions(load_config("tiny")) == {"abpo": ("abpo-arm-abpo", ["3", "2", "1"])}
    table, bad = _versions(clean_table(60), {0: "7", 1: "abpo-v1", 2: " 2"})
    land(state, table)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 0, err
    rows = _quarantine(state)
    assert [(r[0], r[1]) for r in rows] == [(i, "unknown_model_version") for i in bad], rows
    details = {r[2] for r in rows}
    assert (
        "model_version 7 of arm abpo is not a version of abpo-arm-abpo (3 registered, the latest 3); " + RULE
    ) in details, details
    assert any(line.split() == ["unknown_model_version", "3"] for line in out.splitlines()), out
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:  # the others: clean
        assert con.execute("SELECT count(*) FROM impressions").fetchall() == [(60 - len(bad),)]


def test_the_monthly_ingest_step_quarantines_them_too(state):
    from abpo.config import load_config
    from abpo.monthly.ingest import ingest

    registry_with_versions(state, n=2)
    table, bad = _versions(clean_table(40), {0: "5"})
    land(state, table)
    out = ingest(load_config("tiny"), MONTH)  # with the Great Expectations suite, as the DAG's task runs it
    assert out.quarantined["unknown_model_version"] == 1 and out.rows_clean == 39, out
    assert [(r[0], r[1]) for r in _quarantine(state)] == [(bad[0], "unknown_model_version")]


def test_before_the_bootstrap_no_version_is_checked_and_no_store_is_created(abpo, state):
    table, _ = _versions(clean_table(30), {0: "7"})
    land(state, table)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 0, err
    assert _quarantine(state) == []
    assert not (state / "mlflow.db").exists()  # the check opened no store: bring-your-own logs before a registry
