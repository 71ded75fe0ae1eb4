import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from abpo.data.schemas import (
    IMPRESSION_COLUMN_DOCS,
    IMPRESSIONS_SCHEMA,
    SchemaError,
    month_dir,
    schema_problems,
    write_impressions,
)
from abpo.data.synthetic import INJECTED_RULES, synthetic_impressions


def test_contract_columns_and_docs():
    core = [
        "impression_id",
        "event_time",
        "user_id",
        "arm",
        "model_version",
        "history",
        "candidates",
        "item_id",
        "propensity",
        "clicked",
    ]
    assert IMPRESSIONS_SCHEMA.names[: len(core)] == core
    assert {"request_id", "position", "logging_policy", "served_at", "schema_version"} <= set(IMPRESSIONS_SCHEMA.names)
    assert set(IMPRESSION_COLUMN_DOCS) == set(IMPRESSIONS_SCHEMA.names)  # every column has its why
    assert IMPRESSIONS_SCHEMA.field("propensity").type == pa.float64()
    assert IMPRESSIONS_SCHEMA.field("clicked").type == pa.int8()
    assert IMPRESSIONS_SCHEMA.field("event_time").type == pa.timestamp("us", tz="UTC")


def test_write_impressions_lands_in_the_month_partition(tmp_path):
    table, _ = synthetic_impressions(50, "2025-03", seed=1)
    path = write_impressions(table, tmp_path, "2025-03", part="abpo")
    assert path == tmp_path / "impressions" / "month=2025-03" / "part-abpo.parquet"
    back = pq.read_table(path)
    assert back.num_rows == 50 and not schema_problems(back.schema, IMPRESSIONS_SCHEMA)
    # same part again replaces the file (idempotent producer rerun); no temp files are left behind
    write_impressions(table.slice(0, 10), tmp_path, "2025-03", part="abpo")
    assert pq.read_table(path).num_rows == 10
    assert [p.name for p in month_dir(tmp_path, "2025-03").iterdir()] == ["part-abpo.parquet"]
    # without a part name, a fresh file each time
    other = write_impressions(table, tmp_path, "2025-03")
    assert other.name.startswith("part-") and other != path


def test_write_impressions_reorders_columns(tmp_path):
    table, _ = synthetic_impressions(5, "2025-03")
    shuffled = table.select(list(reversed(table.column_names)))
    back = pq.read_table(write_impressions(shuffled, tmp_path, "2025-03", part="x"))
    assert back.column_names == IMPRESSIONS_SCHEMA.names


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.drop_columns(["propensity"]), r"missing column\(s\) \['propensity'\]"),
        (lambda t: t.append_column("extra", pa.array([1] * t.num_rows)), r"unexpected column\(s\) \['extra'\]"),
        (
            lambda t: t.set_column(
                t.schema.get_field_index("clicked"), "clicked", t.column("clicked").cast(pa.string())
            ),
            "column 'clicked' has type string, expected int8",
        ),
    ],
)
def test_write_impressions_rejects_wrong_schema(tmp_path, mutate, message):
    table, _ = synthetic_impressions(5, "2025-03")
    with pytest.raises(SchemaError, match=message):
        write_impressions(mutate(table), tmp_path, "2025-03")


@pytest.mark.parametrize("month", ["2025-3", "2025-13", "202503", "March"])
def test_bad_month_is_rejected(tmp_path, month):
    table, _ = synthetic_impressions(1, "2025-03")
    with pytest.raises(ValueError, match="expected YYYY-MM"):
        write_impressions(table, tmp_path, month)


def test_synthetic_impressions_are_valid_and_seeded():
    a, inj = synthetic_impressions(2000, "2025-02", seed=3)
    b, _ = synthetic_impressions(2000, "2025-02", seed=3)
    assert a.equals(b) and not inj
    rows = a.slice(0, 200).to_pylist()
    assert all(r["item_id"] in r["candidates"] and len(set(r["candidates"])) == 20 for r in rows)
    assert all(0 < r["propensity"] <= 1 and r["clicked"] in (0, 1) for r in rows)
    assert len(set(a.column("impression_id").to_pylist())) == 2000
    _, inj = synthetic_impressions(10_000, "2025-02", violation_rate=0.07)
    assert sum(inj.values()) == 700 and set(inj) == set(INJECTED_RULES)
