"""abpo.monthly.preload, the module Airflow's forkserver imports before it forks the LocalExecutor's workers
([core] mp_forkserver_preload): it loads what the steps import, starts no thread, and skips what no task runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # a fresh interpreter importing torch, transformers, MLflow, GX and abpo: ~20 s
def test_the_preload_imports_the_steps_modules_and_starts_no_thread():
    probe = (
        "import json, sys, threading; import abpo.monthly.preload as p; "
        "print(json.dumps({'done': p.PRELOADED, 'threads': threading.active_count(), 'mods': sorted(sys.modules)}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    mods = set(got["mods"])
    from abpo.monthly.preload import HEAVY  # noqa: PLC0415 - the test process imports the list only

    assert set(HEAVY) <= mods  # the third-party packages the steps load inside their functions
    for step in ("serve", "ingest", "update", "register", "gate", "promote", "refit", "hold", "report"):
        assert f"abpo.monthly.{step}" in mods, step
    assert "abpo.policy.model" in mods and "abpo.validation" in mods and "abpo.registry" in mods
    # what no monthly task runs is left out (packages walked are imported, their modules are not)
    assert not any(m.startswith(("abpo.commands.", "abpo.experiment.")) for m in got["done"])
    assert "abpo.cli" not in got["done"] and "abpo.commands.demo" not in mods
    assert "abpo.monthly.celery_preload" not in mods and "airflow.providers.celery" not in mods
    assert got["threads"] == 1  # safe to fork from: no Python thread left running


def test_the_demo_and_the_test_services_preload_the_scheduler_tasks():
    from abpo.commands.demo import TASK_PRELOAD, demo_airflow_settings

    assert TASK_PRELOAD == {
        ("scheduler", "mp_start_method"): "forkserver",
        ("core", "mp_forkserver_preload"): "abpo.monthly.preload",
    }
    env = {"AIRFLOW__CORE__DAGS_FOLDER": "/d", "AIRFLOW__CORE__PLUGINS_FOLDER": "/p"}
    settings = demo_airflow_settings(env)
    assert all(settings[k] == v for k, v in TASK_PRELOAD.items())
    import importlib

    preload = importlib.util.find_spec(TASK_PRELOAD[("core", "mp_forkserver_preload")])
    assert preload is not None  # the name Airflow's forkserver imports resolves (a typo would be silently ignored)


def test_the_celery_workers_config_is_airflows_default_plus_the_preload():
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

    from abpo.monthly.celery_preload import CELERY_CONFIG

    assert {k: v for k, v in CELERY_CONFIG.items() if k != "imports"} == {
        k: v for k, v in DEFAULT_CELERY_CONFIG.items() if k != "imports"
    }
    assert CELERY_CONFIG["imports"][-1] == "abpo.monthly.preload"
