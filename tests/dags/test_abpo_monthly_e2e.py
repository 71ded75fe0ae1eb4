"""`abpo demo` on a shrunken config: bootstrap, then three simulated months through the real abpo_monthly DAG
(`airflow dags test` on a fresh SQLite metadata DB, subprocesses of the demo), and the final A/B report holds five
arms and three months. The Airflow UI command the demo prints, started as printed, shows abpo_monthly (not stale)
with the demo's three runs, loads the abpo plugin and no example DAG (checked through the REST API). A missing month
without simulate=true fails the DAG instead of fabricating data."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from airflow_services import Api, free_port

from tests.sizes import DAG_MONTH  # the other DAG tests' sizes, with the demo's own clicks


def _env(tmp_path):
    env = {**os.environ, "ABPO_STATE": str(tmp_path / "state")}
    for leaked in ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "AIRFLOW_HOME"):
        env.pop(leaked, None)
    return env


@pytest.mark.slow
def test_demo_runs_three_months_through_the_dag(tmp_path):
    sets = [x for s in DAG_MONTH for x in ("--set", s)]
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("abpo")), "demo", "--config", "demo", "--months", "3", *sets],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    assert "3 months through abpo_monthly" in proc.stdout and "wall time" in proc.stdout
    # the console view: one line per stage with the time elapsed and what remains, no library chatter
    for stage in ("prepare the data", "bootstrap: ", *(f"month {i} of 3 (2026-0{i})" for i in (1, 2, 3))):
        assert any(x.startswith(stage) and " elapsed, " in x for x in proc.stdout.splitlines()), stage
    assert "{'loss'" not in proc.stdout + proc.stderr and "abpo| " not in proc.stdout
    state = tmp_path / "state"
    assert "'loss': " in (state / "demo-logs" / "bootstrap.log").read_text()  # pi_init's SFT: the Trainer's steps
    # the month's step log: the tasks' log lines (abpo.logs) marked in Airflow's output, one per step and arm
    months = "".join((state / "airflow" / f"dags-test-2026-0{i}.log").read_text() for i in (1, 2, 3))
    for line in (
        "simulate 2026-02:",
        "update abpo (abpo) from champion",
        "gate grpo: ",
        "promote abpo: ",
        "refit popularity: ",
        "report 2026-01..2026-03: ",
    ):
        assert "abpo| " + line in months, line
    report = json.loads((state / "reports" / "2026-01..2026-03" / "report.json").read_text())
    cells = {(r["period"], r["arm"]) for r in report["cells"]}
    assert {m for m, _ in cells} == {"2026-01", "2026-02", "2026-03"}
    # every arm with traffic has its cells; at 40 users the demo's 4 % arms may get no user at all (the salted hash
    # gave ml_retrain none), and an arm without impressions has no cell
    arms = {a for _, a in cells}
    assert (
        {"abpo", "grpo", "wll", "holdback"} <= arms <= {"abpo", "grpo", "wll", "ml_retrain", "popularity", "holdback"}
    )
    assert {(c["period"], c["candidate"]) for c in report["holdback"]} == {
        (p, a) for p in ("2026-01", "2026-02", "2026-03", "all") for a in ("abpo", "grpo", "wll")
    }  # updating vs holdback

    from mlflow import MlflowClient

    uri = f"sqlite:///{state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for arm in ("abpo", "grpo", "ml_retrain", "popularity"):
        champion = client.get_model_version_by_alias(f"abpo-arm-{arm}", "champion")
        assert int(champion.version) >= 1
    assert len(client.search_model_versions("name='abpo-arm-popularity'")) == 4  # bootstrap + 3 monthly refits
    assert len(client.search_model_versions("name='abpo-arm-holdback'")) == 1  # pi_init, never updated

    # the champion Asset events Airflow recorded: one per move of a champion, none otherwise, the version in the extra
    import sqlite3

    with contextlib.closing(sqlite3.connect(state / "airflow" / "airflow.db")) as db:
        events = db.execute(
            "SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name LIKE 'abpo_champion_%'"
        ).fetchall()
    moved_to: dict[str, list[str]] = {}
    for name, extra in events:
        moved_to.setdefault(name.removeprefix("abpo_champion_"), []).append(json.loads(extra)["version"])
    assert sorted(moved_to["popularity"]) == ["2", "3", "4"]  # each monthly refit moved it (bootstrap is no event)
    for arm in ("abpo", "grpo"):
        promoted = [
            str(mv.version)
            for mv in client.search_model_versions(f"name='abpo-arm-{arm}'")
            if (mv.tags or {}).get("promoted_reason", "").startswith("gate passed")
        ]
        assert sorted(moved_to.get(arm, [])) == sorted(promoted), arm

    _the_printed_ui_command_shows_the_demo(proc.stdout, state, tmp_path)

    # production default: a month nothing landed for fails in `serve`, nothing is simulated
    env = {
        **_env(tmp_path),
        "AIRFLOW_HOME": str(state / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).resolve().parents[2] / "dags"),
        "ABPO_CONFIG": "demo",
        "ABPO_TASK_RETRIES": "0",
    }
    conf = json.dumps({"month": "2026-04", "overrides": DAG_MONTH})
    airflow = Path(sys.executable).with_name("airflow")
    proc = subprocess.run(
        [str(airflow), "dags", "test", "abpo_monthly", "2026-05-01T00:00:00+00:00", "-c", conf],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert "nothing landed for month=2026-04" in out
    assert not (state / "landing" / "impressions" / "month=2026-04").exists()


def _the_printed_ui_command_shows_the_demo(stdout: str, state: Path, tmp_path: Path) -> None:
    """Start the `airflow standalone` line the demo printed, as printed, in a shell whose environment has no Airflow
    or abpo setting of its own; the one thing added is a free port for the API server (the printed command uses
    Airflow's default 8080, which another process on this machine may hold)."""
    (command,) = [line.strip() for line in stdout.splitlines() if line.strip().endswith(" standalone")]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ABPO_", "MLFLOW_"))}
    env.update(
        {
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        }
    )
    started = time.time()
    with open(tmp_path / "standalone.log", "w") as log:
        ui = subprocess.Popen(
            ["bash", "-c", command], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        api = Api(f"http://127.0.0.1:{port}")
        passwords = state / "airflow" / "simple_auth_manager_passwords.json.generated"
        password = api.wait(lambda: json.loads(passwords.read_text())["admin"], "the admin password", 300)
        api.token = api.wait(
            lambda: api.call("POST", "/auth/token", {"username": "admin", "password": password})["access_token"],
            "a token from the API server",
            300,
        )

        def parsed_again():  # the UI's own DAG processor has parsed the file since it started
            d = api.call("GET", "/api/v2/dags/abpo_monthly")
            parsed = d.get("last_parsed_time") or ""
            return d if parsed and _epoch(parsed) > started else None

        dag = api.wait(parsed_again, "abpo_monthly parsed by the standalone's DAG processor", 300, every=5)
        assert dag["is_stale"] is False, dag
        dags = api.call("GET", "/api/v2/dags?limit=100")
        assert [d["dag_id"] for d in dags["dags"]] == ["abpo_monthly"], dags["total_entries"]  # no example DAGs
        runs = api.call("GET", "/api/v2/dags/abpo_monthly/dagRuns")
        assert runs["total_entries"] == 3 and {r["state"] for r in runs["dag_runs"]} == {"success"}, runs
        for r in runs["dag_runs"]:  # logical dates are the months' (+1), durations the runs' own, not since then
            assert r["logical_date"][8:10] == "01" and r["logical_date"][:7] in ("2026-02", "2026-03", "2026-04"), r
            assert 0 < _epoch(r["end_date"]) - _epoch(r["start_date"]) < 3 * 3600, r
        plugins = api.call("GET", "/api/v2/plugins")
        assert "abpo" in {p["name"] for p in plugins["plugins"]}, plugins
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/abpo/reports/", headers={"Authorization": f"Bearer {api.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and "2026-01..2026-03" in r.read().decode()
    except BaseException:
        print((tmp_path / "standalone.log").read_text()[-6000:])
        raise
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        try:
            ui.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(timeout=30)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
