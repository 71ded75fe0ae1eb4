"""`abpo report --csv`: the report from a CSV of counts, a malformed CSV, and the warehouse-mode errors."""

from __future__ import annotations

from abpo.cli import main


def _csv(counts_table, path, users=True):
    cols = ["month", "arm", "impressions", "clicks"] + (["users"] if users else [])
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in counts_table.to_pylist()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_report_from_csv(counts_table, tmp_path, capsys):
    csv = _csv(counts_table, tmp_path / "counts.csv")
    out = tmp_path / "out"
    rc = main(["report", "--csv", str(csv), "--out", str(out), "--set", f"paths.root={tmp_path / 'var'}"])
    assert rc == 0
    for name in ("report.html", "report.md", "ctr_by_arm.png", "report.json"):
        assert (out / name).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "abpo vs grpo:" in printed and str(out / "report.html") in printed
    assert not (tmp_path / "var" / "mlflow.db").exists()  # CSV reports are not logged unless asked


def test_report_from_csv_month_filter_and_default_out(counts_table, tmp_path):
    csv = _csv(counts_table, tmp_path / "team.csv", users=False)
    rc = main(["report", "--csv", str(csv), "--months", "2026-03..2026-04", "--set", f"paths.root={tmp_path}"])
    assert rc == 0
    md = (tmp_path / "reports" / "csv-team" / "report.md").read_text()
    assert "# A/B report: 2026-03 to 2026-04" in md and "| 2026-02 |" not in md


def test_malformed_csv_exits_2_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("month,arm,impressions,clicks\n2026-02,abpo,100,5\n2026-02,grpo,100,five\n")
    rc = main(["report", "--csv", str(bad), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{bad} line 3: clicks 'five' is not a non-negative integer" in err
    assert not (tmp_path / "o").exists()


def test_warehouse_mode_needs_months(tmp_path, capsys):
    assert main(["report", "--set", f"paths.root={tmp_path}"]) == 2
    assert "--months" in capsys.readouterr().err


def test_missing_warehouse_is_a_clear_error(tmp_path, capsys):
    assert main(["report", "--months", "2026-02..2026-04", "--set", f"paths.root={tmp_path}"]) == 2
    assert "warehouse not found" in capsys.readouterr().err
