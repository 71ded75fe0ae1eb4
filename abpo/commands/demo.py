"""`abpo demo`: the main job end to end on the embedded defaults.

    prepare -> bootstrap (pi_init SFT, every arm's first champion; abpo.monthly.bootstrap) -> for each of the months:
    `airflow dags test abpo_monthly` with simulate=true (the monthly steps as tasks: serve -> ingest -> per-arm
    update, register, gate, promote, refit -> report) -> the final report's summary

The console view: the demo's own steps (StepLog) and, from each month's Airflow run, the lines the tasks log through
the ``abpo`` loggers (abpo.logs.console marks them with :data:`TASK_LINE` on the tasks' stdout, the demo shows them
without it); Airflow's own output goes to the month's log file.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abpo.config import Config

TASK_LINE = "abpo| "  # the prefix of the tasks' log lines on `airflow dags test`'s output ($ABPO_CONSOLE_PREFIX)


@dataclass
class StepLog:
    """What the demo did, step by step: printed as it goes and saved as JSON at the end."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, seconds: float, **produced: Any) -> None:
        row = {"step": name, "seconds": round(seconds, 1), **{k: _plain(v) for k, v in produced.items()}}
        self.steps.append(row)
        shown = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("step", "seconds"))
        print(f"[{name}] done in {seconds:.1f}s: {shown}", flush=True)

    def run(self, name: str, fn, *args: Any, describe=None, **kwargs: Any) -> Any:
        """Time ``fn(*args, **kwargs)`` and log what it produced (its dict, or ``describe(result)``)."""
        print(f"[{name}] ...", flush=True)
        t = time.time()
        result = fn(*args, **kwargs)
        self.add(name, time.time() - t, **(describe(result) if describe else result))
        return result


def _plain(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


# ------------------------------------------------------------------------------------------------ the steps


def prepare_data(cfg: Config) -> dict[str, Any]:
    """Load the dataset and split it (docs/ABPO_SPEC.md "Offline construction"); counts for the log."""
    from abpo.data.candidates import assert_target_held_out, build_bandit_requests, build_sup_examples
    from abpo.data.loaders import load_dataset
    from abpo.data.splits import split_users

    ds = load_dataset(cfg.data)
    splits, report = split_users(ds, cfg.data)
    sup = build_sup_examples(splits, ds, cfg.data)
    bandit = build_bandit_requests(splits, ds, cfg.data)
    checked = assert_target_held_out(splits, sup, bandit)
    return {
        "dataset": ds.name,
        "items": ds.catalog.num_rows,
        "interactions": ds.interactions.num_rows,
        "users_kept": report.users_kept,
        "users_skipped": dict(report.skipped),
        "d_sup": len(sup),
        "bandit_requests": len(bandit),
        "held_out_checked_prompts": checked,
    }


# ------------------------------------------------------------------------------------------------ abpo demo


def register(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "demo",
        parents=[common],
        help="Run the production loop end to end on the embedded defaults: four simulated months through Airflow.",
        description="Run the main job end to end on the embedded defaults (bundled MovieLens, DuckDB, SQLite-backed "
        "Airflow and MLflow, the tiny CPU model; use --config demo for the preset sized for 2 cores): prepare the "
        "data, bootstrap pi_init and every arm's first champion, then run MONTHS simulated months (from "
        "sim.start_month) through the abpo_monthly DAG with `airflow dags test` (serve -> ingest + GX -> each LLM "
        "arm updated from its champion on the month's logs (arms.update_logs), gated, promoted -> ranker refits -> "
        "the holdback held at pi_init -> A/B report), and print "
        "the final report's summary, where the HTML report, the Airflow UI and the MLflow UI are, and the wall time.",
    )
    p.add_argument("--months", type=int, default=4, help="Simulated months to run (default: 4).")
    p.set_defaults(handler=run_demo)
    # `abpo loop-experiment`, the demo's loop replicated, registers beside it (it belongs in abpo.cli.COMMAND_MODULES,
    # which another change holds at the time of writing)
    from abpo.commands import loop_experiment

    loop_experiment.register(sub, common)


def airflow_env(cfg: Config, config_ref: str) -> dict[str, str]:
    """The environment of the demo's Airflow: SQLite metadata under <state>/airflow, this repo's DAGs and plugins,
    the demo's config and state for the tasks."""
    import os

    from abpo.config import preset_path
    from abpo.paths import DAGS_DIR, PLUGINS_DIR

    ref = preset_path(config_ref)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(cfg.paths.resolve("root") / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_DIR),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "ABPO_CONFIG": str(ref.resolve()) if ref.exists() else config_ref,
        "ABPO_STATE": str(cfg.paths.resolve("root")),
        "ABPO_TASK_RETRIES": "0",
        "ABPO_CONSOLE_PREFIX": TASK_LINE,
    }
    if cfg.paths.mlflow_tracking_uri:
        env["ABPO_TRACKING_URI"] = cfg.paths.mlflow_tracking_uri
    if cfg.paths.namespace:  # the DAG file and the UI plugin read it from the environment too
        env["ABPO_NAMESPACE"] = cfg.paths.namespace
    return env


