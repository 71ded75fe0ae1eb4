"""The warehouse by the `abpo` command: config values that tried to reach SQL, bad months, contract rows that were
published as clean, the quarantine ceiling, symlinks in the landing zone, restore-month against id uniqueness,
history on reruns, a corrupt warehouse file and a full disk (issue 18, items 2, 4, 5, 6 and 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.landed_impressions import DISK_FULL, MONTH, clean_table, land, with_row

REPO = Path(__file__).resolve().parents[2]


def tables(state: Path) -> set[str]:
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


@pytest.mark.parametrize("key", ["data.warehouse_memory_limit", "data.warehouse_temp_directory"])
def test_a_config_value_never_reaches_sql(abpo, state, key):
    land(state, clean_table())
    evil = "1GB'; CREATE TABLE pwned AS SELECT 42 AS x; --"
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", f"{key}={evil}")
    assert "pwned" not in tables(state) if (state / "warehouse.duckdb").exists() else True
    if key == "data.warehouse_memory_limit":
        assert (
            rc == 2 and "data.warehouse_memory_limit \"1GB'; CREATE TABLE" in err and "rule: a size such as 2GB" in err
        )
    else:  # a directory name is just a name: DuckDB gets it as a config value and spills there
        assert rc == 0, err
        assert "pwned" not in tables(state)


def test_a_memory_limit_that_is_not_a_size_is_one_line(abpo, state):
    land(state, clean_table())
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", "data.warehouse_memory_limit=lots")
    assert rc == 2 and "data.warehouse_memory_limit 'lots': rule: a size such as 2GB" in err
    assert "Traceback" not in err
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", "data.warehouse_memory_limit=512MB")
    assert rc == 0, err


@pytest.mark.parametrize("month", ["2026-01\n", "٢٠٢٦-٠١", "2026-13", "2026-1"])
def test_a_month_is_strict_everywhere(abpo, state, month):
    for argv in (
        ["data", "synth", "--month", month, "--n", "10"],
        ["ingest", "--month", month],
        ["restore-month", "--month", month],
        ["data", "ctr", "--month", month],
    ):
        rc, out, err = abpo(*argv)
        assert rc == 2 and "expected YYYY-MM" in err and "Traceback" not in err, (argv, err)
    landing = state / "landing" / "impressions"
    assert not landing.exists() or list(landing.iterdir()) == []  # no partition named month=2026-01\n


CONTRACT_FAULTS = [
    ("impression_id", "", "empty_field", "empty: impression_id"),
    ("request_id", "   ", "empty_field", "empty: request_id"),
    ("position", -5, "negative_field", "position -5 < 0"),
    ("user_id", -1, "negative_field", "user_id -1 < 0"),
    ("served_at", datetime(2099, 1, 1, tzinfo=UTC), "served_at_out_of_range", "(data.max_clock_skew_seconds)"),
    ("logging_policy", "softmax(tau=abc)", "unknown_logging_policy", "logging_policy softmax(tau=abc) is not"),
    ("logging_policy", "softmax(tau=0.0)", "unknown_logging_policy", "with X > 0"),
    ("propensity", 5e-324, "propensity_out_of_range", "below data.min_propensity 1e-09"),
]


@pytest.mark.parametrize("column, value, rule, detail", CONTRACT_FAULTS)
def test_contract_rows_that_were_published_as_clean_are_quarantined(abpo, state, column, value, rule, detail):
    land(state, with_row(clean_table(), 7, **{column: value}))
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 0, err
    assert f"{rule}" in out and "49 clean, 1 quarantined" in out, out
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        q = con.execute("SELECT rule, detail, source_row FROM quarantine").fetchall()
    assert len(q) == 1 and q[0][0] == rule and detail in q[0][1] and q[0][2] == 7, q


def test_the_gx_suite_checks_the_new_rules_too(state):
    """The second line of defence: rows that reach the partition another way fail GX on the same rules."""
    from abpo.config import load_config
    from abpo.validation import validate_month
    from abpo.warehouse import open_warehouse

    land(state, clean_table())
    cfg = load_config("tiny")
    with open_warehouse(cfg) as wh:
        wh.ingest_month(state / "landing", MONTH, cfg.data.known_arms)
        wh.con.execute(
            "UPDATE impressions SET propensity = 5e-324, position = -5, user_id = -1, impression_id = '', "
            "logging_policy = 'softmax(tau=abc)', served_at = TIMESTAMPTZ '2099-01-01' WHERE source_row = 3"
        )
        s = validate_month(wh, MONTH, cfg.data.known_arms)
    failed = {(r["expectation"], r["column"]) for r in s.failed}
    assert not s.success
    assert {
        ("expect_column_values_to_be_between", c) for c in ("propensity", "user_id", "position", "serve_skew_seconds")
    } <= failed
    assert {("expect_column_values_to_be_in_set", c) for c in ("ids_nonempty", "logging_policy_ok")} <= failed


def test_a_month_mostly_quarantined_is_refused_naming_the_rules(abpo, state):
    t = clean_table(201)
    t = t.set_column(t.schema.get_field_index("arm"), "arm", pa.array(["shadow"] * 200 + ["abpo"]))
    land(state, t)
    rc, out, err = abpo("ingest", "--month", MONTH)
    assert rc == 1
    assert "200 of 201 landed rows (99.5%) broke the contract (rules fired: unknown_arm 200)" in err
    assert "data.max_quarantine_fraction = 0.2" in err and "nothing was published" in err
    assert "impressions" not in tables(state) or _count(state, "impressions") == 0
    rc, out, err = abpo("ingest", "--month", MONTH, "--force")  # an operator may still publish it, knowingly
    assert rc == 0 and _count(state, "impressions") == 1


def _count(state: Path, table: str) -> int:
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def test_a_symlink_in_the_landing_zone_is_refused(abpo, state, tmp_path):
    outside = tmp_path / "outside"
    real = land(outside, clean_table())
    part = state / "landing" / "impressions" / f"month={MONTH}"
    part.mkdir(parents=True)
    (part / "part-link.parquet").symlink_to(real)
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate")
    assert rc == 1 and "part-link.parquet: a symbolic link (to " in err and "regular Parquet files only" in err


def test_restore_month_keeps_ids_unique(abpo, state):
    a = clean_table(30, prefix="x")
    land(state, a)
    assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    # the month is re-landed without 5 of its rows, which then land in February
    land(state, a.slice(5))
    assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    moved = a.slice(0, 5)
    feb = moved.set_column(
        1, "event_time", pc.add(moved.column("event_time"), pa.scalar(31 * 86400 * 10**6, pa.duration("us")))
    )
    feb = feb.set_column(feb.schema.get_field_index("served_at"), "served_at", feb.column("event_time"))
    land(state, feb, month="2026-02")
    assert abpo("ingest", "--month", "2026-02", "--no-validate")[0] == 0
    rc, out, err = abpo("restore-month", "--month", MONTH)
    assert rc == 1 and "history version 1 holds 5 impression id(s) that are now in another month" in err
    assert "(in 2026-02)" in err and "nothing was restored" in err
    with duckdb.connect(str(state / "warehouse.duckdb"), read_only=True) as con:
        dup = con.execute(
            "SELECT count(*) FROM (SELECT impression_id FROM impressions GROUP BY 1 HAVING count(*) > 1)"
        ).fetchall()[0][0]
    assert dup == 0 and _count(state, "impressions") == 30


def test_a_rerun_with_the_same_rows_adds_no_history(abpo, state):
    land(state, clean_table(40))
    for _ in range(3):
        assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    assert _count(state, "impressions_history") == 0 and _count(state, "impressions") == 40
    land(state, with_row(clean_table(40), 0, clicked=1 - clean_table(40).column("clicked")[0].as_py()))
    assert abpo("ingest", "--month", MONTH, "--no-validate")[0] == 0
    assert _count(state, "impressions_history") == 40  # a real change keeps the replaced version


def test_a_corrupt_warehouse_file_is_one_line(abpo, state):
    state.mkdir(parents=True)
    (state / "warehouse.duckdb").write_bytes(os.urandom(20_000))
    rc, out, err = abpo("data", "ctr")
    assert rc == 2 and "warehouse.duckdb: cannot open the warehouse" in err and "Traceback" not in err, err


def test_a_full_disk_during_ingest_names_the_step(state):
    """The warehouse file may not grow past a few hundred KB (RLIMIT_FSIZE: writes fail like on a full disk). The
    message names the step that failed, not the clean-up after it; nothing is published."""
    land(state, clean_table(20_000))
    env = {**os.environ, "ABPO_STATE": str(state)}
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(600_000), "ingest", "--month", MONTH, "--no-validate"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert (
        f"ingest {MONTH} failed at step" in out.stderr
        and "ingest_drop_stage" not in out.stderr.split("failed at step")[1].splitlines()[0]
    ), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("preset", ["tiny", "demo", "smollm2", "gpu"])
def test_every_preset_caps_duckdb_memory(preset, state):
    """DuckDB's default is 80% of RAM; every preset sets a cap, and the warehouse really runs under it."""
    from abpo.config import load_config
    from abpo.warehouse import check_memory_limit, open_warehouse

    cfg = load_config(preset)
    assert cfg.data.warehouse_memory_limit and check_memory_limit(cfg.data.warehouse_memory_limit)
    with open_warehouse(cfg) as wh:
        got = wh.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    want = (
        duckdb.connect(config={"memory_limit": cfg.data.warehouse_memory_limit})
        .execute("SELECT current_setting('memory_limit')")
        .fetchall()[0][0]
    )
    assert got == want


