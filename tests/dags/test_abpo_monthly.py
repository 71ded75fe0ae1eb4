"""The DAG file parses in a real Airflow DagBag with no import errors and wires the arms' cycle in order (the
holdback: one task, hold, that trains nothing); what the Airflow UI shows of it (doc_md, the params' examples) is
true."""

import re
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "abpo_monthly" in dagbag.dag_ids


def test_the_cycle_is_wired_per_arm(dagbag):
    dag = dagbag.dags["abpo_monthly"]
    llm = [f"{a}.{s}" for a in ("abpo", "grpo", "grpo_cr", "wll") for s in ("update", "register", "gate", "promote")]
    rankers = ["ml_retrain.refit", "popularity.refit"]
    assert set(dag.task_ids) == {
        "resolve_month",
        "bootstrap",
        "serve",
        "ingest",
        "report",
        *llm,
        *rankers,
        "holdback.hold",
    }
    edges = [
        ("bootstrap", "serve"),
        ("serve", "ingest"),
        ("ingest", "abpo.update"),
        ("ingest", "grpo.update"),
        ("ingest", "grpo_cr.update"),
        ("ingest", "wll.update"),
        ("ingest", "ml_retrain.refit"),
        ("ingest", "popularity.refit"),
        ("resolve_month", "serve"),
        ("resolve_month", "bootstrap"),
    ]
    for arm in ("abpo", "grpo", "grpo_cr", "wll"):
        edges += [
            (f"{arm}.update", f"{arm}.register"),
            (f"{arm}.register", f"{arm}.gate"),
            (f"{arm}.gate", f"{arm}.promote"),
            (f"{arm}.promote", "report"),
        ]
    edges += [
        ("ml_retrain.refit", "report"),
        ("popularity.refit", "report"),
        ("ingest", "holdback.hold"),
        ("holdback.hold", "report"),
    ]
    for upstream, downstream in edges:
        assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    assert dag.get_task("report").trigger_rule == "none_failed"  # an arm skipped for lack of feedback still reports
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.params["simulate"] is False  # production never fabricates a month
    assert all(t.execution_timeout is not None for t in dag.tasks)
    assert dag.get_task("abpo.update").execution_timeout > dag.get_task("abpo.gate").execution_timeout
    assert [a.name for a in dag.get_task("ingest").outlets] == ["abpo_clean_impressions"]
    for arm, task_id in (
        ("abpo", "abpo.promote"),
        ("grpo", "grpo.promote"),
        ("grpo_cr", "grpo_cr.promote"),
        ("wll", "wll.promote"),
        ("popularity", "popularity.refit"),
    ):
        # an alias: the champion's Asset event is added only when the champion moved (tests/dags/test_champion_events)
        assert [a.name for a in dag.get_task(task_id).outlets] == [f"abpo_champion_{arm}_moves"]
    assert dag.get_task("holdback.hold").outlets == []  # the holdback's champion (pi_init) never moves


def test_dag_file_imports_no_heavy_modules():
    """Airflow parses DAG files often: the file itself must not import torch, transformers, mlflow or numpy, and of
    abpo only the dependency-free leaf modules: the registry of arms (abpo.arms.names) and the path helpers it
    names namespaced models with (abpo.paths), the steps' order (abpo.monthly.steps), the overrides allow-list
    (abpo.monthly.overrides), the settings read from the environment (abpo.monthly.dag_settings, which reads
    arms.approval through the config files' chain of abpo.yamlfile, a leaf as well), what the tasks
    do besides their step (abpo.monthly.airflow_tasks, which imports the rest when a task runs) and the error types
    abpo.arms.names raises (abpo.errors, which imports nothing of abpo)."""
    import subprocess
    import sys

    text = (DAGS / "abpo_monthly.py").read_text()
    top_level = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in top_level if any(m in line for m in ("torch", "transformers", "mlflow"))]
    probe = (
        "import importlib.util, sys; s = importlib.util.spec_from_file_location('d', sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); before = set(sys.modules); s.loader.exec_module(m); "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe, str(DAGS / "abpo_monthly.py")], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert {m for m in loaded if m == "abpo" or m.startswith("abpo.")} == {
        "abpo",
        "abpo.arms",
        "abpo.arms.names",
        "abpo.errors",
        "abpo.monthly",
        "abpo.monthly.airflow_tasks",
        "abpo.monthly.dag_settings",
        "abpo.monthly.overrides",
        "abpo.monthly.steps",
        "abpo.paths",
        "abpo.yamlfile",
    }
    assert not {m.split(".")[0] for m in loaded} & {"torch", "transformers", "mlflow", "numpy", "pandas", "duckdb"}