# The scheduler's task start-up (docs/operations.md, "Task start-up"): its LocalExecutor workers come from a forkserver
# that imported abpo.monthly.preload, so every task forked from them starts with torch, MLflow, GX ... loaded
TASK_PRELOAD = {
    ("scheduler", "mp_start_method"): "forkserver",
    ("core", "mp_forkserver_preload"): "abpo.monthly.preload",
}


# What the demo writes into its Airflow's airflow.cfg, so that `airflow standalone` started later with only
# AIRFLOW_HOME sees what the demo's runs saw: its DAG and plugin folders, no example DAGs, the UI on this machine only,
# and the scheduler's tasks starting preloaded.
def demo_airflow_settings(env: dict[str, str]) -> dict[tuple[str, str], str]:
    return {
        ("core", "dags_folder"): env["AIRFLOW__CORE__DAGS_FOLDER"],
        ("core", "plugins_folder"): env["AIRFLOW__CORE__PLUGINS_FOLDER"],
        ("core", "load_examples"): "False",
        ("api", "host"): "127.0.0.1",
        **TASK_PRELOAD,
    }


def set_airflow_cfg(path: Path, settings: dict[tuple[str, str], str]) -> None:
    """Set ``settings`` ((section, key) -> value) in the airflow.cfg at ``path`` line by line, keeping the rest of
    the file (Airflow's own comments and generated secrets); a key or section that is missing is added."""
    lines = path.read_text().splitlines() if path.exists() else []
    todo = dict(settings)
    out: list[str] = []
    section = None

    def flush(sec):  # the keys of `sec` not seen in it: appended at its end
        for (s, k), v in list(todo.items()):
            if s == sec:
                out.append(f"{k} = {v}")
                del todo[(s, k)]

    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            flush(section)
            section = stripped[1:-1].strip()
        elif section is not None and "=" in stripped and not stripped.startswith(("#", ";")):
            key = stripped.split("=", 1)[0].strip()
            if (section, key) in todo:
                line = f"{key} = {todo.pop((section, key))}"
        out.append(line)
    flush(section)
    for sec in dict.fromkeys(s for s, _ in todo):
        out += ["", f"[{sec}]"]
        flush(sec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")


def standalone_command(env: dict[str, str]) -> str:
    """The one shell command that starts the demo's Airflow with its UI: Airflow's own executable (its bin folder
    first on PATH, since `airflow standalone` starts `airflow` subprocesses by name), the demo's AIRFLOW_HOME (whose
    airflow.cfg the demo wrote) and the config and state its tasks and the UI plugin read."""
    import shlex
    import sys

    exe = Path(sys.executable).with_name("airflow")
    pairs = [
        ("AIRFLOW_HOME", env["AIRFLOW_HOME"]),
        ("ABPO_CONFIG", env["ABPO_CONFIG"]),
        ("ABPO_STATE", env["ABPO_STATE"]),
    ]
    if env.get("ABPO_TRACKING_URI"):
        pairs.append(("ABPO_TRACKING_URI", env["ABPO_TRACKING_URI"]))
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs)
    return f'PATH={shlex.quote(str(exe.parent))}:"$PATH" {assigns} {shlex.quote(str(exe))} standalone'


