"""The DAG's operations behaviour end to end, through Airflow's own task path:

- a refusal is not retried (`airflow dags test` with retries left: the task fails on its first try), the
  $ABPO_ON_FAILURE hook is called with the month, the task and the error, and the demo's correction gives the run
  its real start, not its logical date (the UI's durations);
- unpausing the DAG on a real scheduler starts only the current scheduled month, which, with nothing landed, does
  nothing (its tasks are skipped: none fails, none is retried), and that task's log (written by the real task
  supervisor) holds no ERROR line and no line twice."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_services import AirflowServices

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_refusal_fails_once_calls_the_hook_and_the_run_starts_when_it_ran(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nno_such_section:\n  x: 1\n")  # a config the series cannot run on: refused
    hook_log = tmp_path / "failures.jsonl"
    home = tmp_path / "airflow"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "ABPO_CONFIG": str(bad),
        "ABPO_STATE": str(tmp_path / "state"),
        "ABPO_TASK_RETRIES": "2",
        "ABPO_TASK_RETRY_DELAY_S": "1",
        "ABPO_ON_FAILURE": "failure_hook:record",
        "ABPO_TEST_FAILURE_LOG": str(hook_log),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.run(
        [airflow, "dags", "test", "abpo_monthly", "2026-02-01T00:00:00+00:00", "-c", json.dumps({"month": "2026-01"})],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "unknown key(s) ['no_such_section']" in out, out[-3000:]
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        tis = dict(db.execute("SELECT task_id, state || ':' || try_number FROM task_instance").fetchall())
        history = db.execute("SELECT count(*) FROM task_instance_history WHERE task_id = 'bootstrap'").fetchone()[0]
    assert tis["resolve_month"] == "success:1"
    assert tis["bootstrap"] == "failed:1" and history == 0, (tis, history)  # two retries left, none taken
    calls = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert len(calls) == 1, calls
    (call,) = calls
    assert (call["month"], call["task"], call["error_type"], call["cause_type"]) == (
        "2026-01",
        "bootstrap",
        "AirflowFailException",
        "ConfigError",
    )
    assert "no_such_section" in call["error"] and "not retried" in call["error"]

    from abpo.monthly.local_airflow import FIX_RUN_STARTS

    fix = subprocess.run([sys.executable, "-c", FIX_RUN_STARTS], env=env, capture_output=True, text=True, timeout=300)
    assert fix.returncode == 0 and call["run_id"] in fix.stdout, fix.stdout + fix.stderr
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        logical, start, end = db.execute("SELECT logical_date, start_date, end_date FROM dag_run").fetchone()
    from datetime import datetime

    assert logical.startswith("2026-02-01")  # the month's logical date stays
    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    assert 0 < seconds < 600, (logical, start, end)


@pytest.mark.slow
def test_unpausing_starts_no_failing_month_and_its_task_log_is_clean(tmp_path):
    with AirflowServices(tmp_path, {"ABPO_SCHEDULE": "@monthly", "ABPO_TASK_RETRIES": "2"}) as af:
        runs = af.api.wait(
            lambda: af.api.call("GET", "/api/v2/dags/abpo_monthly/dagRuns")["dag_runs"],
            "the scheduled run started on unpause",
            300,
        )
        (run,) = runs
        assert run["run_type"] == "scheduled"
        done = af.api.wait_run(run["dag_run_id"], 600)
        states = {k: t["state"] for k, t in af.api.task_states(run["dag_run_id"]).items()}
        assert done["state"] == "success", (states, af.log("scheduler"))
        assert states.pop("resolve_month") == "success" and set(states.values()) == {"skipped"}, states
        assert len(af.api.call("GET", "/api/v2/dags/abpo_monthly/dagRuns")["dag_runs"]) == 1

    month = done["logical_date"][:7]  # the run of 2026-12-01 is for 2026-11
    (log_file,) = (af.home / "logs").glob("dag_id=abpo_monthly/run_id=*/task_id=resolve_month/attempt=1.log")
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    assert lines and not [e for e in lines if e.get("level") in ("error", "critical")], lines
    ours = [e for e in lines if "nothing to do" in str(e.get("event"))]
    assert len(ours) == 1, lines  # one copy: not also from the task's stdout
    assert ours[0]["level"] == "info" and ours[0].get("logger") == "abpo.dags"
    assert "scheduled run for" in ours[0]["event"] and "no landing partition" in ours[0]["event"], ours
    assert month  # the logical date is a month start
    events = [(e.get("logger"), e.get("event")) for e in lines if not str(e.get("event", "")).startswith("::")]
    assert len(events) == len(set(events)), events


@pytest.mark.slow
def test_the_landing_sensor_starts_the_month_when_its_partition_is_complete(tmp_path):
    """ABPO_WAIT_FOR_LANDING=1 through `airflow dags test` (every task but resolve_month and the sensor marked done):
    a partition with its data and its _SUCCESS marker lets the month start; one without the marker keeps the sensor
    waiting (rescheduled) until its timeout fails it."""
    home, state = tmp_path / "airflow", tmp_path / "state"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "ABPO_CONFIG": "tiny",
        "ABPO_STATE": str(state),
        "ABPO_TASK_RETRIES": "0",
        "ABPO_WAIT_FOR_LANDING": "1",
        "ABPO_LANDING_POKE_S": "1",
        "ABPO_LANDING_TIMEOUT_H": str(8 / 3600),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for month, marker in (("2026-03", True), ("2026-04", False)):
        d = state / "landing" / "impressions" / f"month={month}"
        d.mkdir(parents=True)
        (d / "part-0.parquet").write_bytes(b"not read by the sensor")
        if marker:
            (d / "_SUCCESS").write_text("")
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)

    def month_run(month: str, logical: str) -> tuple[int, dict]:
        proc = subprocess.run(
            [
                airflow,
                "dags",
                "test",
                "abpo_monthly",
                logical,
                "--mark-success-pattern",
                "(?!(resolve_month|landed)$).*",
                "-c",
                json.dumps({"month": month}),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
            tis = dict(
                db.execute(
                    "SELECT ti.task_id, ti.state FROM task_instance ti JOIN dag_run r ON "
                    "r.run_id = ti.run_id WHERE r.logical_date LIKE ?",
                    (logical[:10] + "%",),
                ).fetchall()
            )
        return proc.returncode, tis

    rc, tis = month_run("2026-03", "2026-04-01T00:00:00+00:00")
    assert rc == 0 and tis["landed"] == "success" and tis["bootstrap"] == "success", tis
    rc, tis = month_run("2026-04", "2026-05-01T00:00:00+00:00")
    assert rc != 0 and tis["landed"] == "failed" and tis["bootstrap"] == "upstream_failed", tis
