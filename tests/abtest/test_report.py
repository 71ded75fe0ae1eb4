"""The A/B report logged into the month's MLflow run (abpo.abtest.report.log_report, through abpo.registry): the
active run when there is one, else the latest run tagged with the report's last month, else a new tagged run."""

from __future__ import annotations

from abpo import registry
from abpo.abtest.analysis import analyse
from abpo.abtest.render import write_report
from abpo.abtest.report import MONTH_TAG, log_report


def _report_and_files(counts_table, make_cfg, tmp_path):
    cfg = make_cfg()
    report = analyse(counts_table, cfg.report)
    return cfg, report, write_report(report, tmp_path / "out")


def _artifacts(run_id: str, folder: str) -> list[str]:
    from mlflow import MlflowClient

    return sorted(a.path.rsplit("/", 1)[-1] for a in MlflowClient().list_artifacts(run_id, folder))


def test_a_report_without_an_active_run_goes_to_a_new_run_then_to_the_same_one(counts_table, make_cfg, tmp_path):
    cfg, report, files = _report_and_files(counts_table, make_cfg, tmp_path)
    first = log_report(cfg, report, files)
    run = registry.get_run(first)
    folder = run.data.tags["abpo.report"]
    assert run.data.tags[MONTH_TAG] == report.months[-1] and folder.startswith("report/")
    assert _artifacts(first, folder) == sorted(p.name for p in (files.html, files.markdown, files.png, files.json))
    assert any(k.startswith("report.") for k in run.data.metrics)
    assert log_report(cfg, report, files) == first  # the month's run is found again by its tag, not made twice
    assert registry.active_run_id() is None


def test_a_report_inside_an_active_run_goes_to_that_run(counts_table, make_cfg, tmp_path):
    cfg, report, files = _report_and_files(counts_table, make_cfg, tmp_path)
    with registry.start_run(cfg, "abpo-monthly", "the pipeline's run") as run:
        assert log_report(cfg, report, files) == run.info.run_id
    assert registry.get_run(run.info.run_id).data.tags["abpo.report"].startswith("report/")
