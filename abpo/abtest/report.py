"""The report step: counts in (warehouse or CSV) -> statistics -> files -> MLflow.

``report_from_warehouse`` is what the monthly pipeline and ``abpo report --months`` call;
``report_from_csv`` is ``abpo report --csv``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from abpo import registry
from abpo.abtest.analysis import ALL, Report, ReportInputError, analyse
from abpo.abtest.inputs import ASSIGNMENT_SQL, MOMENTS_SQL, counts_from_moments, read_counts_csv
from abpo.abtest.render import ReportFiles, write_report

if TYPE_CHECKING:
    from abpo.config import Config

MONTH_TAG = "abpo.month"


def months_label(months: list[str]) -> str:
    return months[0] if len(months) == 1 else f"{months[0]}..{months[-1]}"


def load_from_warehouse(warehouse_path: str | Path, months: list[str]) -> tuple[pa.Table, pa.Table]:
    """(counts, user moments) of the months, aggregated inside DuckDB from the per-user aggregate
    user_month_stats (one row per month, arm and user, rebuilt with each month's ingest), never from the
    raw impressions: moments = sql/report_user_moments.sql (per arm and month, and per arm over the
    months), and the counts (month, arm, impressions, clicks, users) derived from its monthly rows, which
    equal Warehouse.ctr_by_arm_month over the raw rows. Opening the warehouse first brings the aggregate
    up to date for a warehouse written before it existed (Warehouse.ensure_aggregates)."""
    path = Path(warehouse_path)
    if not path.exists():
        raise ReportInputError(f"{path}: warehouse not found (ingest a month first: abpo ingest --month YYYY-MM)")
    from abpo.warehouse import Warehouse

    with Warehouse(path) as wh:
        moments = wh.run(MOMENTS_SQL, months=months)
    return counts_from_moments(moments), moments


def assignment_rule(cfg: Config) -> tuple[str, dict[str, float]] | str:
    """(salt, shares in assignment order) of the experiment's salted hash under ``cfg`` (sim.salt with the series'
    replicate, report.arm_shares over arms.names in that order: what the router serves with), or the reason the
    assignment cannot be checked (report.assignment = external, shares that assign no one)."""
    from abpo.abtest.assignment import check_shares, series_salt

    if cfg.report.assignment != "salted_hash":
        return (
            f"report.assignment = {cfg.report.assignment}: users were assigned by your own router, whose rule the "
            "report cannot check"
        )
    try:
        return series_salt(cfg.sim.salt, cfg.sim.replicate), check_shares(cfg.report.arm_shares, cfg.arms.names)
    except ValueError as e:
        return f"the experiment's assignment is undefined under this config ({e})"


def load_assignment(path: Path, months: list[str], salt: str, shares: dict[str, float]) -> pa.Table:
    """sql/report_assignment.sql on the warehouse: per period and arm, its users and those whose rows are in an arm
    the salted hash (``salt``, ``shares`` in order) does not give them."""
    from abpo.abtest.assignment import cumulative_bounds
    from abpo.warehouse import Warehouse

    with Warehouse(path, read_only=True) as wh:
        return wh.run(ASSIGNMENT_SQL, months=months, salt=salt, arms=list(shares), bounds=cumulative_bounds(shares))


def build_from_warehouse(cfg: Config, months: list[str], warehouse_path: str | Path | None = None) -> Report:
    path = Path(warehouse_path) if warehouse_path else cfg.paths.resolve("warehouse")
    counts, moments = load_from_warehouse(path, months)
    if counts.num_rows == 0:
        raise ReportInputError(f"{path}: no impressions for {', '.join(months)}")
    rule = assignment_rule(cfg)
    report = analyse(
        counts,
        cfg.report,
        months=months,
        moments=moments,
        source=f"warehouse {path.name}",
        assignment=load_assignment(path, months, *rule) if isinstance(rule, tuple) else None,
        assignment_rule=(
            f"salt {rule[0]!r}, shares {', '.join(f'{a} {v:g}' for a, v in rule[1].items())}"
            if isinstance(rule, tuple)
            else ""
        ),
    )
    if isinstance(rule, str):
        report.notes.append(f"assignment not checked: {rule}")
    return report


def default_out_dir(cfg: Config, label: str) -> Path:
    return cfg.paths.resolve("reports") / label


def report_from_warehouse(
    cfg: Config, months: list[str], out_dir: str | Path | None = None, log_mlflow: bool = True
) -> tuple[Report, ReportFiles]:
    """Aggregate the months in the warehouse, write the report (default under paths.reports/<months>),
    and log it as artifacts of the month's MLflow run (see :func:`log_report`). Months the simulator served add the
    section of its expected CTR, from the figures their serve step stored (abpo.abtest.sim_ctr)."""
    from abpo.abtest.sim_ctr import load_sim_ctr

    report = build_from_warehouse(cfg, months)
    sim = load_sim_ctr(cfg, report.months)
    files = write_report(report, out_dir or default_out_dir(cfg, months_label(report.months)), sim)
    if log_mlflow:
        log_report(cfg, report, files)
    return report, files


def report_from_csv(
    cfg: Config,
    csv_path: str | Path,
    out_dir: str | Path | None = None,
    months: list[str] | None = None,
    log_mlflow: bool = False,
) -> tuple[Report, ReportFiles]:
    """The same report from a CSV of counts (``month,arm,impressions,clicks[,users]``)."""
    csv_path = Path(csv_path)
    counts = read_counts_csv(csv_path)
    report = analyse(counts, cfg.report, months=months, source=f"CSV {csv_path.name}")
    files = write_report(report, out_dir or default_out_dir(cfg, f"csv-{csv_path.stem}"))
    if log_mlflow:
        log_report(cfg, report, files)
    return report, files


def report_metrics(report: Report) -> dict[str, float]:
    """Whole-period figures worth a metric in MLflow (undefined ones are left out)."""
    out: dict[str, float] = {}
    for c in report.totals:
        if not math.isnan(c.ctr):
            out[f"ctr.{c.arm}"] = c.ctr
    for k in report.comparisons:  # a comparison an integrity check withheld has no p to log
        if k.period == ALL and k.test.defined and not k.withheld:
            out[f"diff_pp.{k.other}"] = k.test.diff_pp
            out[f"p.{k.other}"] = k.test.p
            out[f"p_holm.{k.other}"] = k.p_holm
    out["srm_flagged_periods"] = float(len(report.srm_flagged))
    out["integrity_flags"] = float(len(report.flags))
    return out


def log_report(cfg: Config, report: Report, files: ReportFiles) -> str:
    """Log the report files as artifacts (under ``report/<months>``) of the month's run and return its id.

    The month's run is, in this order: the active MLflow run (the pipeline's), else the latest run of
    experiment ``report.mlflow_experiment`` tagged ``abpo.month=<last month>``, else a new run there
    with that tag.
    """
    month = report.months[-1]
    artifact_path = f"report/{months_label(report.months)}"
    active = registry.active_run_id()
    if active is not None:
        _log(files, artifact_path, report)
        return active
    experiment = cfg.report.mlflow_experiment
    existing = registry.latest_tagged_run_id(cfg, experiment, MONTH_TAG, month)
    if existing is not None:
        with registry.resume_run(cfg, existing) as run:
            _log(files, artifact_path, report)
            return run.info.run_id
    with registry.start_run(cfg, experiment, run_name=f"month {month}", tags={MONTH_TAG: month}) as run:
        _log(files, artifact_path, report)
        return run.info.run_id


def _log(files: ReportFiles, artifact_path: str, report: Report) -> None:
    for p in (files.html, files.markdown, files.png, files.json):
        registry.log_artifact(p, artifact_path=artifact_path)
    if files.sim_png is not None:  # the simulator's climb chart and its figures (abpo.abtest.sim_ctr)
        from abpo.abtest.sim_ctr import JSON_NAME

        for p in (files.sim_png, files.out_dir / JSON_NAME):
            registry.log_artifact(p, artifact_path=artifact_path)
    registry.log_metrics({f"report.{k}": v for k, v in report_metrics(report).items()})
    registry.set_tag("abpo.report", artifact_path)