def _run_airflow(args: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run the `airflow` CLI of this environment, the whole output into ``log_path``; the tasks' log lines (marked
    with :data:`TASK_LINE`) and the last lines on a failure are echoed."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("airflow")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [str(exe), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith(TASK_LINE):  # a task's own log line (abpo.logs.console on the task's stdout)
                print("   " + line[len(TASK_LINE) :].rstrip(), flush=True)
    if proc.returncode != 0:
        print("\n".join(tail))
    return proc.returncode


# `airflow dags test DAG <logical date>` records its run as started at the logical date (Airflow's dag.test() creates
# the run with start_date = logical_date), so a month run today for 2026-02 shows in the UI as lasting from 2026-02-01
# until it ended: the year-long durations. The logical date is right (the run of 2026-02-01 processes 2026-01, as a
# scheduled run would); the start is not. After each month the demo sets its runs' start to when their first task
# started (what the scheduler records for a real run), through Airflow's own ORM in the demo's Airflow environment.
FIX_RUN_STARTS = (
    "from abpo.commands.demo import correct_test_run_starts as f; print('corrected runs:', f('abpo_monthly'))"
)


def correct_test_run_starts(dag_id: str) -> list[str]:
    """In the Airflow metadata DB of this process's environment: every run of ``dag_id`` made by ``airflow dags
    test`` whose recorded start is its logical date gets, as its start (and queue time, when none was recorded), the
    time `dags test` created it (its run_after; else its first task's start). Returns the run ids changed. Runs in
    the demo's Airflow environment (a subprocess)."""
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType
    from sqlalchemy import func, select

    changed = []
    with create_session() as s:
        runs = s.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.triggered_by == DagRunTriggeredByType.TEST)
        ).all()
        for dr in runs:
            if dr.logical_date is None or dr.start_date != dr.logical_date:
                continue
            started = dr.run_after  # when `dags test` created the run and began its loop
            if started is None or started <= dr.start_date:
                started = s.scalar(
                    select(func.min(TaskInstance.start_date)).where(
                        TaskInstance.dag_id == dag_id, TaskInstance.run_id == dr.run_id
                    )
                )
            if started is None or started <= dr.start_date:
                continue
            dr.start_date = started
            if dr.queued_at is None:
                dr.queued_at = started
            changed.append(dr.run_id)
    return changed


