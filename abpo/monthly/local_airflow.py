"""The demo's own Airflow (``abpo demo``, abpo.commands.demo): SQLite metadata under ``<state>/airflow``, this
repository's DAGs and plugins, the months run with ``airflow dags test abpo_monthly`` in a subprocess.

What it sets: the environment of its processes (:func:`airflow_env`: the demo's config and state for the tasks; the
demo's ``--set`` that travel as a run's ``overrides`` param, :func:`month_run_overrides`), its ``airflow.cfg``
(:func:`init_airflow_db`, :func:`set_airflow_cfg`: the folders, the local-only UI, the tasks' preload) and the one
command that starts its UI later (:func:`standalone_command`). What it runs: a month (:func:`month_through_airflow`:
``airflow dags test``, its output in a log file, the tasks' own lines echoed), then the runs' start dates corrected
(:func:`correct_test_run_starts`). Airflow runs in subprocesses, in the demo's environment: only
:func:`correct_test_run_starts`, run in one of them, imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abpo.config import Config
    from abpo.months import Month

TASK_LINE = "abpo| "  # the prefix of the tasks' log lines on `airflow dags test`'s output ($ABPO_CONSOLE_PREFIX)


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


def run_airflow(
    args: list[str], env: dict[str, str], log_path: Path, echo: Callable[[str], None], *, task_lines: bool = True
) -> int:
    """Run the `airflow` CLI of this environment, the whole output into ``log_path``; the tasks' log lines (marked
    with :data:`TASK_LINE`) are passed to ``echo`` as they come, indented (unless ``task_lines`` is false: they are
    then only in the file), and the last lines on a failure. Returns the exit code."""
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
            if task_lines and line.startswith(
                TASK_LINE
            ):  # a task's own log line (abpo.logs.console on the task's stdout)
                echo("   " + line[len(TASK_LINE) :].rstrip())
    if proc.returncode != 0:
        echo("\n".join(tail))
    return proc.returncode


def init_airflow_db(
    env: dict[str, str], root: Path, echo: Callable[[str], None], *, task_lines: bool = True
) -> dict[str, Any]:
    """`airflow db migrate` (its output in ``<root>/airflow/db-migrate.log``), then the demo's settings in its
    airflow.cfg (:func:`demo_airflow_settings`; Airflow writes the file on its first start, if not before)."""
    rc = run_airflow(["db", "migrate"], env, root / "airflow" / "db-migrate.log", echo, task_lines=task_lines)
    cfg_file = Path(env["AIRFLOW_HOME"]) / "airflow.cfg"  # written by Airflow on its first start, if not before
    set_airflow_cfg(cfg_file, demo_airflow_settings(env))
    return {"rc": rc, "airflow_cfg": cfg_file}


def month_through_airflow(
    env: dict[str, str],
    month: Month,
    overrides: list[str],
    root: Path,
    echo: Callable[[str], None],
    *,
    task_lines: bool = True,
) -> dict[str, Any]:
    """Month ``month`` through `airflow dags test abpo_monthly` with simulate=true and the run's ``overrides`` param,
    its output in ``<root>/airflow/dags-test-<month>.log`` (the tasks' lines also through ``echo`` with
    ``task_lines``: :func:`run_airflow`); then the runs' start dates corrected (see :data:`FIX_RUN_STARTS`).
    RuntimeError naming the log when the run failed."""
    logical = month.next().bounds()[0].isoformat()  # the run of 2026-02-01T00:00:00+00:00 processes 2026-01
    conf = {"month": month, "simulate": True, "overrides": overrides}
    step_log = root / "airflow" / f"dags-test-{month}.log"
    rc = run_airflow(
        ["dags", "test", "abpo_monthly", logical, "-c", json.dumps(conf)], env, step_log, echo, task_lines=task_lines
    )
    fix_run_starts(env, root / "airflow" / "run-starts.log", echo)  # the UI's durations: see FIX_RUN_STARTS
    if rc != 0:
        raise RuntimeError(f"airflow dags test abpo_monthly for {month} failed (exit {rc}); log: {step_log}")
    return {"month": month, "log": step_log}


# `airflow dags test DAG <logical date>` records its run as started at the logical date (Airflow's dag.test() creates
# the run with start_date = logical_date), so a month run today for 2026-02 shows in the UI as lasting from 2026-02-01
# until it ended: the year-long durations. The logical date is right (the run of 2026-02-01 processes 2026-01, as a
# scheduled run would); the start is not. After each month the demo sets its runs' start to when their first task
# started (what the scheduler records for a real run), through Airflow's own ORM in the demo's Airflow environment.
FIX_RUN_STARTS = (
    "from abpo.monthly.local_airflow import correct_test_run_starts as f; print('corrected runs:', f('abpo_monthly'))"
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


def fix_run_starts(env: dict[str, str], log_path: Path, echo: Callable[[str], None]) -> None:
    """:func:`correct_test_run_starts` in the demo's Airflow environment (a subprocess: this process has not set up
    Airflow); its output appended to ``log_path``; a failure is reported there and through ``echo``, not raised (the
    months themselves ran)."""
    import subprocess
    import sys

    with log_path.open("a") as log:
        rc = subprocess.run(
            [sys.executable, "-c", FIX_RUN_STARTS], env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    if rc != 0:
        echo(f"   (could not correct the runs' start dates, exit {rc}: see {log_path})")


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
