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
        "print(json.dumps({'done': p.PRELOADED, 'failed': p.FAILED, 'threads': threading.active_count(), 'mods': sorted(sys.modules)}))"
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
    assert got["failed"] == {}  # no import raised (a real one would be named here and on stderr)


def test_the_demo_and_the_test_services_preload_the_scheduler_tasks():
    from abpo.monthly.local_airflow import TASK_PRELOAD, demo_airflow_settings

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


# A task forked from the forkserver: reports what importing torch gave it (a module of its own: a forkserver child
# finds its target by module and name)
PROBE_TASK = """
def run(q):
    try:
        import torch  # noqa: F401
    except BaseException as e:
        q.put(f"{type(e).__name__}: {e}")
    else:
        q.put("imported")
"""
PROBE = """
import json, multiprocessing as mp, sys
import probe_task
ctx = mp.get_context("forkserver")
ctx.set_forkserver_preload(["abpo.monthly.preload"])
out = []
for _ in range(2):  # the second start finds the same forkserver alive
    q = ctx.SimpleQueue()
    p = ctx.Process(target=probe_task.run, args=(q,))
    p.start()
    p.join(300)
    out.append([p.exitcode, q.get()])
print(json.dumps(out))
"""


@pytest.mark.slow  # a forkserver importing MLflow, GX and abpo: ~15 s
def test_a_preload_import_that_raises_leaves_the_forkserver_up_and_the_task_fails_naming_it(tmp_path):
    """Issue 59 point 5: an import raising something other than ImportError (here torch raising RuntimeError, as a CUDA
    library that cannot load does) killed the forkserver, and every later start failed with EOFError. The forkserver
    must survive, say which import failed, and a task importing it must fail with that message."""
    import os

    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise RuntimeError("libcudart.so.12: cannot open shared object file")\n')
    (tmp_path / "probe_task.py").write_text(PROBE_TASK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert out.returncode == 0 and "EOFError" not in out.stderr, out.stderr[-3000:]
    (first_code, first), (second_code, second) = json.loads(out.stdout.strip().splitlines()[-1])
    assert first_code == 0 and second_code == 0 and first == second  # both children started and ran
    assert first.startswith("ImportError: "), first
    assert "import torch failed" in first and "RuntimeError: libcudart.so.12: cannot open shared object file" in first
    assert "abpo.monthly.preload" in first and len(first.splitlines()) == 1, first
    # the forkserver said it, once, in its own log (the scheduler's)
    said = [line for line in out.stderr.splitlines() if "import torch failed" in line]
    assert len(said) == 1 and "RuntimeError: libcudart.so.12" in said[0], out.stderr[-3000:]