def _fix_run_starts(env: dict[str, str], log_path: Path) -> None:
    """:func:`correct_test_run_starts` in the demo's Airflow environment (a subprocess: this process has not set up
    Airflow); its output appended to ``log_path``; a failure is reported there and on the console, not raised (the
    months themselves ran)."""
    import subprocess
    import sys

    with log_path.open("a") as log:
        rc = subprocess.run(
            [sys.executable, "-c", FIX_RUN_STARTS], env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    if rc != 0:
        print(f"   (could not correct the runs' start dates, exit {rc}: see {log_path})", flush=True)


def carried_by_env() -> dict[str, str]:
    """--set key -> the environment variable that carries it to the demo's Airflow tasks (:func:`airflow_env`)
    instead of a run's overrides: abpo.config.ENV_OVERRIDES, the variables the config already reads."""
    from abpo.config import ENV_OVERRIDES

    return {key: env for env, key in ENV_OVERRIDES.items()}


def month_run_overrides(overrides: list[str]) -> list[str]:
    """The demo's --set overrides that each month's DAG run gets as its `overrides` param: all but those the
    environment carries (:func:`carried_by_env`). ConfigError naming the first one the DAG would refuse
    (abpo.monthly.overrides.check_overrides)."""
    from abpo.config.errors import ConfigError
    from abpo.monthly.overrides import check_overrides

    carried = carried_by_env()
    kept = [o for o in overrides if o.split("=", 1)[0].strip() not in carried]
    try:
        return check_overrides(kept)
    except ValueError as e:
        raise ConfigError(
            f"--set: {e}; the demo passes --set to every month's abpo_monthly run, which takes only "
            f"those keys (and {', '.join(carried)}, which travel as "
            f"{' / '.join(carried.values())}); nothing was run"
        ) from None


def run_demo(args: argparse.Namespace, cfg: Config) -> int:
    import json as _json

    from abpo.logs import quiet
    from abpo.monthly.bootstrap import bootstrap_arms
    from abpo.monthly.report import report
    from abpo.months import month_range

    t0 = time.time()
    log = StepLog()
    dag_overrides = month_run_overrides(args.overrides)  # refused here, before anything runs, not in month 1's run
    months = month_range(cfg.sim.start_month, args.months)
    root = cfg.paths.resolve("root")
    print(f"abpo demo: config {cfg.name}, months {months[0]}..{months[-1]}, state under {root}", flush=True)

    log.run("prepare", prepare_data, cfg)
    arms = log.run("bootstrap", bootstrap_arms, cfg, describe=lambda r: r.arms).arms
    env = airflow_env(cfg, args.config)

    def _airflow_db() -> dict[str, Any]:
        rc = _run_airflow(["db", "migrate"], env, root / "airflow" / "db-migrate.log")
        cfg_file = Path(env["AIRFLOW_HOME"]) / "airflow.cfg"  # written by Airflow on its first start, if not before
        set_airflow_cfg(cfg_file, demo_airflow_settings(env))
        return {"rc": rc, "airflow_cfg": cfg_file}

    log.run("airflow_db", _airflow_db)
    for m in months:
        logical = m.next().bounds()[0].isoformat()  # the run of 2026-02-01T00:00:00+00:00 processes 2026-01
        conf = {"month": m, "simulate": True, "overrides": dag_overrides}
        step_log = root / "airflow" / f"dags-test-{m}.log"

        def _month(m=m, logical=logical, conf=conf, step_log=step_log) -> dict[str, Any]:
            rc = _run_airflow(["dags", "test", "abpo_monthly", logical, "-c", _json.dumps(conf)], env, step_log)
            _fix_run_starts(env, root / "airflow" / "run-starts.log")  # the UI's durations: see FIX_RUN_STARTS
            if rc != 0:
                raise RuntimeError(f"airflow dags test abpo_monthly for {m} failed (exit {rc}); log: {step_log}")
            return {"month": m, "log": step_log}

        log.run(f"month {m}", _month)

    with quiet("abpo.monthly.report"):  # the last month's task already logged this report
        final = report(cfg, months[-1]).to_json()
    md = Path(final["markdown"]).read_text()
    summary = md.split("## Summary", 1)[-1].split("\n## ", 1)[0].strip()
    out = root / "demo_summary.json"
    out.write_text(_json.dumps({"steps": log.steps, "arms": arms, "report": final}, indent=1, default=str))
    wall = time.time() - t0
    print(f"\nabpo demo: {len(months)} months through abpo_monthly in {wall / 60:.1f} min wall time")
    print(f"\nFinal A/B report ({final['months'][0]}..{final['months'][-1]}), summary:\n{summary}\n")
    print(f"  HTML report    {final['html']}")
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    print("  Airflow UI     the runs of abpo_monthly, the A/B reports under /abpo/reports/: start it with")
    print(f"                   {standalone_command(env)}")
    print(
        f"                 then open http://127.0.0.1:8080 as admin (the password: {passwords}, or printed on the "
        "first start)"
    )
    print(
        f"  MLflow UI      .venv/bin/mlflow ui --backend-store-uri {cfg.paths.tracking_uri()}  -> http://localhost:5000 "
        "(models abpo-arm-*: champion / challenger, lineage tags)"
    )
    print(f"  warehouse      {cfg.paths.resolve('warehouse')}")
    print(f"  step log       {out}")
    return 0