def test_compose_caps_duckdb_memory_and_the_cap_is_checked(monkeypatch, state):
    from abpo.config import load_config
    from abpo.warehouse import MEMORY_LIMIT_ENV, WarehouseSettingError, open_warehouse

    text = (REPO / "docker-compose.yml").read_text()  # the tasks' environment (x-airflow-env, every Airflow service)
    assert f"  {MEMORY_LIMIT_ENV}: ${{{MEMORY_LIMIT_ENV}:-4GB}}\n" in text
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GiB")
    with open_warehouse(load_config("tiny")) as wh:
        assert wh.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == "1.0 GiB"
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GB'; DROP TABLE x; --")
    with pytest.raises(WarehouseSettingError, match=r"\$ABPO_WAREHOUSE_MEMORY_LIMIT"):
        open_warehouse(load_config("tiny"))


@pytest.mark.parametrize(
    "setting, says",
    [
        ("data.min_propensity=0", "data.min_propensity 0.0: rule: in (0, 1]"),
        ("data.max_quarantine_fraction=1.5", "rule: in [0, 1]"),
    ],
)
def test_contract_settings_out_of_range_are_one_line(abpo, state, setting, says):
    land(state, clean_table())
    rc, out, err = abpo("ingest", "--month", MONTH, "--no-validate", "--set", setting)
    assert rc == 2 and says in err and "Traceback" not in err, err
