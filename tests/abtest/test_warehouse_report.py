"""The report on a real DuckDB warehouse: the per-user moments SQL (read from the per-user aggregate kept
at ingest) against a direct computation from the raw rows, the counts against the warehouse's CTR
aggregate over the raw rows, warehouses written before the aggregate existed, and `abpo report --months`
end to end with the files logged to MLflow."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict

import pytest

from abpo.abtest import stats
from abpo.abtest.analysis import ALL
from abpo.abtest.report import build_from_warehouse, load_from_warehouse
from abpo.cli import main
from abpo.config.report import ReportConfig

from .conftest import ARMS, MONTHS

SHARES = {"abpo": 0.4, "grpo": 0.2, "ml_retrain": 0.2, "popularity": 0.2}


def _raw(root, months, name="warehouse.duckdb"):
    from abpo.warehouse import Warehouse

    with Warehouse(root / name) as wh:
        return wh.con.execute(
            "SELECT month, arm, user_id, clicked FROM impressions WHERE list_contains($m, month)", {"m": months}
        ).fetchall()


def _python_moments(rows):
    per = defaultdict(lambda: [0, 0])  # (period, arm, user) -> [clicks, impressions]
    for month, arm, user, clicked in rows:
        for period in (month, ALL):
            per[(period, arm, user)][0] += clicked
            per[(period, arm, user)][1] += 1
    out = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for (period, arm, _), (x, y) in per.items():
        acc = out[(period, arm)]
        for i, v in enumerate((1, x, y, x * x, y * y, x * y)):
            acc[i] += v
    return {k: tuple(v) for k, v in out.items()}


def test_moments_sql_equals_direct_computation(warehouse_root):
    months = ["2026-03", "2026-04"]
    counts, moments = load_from_warehouse(warehouse_root / "warehouse.duckdb", months)
    got = {
        (r["period"], r["arm"]): (
            r["users"],
            r["clicks"],
            r["impressions"],
            r["clicks_sq"],
            r["impressions_sq"],
            r["clicks_x_impressions"],
        )
        for r in moments.to_pylist()
    }
    assert got == _python_moments(_raw(warehouse_root, months))
    # the counts the report derives from the moments equal the warehouse's CTR aggregate
    from abpo.warehouse import Warehouse

    with Warehouse(warehouse_root / "warehouse.duckdb") as wh:
        ref = wh.ctr_by_arm_month(months).select(["month", "arm", "impressions", "clicks", "users"])
    key = lambda r: (r["month"], r["arm"])  # noqa: E731
    assert sorted(counts.to_pylist(), key=key) == sorted(ref.to_pylist(), key=key)
    assert ref.num_rows == 2 * len(ARMS)


def _moments_dict(moments):
    return {
        (r["period"], r["arm"]): (
            r["users"],
            r["clicks"],
            r["impressions"],
            r["clicks_sq"],
            r["impressions_sq"],
            r["clicks_x_impressions"],
        )
        for r in moments.to_pylist()
    }


def _copy(warehouse_root, tmp_path):
    path = tmp_path / "copy.duckdb"
    shutil.copy(warehouse_root / "warehouse.duckdb", path)
    return path


def test_report_reads_the_aggregate_not_the_raw_rows(warehouse_root, tmp_path):
    from abpo.warehouse import Warehouse

    path = _copy(warehouse_root, tmp_path)
    expected = _moments_dict(load_from_warehouse(path, MONTHS)[1])
    with Warehouse(path) as wh:
        wh.con.execute("DELETE FROM impressions")  # the raw log gone, user_month_stats kept
    assert _moments_dict(load_from_warehouse(path, MONTHS)[1]) == expected


def test_report_from_a_warehouse_written_before_the_aggregate(warehouse_root, tmp_path):
    from abpo.warehouse import Warehouse

    path = _copy(warehouse_root, tmp_path)
    with Warehouse(path) as wh:  # the tables of a warehouse from before user_month_stats
        wh.con.execute("DROP TABLE user_month_stats; DROP TABLE user_month_stats_built")
    _, moments = load_from_warehouse(path, MONTHS)
    assert _moments_dict(moments) == _python_moments(_raw(tmp_path, MONTHS, path.name))


def test_report_after_a_month_ingested_without_the_aggregate(warehouse_root, tmp_path, monkeypatch):
    from abpo.data.schemas import write_impressions
    from abpo.warehouse import Warehouse
    from abpo.warehouse.aggregates import Aggregates

    from .conftest import impressions_log

    path = _copy(warehouse_root, tmp_path)
    landing = tmp_path / "landing"
    # April re-landed (other users, other clicks) and ingested by code that did not maintain the aggregate
    write_impressions(
        impressions_log(7, "2026-04", {"abpo": [1, 2, 3], "grpo": [4, 5]}, {"abpo": 0.3, "grpo": 0.2}),
        landing,
        "2026-04",
        part="0",
    )
    monkeypatch.setattr(Aggregates, "build_user_month_stats", lambda self, month: {"users": 0})
    with Warehouse(path) as wh:
        # far fewer rows than the month held: a deliberate replacement, so forced past the replace guard
        wh.ingest_month(landing, "2026-04", ARMS, force=True)
    monkeypatch.undo()
    counts, moments = load_from_warehouse(path, MONTHS)
    assert _moments_dict(moments) == _python_moments(_raw(tmp_path, MONTHS, path.name))
    april = {r["arm"]: r["users"] for r in counts.to_pylist() if r["month"] == "2026-04"}
    assert april == {"abpo": 3, "grpo": 2}


def test_report_from_warehouse_has_clustered_tests_and_period_srm(warehouse_root):
    from abpo.config import Config

    cfg = Config()
    cfg.paths.root = str(warehouse_root)
    cfg.report.arm_shares = dict(SHARES)
    r = build_from_warehouse(cfg, MONTHS)
    assert r.arms == ARMS
    assert all(c.clustered is not None and c.clustered.defined for c in r.comparisons)
    # the clustered SE is at least as wide as the impression-level one here (users repeat)
    agg = [c for c in r.comparisons if c.period == ALL]
    assert sum(c.clustered.se for c in agg) > sum(c.test.se for c in agg)
    assert set(r.srm) == {*MONTHS, ALL} and not r.srm_flagged
    # distinct users over the period (not the sum of the months'), from the warehouse
    distinct = {u for _, a, u, _ in _raw(warehouse_root, MONTHS) if a == "abpo"}
    assert r.cell(ALL, "abpo").users == len(distinct) < sum(r.cell(m, "abpo").users for m in MONTHS)
    cfg.report.arm_shares = {a: 0.25 for a in ARMS}  # 40% of users in abpo against a configured 25%
    assert build_from_warehouse(cfg, MONTHS).srm_flagged == [*MONTHS, ALL]


def test_cli_report_from_warehouse_logged_to_mlflow(warehouse_root, capsys):
    from mlflow import MlflowClient

    args = [
        "report",
        "--months",
        "2026-02..2026-04",
        "--set",
        f"paths.root={warehouse_root}",
        "--set",
        "report.arm_shares={abpo: 0.4, grpo: 0.2, ml_retrain: 0.2, popularity: 0.2}",
    ]
    assert main(args) == 0
    out_dir = warehouse_root / "reports" / "2026-02..2026-04"
    data = json.loads((out_dir / "report.json").read_text())
    assert data["months"] == MONTHS and data["comparisons"][0]["clustered"]["p"] is not None
    html = (out_dir / "report.html").read_text()
    assert "clustered p (Holm)" in html and "No sample-ratio mismatch" in html
    assert "No sample-ratio mismatch" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=f"sqlite:///{warehouse_root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("abpo-monthly")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["abpo.month"] == "2026-04"
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "report/2026-02..2026-04")}
    assert "report/2026-02..2026-04/report.html" in arts and len(arts) == 4
    cmp = next(c for c in data["comparisons"] if c["period"] == ALL and c["other"] == "grpo")
    assert run.data.metrics["report.diff_pp.grpo"] == pytest.approx(cmp["test"]["diff_pp"])
    # a second report ending in the same month goes into the same run (the month's run)
    assert main(["report", "--months", "2026-04", *args[3:]]) == 0
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id == run.info.run_id
    assert {a.path for a in client.list_artifacts(run.info.run_id, "report")} == {
        "report/2026-02..2026-04",
        "report/2026-04",
    }


def test_month_without_data_in_warehouse(warehouse_root, capsys):
    args = ["report", "--months", "2026-04..2026-05", "--no-mlflow", "--set", f"paths.root={warehouse_root}"]
    assert main(args) == 0
    assert "note: 2026-05: no data for any arm" in capsys.readouterr().out
    assert main(["report", "--months", "2025-01", "--no-mlflow", "--set", f"paths.root={warehouse_root}"]) == 2
    assert "no impressions for 2025-01" in capsys.readouterr().err


def test_clustered_matches_stats_on_moments(warehouse_root):
    counts, moments = load_from_warehouse(warehouse_root / "warehouse.duckdb", MONTHS)
    m = {
        (r["period"], r["arm"]): stats.UserMoments(
            r["users"], r["clicks"], r["impressions"], r["clicks_sq"], r["impressions_sq"], r["clicks_x_impressions"]
        )
        for r in moments.to_pylist()
    }
    from abpo.abtest.analysis import analyse

    r = analyse(counts, ReportConfig(arm_shares=SHARES), months=MONTHS, moments=moments)
    c = next(c for c in r.comparisons if c.period == "2026-03" and c.other == "popularity")
    assert c.clustered == stats.clustered_ztest(m[("2026-03", "abpo")], m[("2026-03", "popularity")])