def test_the_dag_runs_the_steps_of_abpo_monthly_in_their_order(dagbag):
    """The DAG and `abpo arms month` (abpo.monthly.month.run_month, whose order the slow test_cycle checks) follow
    one list, abpo.monthly.steps: every task but resolve_month is a step named like its module in abpo/monthly/ and
    calls it through the step table (abpo.monthly.steps.run_step), the month's steps run in the list's order, each arm runs its kind's chain in order, and report comes
    after every chain."""
    import inspect

    from abpo.arms.names import ARMS
    from abpo.monthly import steps

    dag = dagbag.dags["abpo_monthly"]
    monthly = Path(__file__).resolve().parents[2] / "abpo" / "monthly"
    for task in dag.tasks:
        if task.task_id == "resolve_month":
            continue
        step = task.task_id.split(".")[-1]
        assert step in steps.STEPS and (monthly / f"{step}.py").is_file(), task.task_id
        assert f'run_step("{step}", ' in inspect.getsource(task.python_callable), task.task_id

    def downstream(a: str, b: str) -> bool:
        return b in dag.get_task(a).downstream_task_ids

    once = steps.ONCE
    assert all(downstream(a, b) for a, b in zip(once, once[1:]))
    for arm, e in ARMS.items():
        chain = [f"{arm}.{s}" for s in steps.PER_ARM[e.kind]]
        assert {t for t in dag.task_ids if t.startswith(f"{arm}.")} == set(chain)
        assert downstream(once[-1], chain[0]) and all(downstream(a, b) for a, b in zip(chain, chain[1:]))
        assert all(downstream(chain[-1], last) for last in steps.LAST)


# --- what the Airflow UI shows (doc_md, the params' descriptions) is true ---------------------------------------------


def _without_asides(text: str) -> str:
    """``text`` without its parenthesised and bracketed asides (nested ones too)."""
    while True:
        shorter = re.sub(r"\([^()]*\)|\[[^\[\]]*\]", "", text)
        if shorter == text:
            return shorter
        text = shorter


def test_the_docstring_names_every_arm_and_the_steps_of_the_step_table(dagbag):
    """The DAG's doc_md (the Airflow UI's page of the DAG) names the arms of abpo.arms.names.ARMS and draws the
    cycle of abpo.monthly.steps: the steps once a month, each arm kind's chain of PER_ARM, then the last."""
    from abpo.arms.names import ARMS
    from abpo.monthly.steps import LAST, ONCE, PER_ARM

    doc = dagbag.dags["abpo_monthly"].doc_md
    named = re.search(r"the arms of abpo\.arms\.names\.ARMS \(([^)]*)\)", doc)
    assert named, doc[:300]
    assert [a.strip() for a in named.group(1).split(",")] == list(ARMS)
    drawing = re.search(r"^    resolve_month -> .*?(?=\n\n)", doc, re.M | re.S).group(0)
    steps = [s.strip() for s in _without_asides(" ".join(drawing.split())).split("->")]
    once = steps[: steps.index(next(s for s in steps if s.startswith("per ")))]
    assert once == ["resolve_month", *ONCE]
    chains: dict[str, list[str]] = {}
    for s in steps[len(once) :]:
        m = re.fullmatch(r"per (\w+) arm\s*:\s*(\w+)", s)
        if m:
            kind = m.group(1).lower()
            chains[kind] = [m.group(2)]
        elif s in LAST:
            break
        else:
            chains[kind].append(s)
    assert chains == {kind: list(chain) for kind, chain in PER_ARM.items()}
    assert steps[-len(LAST) :] == list(LAST)
    for arm, e in ARMS.items():  # and the DAG has them: one task group per arm, its kind's chain
        assert [t for t in dagbag.dags["abpo_monthly"].task_ids if t.startswith(f"{arm}.")] == [
            f"{arm}.{step}" for step in PER_ARM[e.kind]
        ]


def test_every_example_in_the_docstring_and_the_params_is_accepted(dagbag):
    """Every trigger example of doc_md (`-c '{...}'`) sets only the DAG's params, each valid against its schema, and
    every example override there or in a param's description passes the check every task repeats
    (abpo.monthly.overrides.check_overrides)."""
    import json

    from abpo.monthly.overrides import check_overrides

    dag = dagbag.dags["abpo_monthly"]
    confs = [json.loads(m) for m in re.findall(r"-c '(\{.*?\})'", dag.doc_md)]
    assert len(confs) >= 3 and any("overrides" in c for c in confs)
    for conf in confs:
        assert set(conf) <= set(dag.params), conf
        for key, value in conf.items():
            dag.params.get_param(key).resolve(value)  # the param's JSON schema, as a trigger is checked
    texts = [dag.doc_md, *(dag.params.get_param(k).description or "" for k in dag.params)]
    lists = [json.loads(m) for t in texts for m in re.findall(r'\["[^"\n]*"(?:, "[^"\n]*")*\]', t)]
    assert len(lists) >= 2
    for overrides in [*lists, *(c["overrides"] for c in confs if "overrides" in c)]:
        assert check_overrides(overrides) == overrides
        dag.params.get_param("overrides").resolve(overrides)
