"""abpo.monthly.isolated, the heavy steps' entry in an environment of their own: what would be a skip or a refusal
in-process comes back as an envelope naming the interpreter; `python -m abpo.monthly.isolated` (the pod's command
of the KubernetesPodOperator variant) exits with a code for each. The operator path: tests/dags/test_isolated_steps.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from abpo.monthly.isolated import EXIT_REFUSED, EXIT_SKIPPED, ISOLATED_STEPS, run_isolated


def test_a_refusal_and_an_unconfigured_arm_come_back_as_an_envelope(tmp_path, monkeypatch, abpo_only_config):
    monkeypatch.setenv("ABPO_STATE", str(tmp_path / "state"))
    out = run_isolated("update", month="2026-01", arm="abpo", upstream={}, config="tiny")
    assert out["status"] == "refused" and "no champion; bootstrap the arms first" in out["message"]
    assert (out["pid"], out["python"], out["prefix"]) == (os.getpid(), sys.executable, sys.prefix)
    out = run_isolated("update", month="2026-01", arm="grpo", config=str(abpo_only_config))
    assert out["status"] == "skipped" and out["message"] == "arm grpo is not in arms.names ['abpo']"
    out = run_isolated("gate", month="2026-01", arm="abpo", overrides=["paths.root=/elsewhere"], config="tiny")
    assert out["status"] == "refused" and "overrides item 'paths.root=/elsewhere'" in out["message"]
    with pytest.raises(ValueError, match=r"isolated step 'register': rule: one of \('bootstrap', 'update', 'gate'\)"):
        run_isolated("register", month="2026-01", arm="abpo")
    assert ISOLATED_STEPS == ("bootstrap", "update", "gate")


def test_the_module_command_prints_the_envelope_and_exits_with_its_code(tmp_path, abpo_only_config):
    env = {**os.environ, "ABPO_STATE": str(tmp_path / "state"), "ABPO_CONFIG": str(abpo_only_config)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "abpo.monthly.isolated",
            "update",
            "--month",
            "2026-01",
            "--arm",
            "grpo",
            "--xcom",
            str(tmp_path / "xcom" / "return.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == EXIT_SKIPPED and out["status"] == "skipped", (run.stdout, run.stderr[-2000:])
    assert out["pid"] != os.getpid() and not (tmp_path / "xcom").exists()  # a skip pushes no result
    run = subprocess.run(
        [sys.executable, "-m", "abpo.monthly.isolated", "update", "--month", "2026-01", "--arm", "abpo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == EXIT_REFUSED, (run.stdout, run.stderr[-2000:])
    assert json.loads(run.stdout.strip().splitlines()[-1])["message"].startswith("LookupError: abpo-arm-abpo")
