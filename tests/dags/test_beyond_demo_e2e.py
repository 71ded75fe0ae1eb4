"""The month after a demo, on the demo's own state, with a real scheduler (issue 31, "Done when" 1 and 3).

`abpo demo` runs bootstrap and one simulated month (`airflow dags test`) on the demo preset shrunk to test sizes, with
`data.update_steps=2` so that the series has one window (data.update_steps // sim.window = 1): that month used the
last one. Then the real Airflow services (tests/dags/airflow_services.py) start on the demo's Airflow home
(`<state>/airflow`: its metadata DB with the demo's run, its airflow.cfg), the DAG is unpaused with its default
schedule, and `airflow dags trigger abpo_monthly` (the CLI) asks for the next month, 2026-02, with `simulate` and
nothing else, as docs/operations.md tells a demo's user: its window wraps around (the path that failed with
"simulated month index 1 ... data.update_steps // sim.window"). The month succeeds task by task, each LLM arm gets one
new model version and each ranker one refit, and unpausing started no other month: the only other run is the
scheduled run of the latest tick, whose month has not landed, so it did nothing (docs/operations.md "Scheduling").

The same month's task logs, as Airflow's task supervisor wrote them into its log folder, are then read one by one:
no ERROR (or CRITICAL) line, and no line twice."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from airflow_services import AirflowServices, assert_month_tasks

REPO = Path(__file__).resolve().parents[2]
# the demo preset at the scheduler tests' sizes (tests/sizes.py DAG_MONTH_CLICKS) plus a one-window series; as a
# config file, not run overrides, so that the next month is triggered as a demo's user would trigger it: month and
# simulate only
SMALL_DEMO = {
    "data": {"max_users": 40, "eval_candidates": 20, "update_steps": 2},
    "sft": {"max_steps": 10, "eval_max_users": 15, "pretrain_epochs": 2},
    "policy": {"num_threads": 1},  # the preset's 2 threads are several times slower beside another test process
    "update": {"max_steps": 2, "batch_size": 8, "save_steps": 100},
    "arms": {"min_rows_per_stratum": 1, "gate_ope_bootstrap": 200},
    # clicks likely enough that every LLM arm gets both strata (tests/sizes.py LIKELY_CLICKS says why)
    "sim": {"click_next": 1.0, "base_ctr": 0.2},
}
LLM_ARMS, RANKER_ARMS = ("abpo", "grpo", "wll"), ("ml_retrain", "popularity")  # the demo preset's


def _small_demo_config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    for section, keys in SMALL_DEMO.items():
        cfg.setdefault(section, {}).update(keys)
    cfg["name"] = "demo-small"
    path = tmp_path / "demo-small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _versions(state: Path) -> dict[str, int]:
    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return {
        arm: len(client.search_model_versions(f"name='abpo-arm-{arm}'"))
        for arm in (*LLM_ARMS, *RANKER_ARMS, "holdback")
    }


@pytest.mark.slow
def test_the_month_after_a_demo_runs_on_a_real_scheduler_and_its_task_logs_are_clean(tmp_path):
    config, state = _small_demo_config(tmp_path), tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ABPO_", "MLFLOW_"))} | {
        "ABPO_STATE": str(state)
    }
    demo = subprocess.run(
        [str(Path(sys.executable).with_name("abpo")), "demo", "--config", str(config), "--months", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert demo.returncode == 0, (demo.stdout[-4000:], demo.stderr[-4000:])

    from abpo.config import load_config
    from abpo.sim.simulator import months_available

    assert months_available(load_config(config, [f"paths.root={state}"])) == 1  # the demo used the series' windows
    before = _versions(state)
    home = state / "airflow"
    with contextlib.closing(sqlite3.connect(home / "airflow.db")) as db:
        demo_runs = {r for (r,) in db.execute("SELECT run_id FROM dag_run WHERE dag_id = 'abpo_monthly'")}
    assert len(demo_runs) == 1, demo_runs

    # the DAG's own schedule (@monthly) and one retry, as by default, after 10 s: on a loaded machine the task
    # supervisor's first call to the API server can time out (a transient failure, retried), and a scheduled run
    # waiting 300 s to retry would hold the month back (max_active_runs=1)
    services = {
        "ABPO_SCHEDULE": "@monthly",
        "ABPO_CONFIG": str(config),
        "ABPO_TASK_RETRIES": "1",
        "ABPO_TASK_RETRY_DELAY_S": "10",
    }
    with AirflowServices(tmp_path, services, home=home) as af:  # unpauses the DAG
        rid = "next_month_2026-02"
        trig = subprocess.run(
            [
                af.airflow,
                "dags",
                "trigger",
                "abpo_monthly",
                "--run-id",
                rid,
                "-c",
                json.dumps({"month": "2026-02", "simulate": True}),
            ],
            env=af.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert trig.returncode == 0, trig.stdout + trig.stderr
        done = af.api.wait_run(rid, 1800)
        tis = af.api.task_states(rid)
        states = {k: t["state"] for k, t in tis.items()}
        assert done["state"] == "success", (states, af.log("scheduler"))
        assert_month_tasks(states, config)  # the demo's 6 arms succeed, grpo_cr (not served) skipped
        # the tasks that ran (grpo_cr's, an arm the demo does not serve, are skipped: some never started, no log)
        tries = {k: t["try_number"] for k, t in tis.items() if t["state"] == "success"}

        def all_finished():
            runs = af.api.call("GET", "/api/v2/dags/abpo_monthly/dagRuns?limit=100")["dag_runs"]
            return runs if all(r["state"] in ("success", "failed") for r in runs) else None

        runs = af.api.wait(all_finished, "every run finished", 600, every=5)
        others = [r for r in runs if r["dag_run_id"] not in demo_runs | {rid}]
        for r in others:  # unpausing: at most the latest tick's scheduled run, which did nothing
            other = {k: t["state"] for k, t in af.api.task_states(r["dag_run_id"]).items()}
            assert r["run_type"] == "scheduled" and r["state"] == "success", r
            assert other.pop("resolve_month") == "success" and set(other.values()) == {"skipped"}, (r, other)
        assert len(others) <= 1, others  # catchup off: no run for the months before the latest tick

    after = _versions(state)
    assert {a: after[a] - before[a] for a in after} == {
        "abpo": 1,
        "grpo": 1,
        "wll": 1,
        "ml_retrain": 1,
        "popularity": 1,
        "holdback": 0,
    }
    assert json.loads((state / "cycle" / "2026-02.json").read_text())
    report = json.loads((state / "reports" / "2026-01..2026-02" / "report.json").read_text())
    assert {c["period"] for c in report["cells"]} >= {"2026-01", "2026-02"}
    _the_task_logs_are_clean(home / "logs" / "dag_id=abpo_monthly" / f"run_id={rid}", tries)


def _the_task_logs_are_clean(run_logs: Path, tries: dict[str, int]) -> None:
    """Every task's log of the month (the attempt that succeeded: ``tries``), as JSON lines: none at level error or
    critical
    (Airflow logs a task's stderr at ERROR level: progress bars, MLflow's registration messages), and no (level,
    logger, event) twice in one task's log (each abpo line was written twice, once by logging and once from the
    task's stdout; GX wrote its INFO internals 26 times each)."""
    files = {task_id: run_logs / f"task_id={task_id}" / f"attempt={n}.log" for task_id, n in tries.items()}
    assert all(p.is_file() for p in files.values()), sorted(run_logs.rglob("*.log"))
    problems = {}
    for task_id, path in sorted(files.items()):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert lines, path
        errors = [e for e in lines if str(e.get("level", "")).lower() in ("error", "critical")]
        # one exclusion: Airflow's task runner folds its own lines into two groups in the UI, "::group::Pre Execute"
        # and "::group::Post Execute", each closed by the same marker line "::endgroup::" (two groups, two closings)
        seen = Counter(
            (e.get("level"), e.get("logger"), str(e.get("event")))
            for e in lines
            if not (e.get("logger") == "task" and e.get("event") == "::endgroup::")
        )
        doubled = [(k, n) for k, n in seen.items() if n > 1]
        if errors or doubled:
            problems[task_id] = {"errors": errors[:5], "doubled": doubled[:5]}
    assert not problems, json.dumps(problems, indent=1, default=str)[:8000]
