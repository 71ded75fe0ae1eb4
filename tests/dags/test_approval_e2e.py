"""Issue 42 point 1: with ``arms.approval: required`` each LLM arm whose challenger passed the gate waits at an approval
task (``<arm>.approve``, Airflow's human-in-the-loop operator) on the real scheduler and API server
(tests/dags/airflow_services.py). One month, three answers: alice approves abpo, bob rejects grpo, nobody answers
wll (``arms.approval_timeout`` 2m: the scheduler applies the default, Reject). All three through the REST API (the
public API v2's hitlDetails), as two named users of the simple auth manager. Then the month has completed with its
report, only abpo's champion moved, and `abpo arms history` records who approved, who rejected, and the timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from airflow_services import AirflowServices, Api, assert_month_tasks

from tests.sizes import DAG_MONTH_CLICKS, GATE_PASSES

USERS = {"alice": "alice-pw-42", "bob": "bob-pw-42"}
LLM = ("abpo", "grpo", "wll")  # the demo preset's LLM arms
DAG = "/api/v2/dags/abpo_monthly/dagRuns"


class NamedUsers(AirflowServices):
    """The services with the simple auth manager's named users (alice and bob, admins) instead of all-admins, so that
    an answer says who gave it; the services' own client logs in as alice."""

    def __init__(self, tmp_path: Path, extra_env: dict[str, str]):
        passwords = tmp_path / "passwords.json"
        passwords.write_text(json.dumps(USERS))
        super().__init__(
            tmp_path,
            {
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:admin" for u in USERS),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
                **extra_env,
            },
        )

    def client(self, user: str) -> Api:
        api = Api(self.api.base)
        api.token = api.call("POST", "/auth/token", {"username": user, "password": USERS[user]})["access_token"]
        return api

    def login(self) -> str:
        return self.client("alice").token


def _hitl(api: Api, rid: str, arm: str) -> dict | None:
    try:
        return api.call("GET", f"{DAG}/{rid}/taskInstances/{arm}.approve/-1/hitlDetails")
    except Exception:  # noqa: BLE001 - 404 until the task asks
        return None


@pytest.mark.slow
def test_approve_reject_and_timeout_through_the_rest_api(tmp_path):
    config = tmp_path / "approval.yaml"  # the deployment's config file: the DAG processor and every task read it
    from abpo.config import load_config

    cfg = load_config(
        "demo",
        [
            *DAG_MONTH_CLICKS,
            *GATE_PASSES,
            # every challenger passes, below 1: at margin 1 Tango's statistic is NaN, which the gate's XCom refuses
            "arms.gate_margin=0.99",
            "arms.approval=required",
            "arms.approval_timeout=2m",
        ],
    )
    config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    with NamedUsers(tmp_path, {"ABPO_CONFIG": str(config)}) as af:
        rid = af.trigger({"month": "2026-01", "simulate": True})
        alice, bob = af.client("alice"), af.client("bob")
        asked: dict[str, dict] = {}
        waiting: dict[str, float] = {}  # when each approval task was first seen awaiting input
        answers = {"abpo": (alice, "Approve", "better on both halves"), "grpo": (bob, "Reject", "wait a month")}
        end = time.time() + 1500
        while len(asked) < len(LLM) and time.time() < end:
            states = {k: t["state"] for k, t in af.api.task_states(rid).items()}
            for arm in LLM:
                if arm in asked:
                    continue
                assert states.get(f"{arm}.approve") not in ("success", "failed", "skipped", "upstream_failed"), (
                    f"{arm}.approve ended without asking (its gate must pass: GATE_PASSES)",
                    states,
                    af.log("scheduler"),
                )
                if states.get(f"{arm}.approve") != "awaiting_input":
                    continue
                # answered 10 s after the task parked, well within the 2m timeout: an answer within about
                # a second of it (before the scheduler has processed the parked process's exit) fails the task in
                # Airflow 3.3.2 ("finished with state success, but the task instance's state attribute is queued")
                waiting.setdefault(arm, time.time())
                detail = _hitl(af.api, rid, arm)
                if detail is None or time.time() - waiting[arm] < 10:
                    continue
                asked[arm] = detail
                if arm in answers:
                    api, option, comment = answers[arm]
                    got = api.call(
                        "PATCH",
                        f"{DAG}/{rid}/taskInstances/{arm}.approve/-1/hitlDetails",
                        {"chosen_options": [option], "params_input": {"comment": comment}},
                    )
                    assert got["chosen_options"] == [option], got
            time.sleep(2)
        assert set(asked) == set(LLM), (asked.keys(), af.log("scheduler"))
        done = af.api.wait_run(rid, 900)
        states = {k: t["state"] for k, t in af.api.task_states(rid).items()}
        assert done["state"] == "success", (states, af.log("scheduler"))
        assert_month_tasks(states, config, approvals=True)  # grpo_cr (not served): skipped, its approval too
        timed_out = _hitl(af.api, rid, "wll")

    for arm, detail in asked.items():  # what the approver saw: the gate's numbers of both halves
        assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"], detail
        assert detail["subject"].startswith(f"Promote {arm} v"), detail["subject"]
        for shown in ("Offline ΔHR@5", "lower bound", "MDE", "Off-policy ΔCTR", "interval [", "ESS", "Gate's reason"):
            assert shown in detail["body"], (shown, detail["body"])
    assert timed_out["chosen_options"] == ["Reject"] and timed_out["responded_by_user"] is None, timed_out

    from mlflow import MlflowClient

    uri = f"sqlite:///{af.state / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    champion = {a: client.get_model_version_by_alias(f"abpo-arm-{a}", "champion") for a in LLM}
    challenger = {a: max(int(v.version) for v in client.search_model_versions(f"name='abpo-arm-{a}'")) for a in LLM}
    assert int(champion["abpo"].version) == challenger["abpo"] == 2, champion  # approved: promoted
    assert champion["abpo"].tags["approved_by"] == "alice" and champion["abpo"].tags["approved_at"], champion
    for arm in ("grpo", "wll"):  # rejected, timed out: the champion stays v1, the challenger v2 stays aside
        assert (int(champion[arm].version), challenger[arm]) == (1, 2), (arm, champion[arm])

    env = {**af.env, "ABPO_CONFIG": str(config)}
    out = subprocess.run(
        [str(Path(sys.executable).with_name("abpo")), "arms", "history", "--config", str(config), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    last = {}
    for line in out.splitlines():
        e = json.loads(line)
        last[e["arm"]] = e
    a, g, c = last["abpo"], last["grpo"], last["wll"]
    assert (a["action"], a["actor"], a["from"], a["to"], a["month"]) == ("gate", "alice", "1", "2", "2026-01"), a
    assert "approved by alice at 2026-" in a["reason"] and '"better on both halves"' in a["reason"], a
    assert (g["action"], g["actor"], g["from"], g["to"]) == ("not-promoted", "bob", "1", "1"), g
    assert "rejected by bob" in g["reason"] and "wait a month" in g["reason"] and g["verdict"].startswith("pass"), g
    assert (c["action"], c["actor"], c["from"], c["to"]) == ("not-promoted", "abpo", "1", "1"), c
    assert "no answer within arms.approval_timeout 2m" in c["reason"], c
    # the month still completed with its report
    assert (af.state / "cycle" / "2026-01.json").exists()
    assert (af.state / "reports" / "2026-01" / "report.html").exists()
