import json

from abpo.cli import main


def test_prepare_synth_ingest_ctr(tmp_path, capsys):
    root = ["--set", f"paths.root={tmp_path}"]
    assert main(["data", "prepare", *root, "--set", "data.max_users=40"]) == 0
    out = capsys.readouterr().out
    assert "40 kept" in out and "not_sampled_max_users=570" in out and "held-out target absent" in out
    report = json.loads((tmp_path / "data" / "prepare_report.json").read_text())
    assert report["split"]["users_kept"] == 40 and report["bandit_requests"] == 40 * 4

    assert main(["data", "synth", *root, "--month", "2025-02", "--n", "2000", "--violation-rate", "0.05"]) == 0
    assert main(["ingest", *root, "--month", "2025-02", "--no-validate"]) == 0
    out = capsys.readouterr().out
    assert "2000 rows in, 1900 clean, 100 quarantined" in out and "duplicate_impression_id" in out
    assert main(["data", "ctr", *root]) == 0
    assert "popularity" in capsys.readouterr().out


def test_ingest_of_a_missing_month_fails_with_the_path(tmp_path, capsys):
    assert main(["ingest", "--set", f"paths.root={tmp_path}", "--month", "2024-12", "--no-validate"]) == 1
    assert "month=2024-12: no landing partition" in capsys.readouterr().err


def test_rebuild_aggregates_check_and_rebuild(tmp_path, capsys):
    root = ["--set", f"paths.root={tmp_path}"]
    assert main(["data", "rebuild-aggregates", *root]) == 0
    assert "no impressions ingested yet" in capsys.readouterr().out
    assert main(["data", "synth", *root, "--month", "2025-02", "--n", "500", "--violation-rate", "0"]) == 0
    assert main(["ingest", *root, "--month", "2025-02", "--no-validate"]) == 0
    assert "per-user aggregate:" in capsys.readouterr().out
    assert main(["data", "rebuild-aggregates", *root, "--check"]) == 0
    assert "user_month_stats matches the clean impressions (all months)" in capsys.readouterr().out

    from abpo.warehouse import Warehouse

    with Warehouse(tmp_path / "warehouse.duckdb") as wh:  # a row written around ingest
        wh.con.execute("INSERT INTO impressions SELECT * REPLACE ('x' AS impression_id) FROM impressions LIMIT 1")
    assert main(["data", "rebuild-aggregates", *root, "--check", "--month", "2025-02"]) == 1
    out = capsys.readouterr().out
    assert "user_month_stats differs from the clean impressions (2025-02)" in out and "2025-02 " in out
    assert main(["data", "rebuild-aggregates", *root]) == 0
    assert "2025-02: " in capsys.readouterr().out
    assert main(["data", "rebuild-aggregates", *root, "--check"]) == 0
